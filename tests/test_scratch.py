"""Temporary files a killed process leaves (a spark-submit job's secrets, the zip of ``cdc_lib`` shipped to
executors, a downloaded segment) are removed by the next process that makes one of the same kind
(``cdc_lib.spark.scratch``); those of live processes, and names that are not ours, are left alone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from cdc_lib.spark import scratch


@pytest.fixture
def tmpdir_(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_swept", {})
    return tmp_path


def _killed_process_leaving(kind: str, tmp: Path) -> Path:
    """Start a Python process that makes a private directory of ``kind`` with a secret in it, SIGKILL it while the
    directory is open, and return the directory (still there: the process ran no clean-up)."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from cdc_lib.spark import scratch
        with scratch.private_dir({kind!r}) as d:
            open(os.path.join(d, "secret.properties"), "w").write("spark.hadoop.fs.s3a.secret.key=s3cr3t\\n")
            print(d, flush=True)
            time.sleep(60)
    """)
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        left = Path(proc.stdout.readline().strip())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert (left / "secret.properties").exists()
    return left


def test_a_killed_jobs_secrets_are_removed_by_the_next_job(tmpdir_):
    left = _killed_process_leaving("spark-submit", tmpdir_)
    with scratch.private_dir("spark-submit") as mine:
        assert not left.exists()                    # the dead process's directory, secret and all
        assert Path(mine).is_dir() and oct(Path(mine).stat().st_mode & 0o777) == "0o700"
    assert not Path(mine).exists()                  # and this one's own, when its context ends


def test_live_processes_other_kinds_and_foreign_names_are_left(tmpdir_):
    live = tmpdir_ / f"{scratch.prefix('segment')}abc"            # this process: alive
    live.mkdir()
    other_kind = _killed_process_leaving("sstable", tmpdir_)        # dead, but another kind
    other_namespace = tmpdir_ / "cdc-segment-1-999999999-abc"        # a pid of another pid namespace
    other_namespace.mkdir()
    not_ours = tmpdir_ / "cdc-segment-notapid"
    not_ours.mkdir()
    assert scratch.sweep("segment") == []
    assert live.exists() and other_kind.exists() and other_namespace.exists() and not_ours.exists()
    assert scratch.sweep("sstable") == [str(other_kind)]


def test_a_process_file_lives_as_long_as_its_process(tmpdir_):
    code = ("from cdc_lib.spark import scratch; p = scratch.process_file('cdc_lib', '.zip'); "
            "print(p, p.exists(), oct(p.stat().st_mode & 0o777))")
    env = dict(os.environ, TMPDIR=str(tmpdir_), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    path, existed, mode = out.stdout.split()
    assert existed == "True" and mode == "0o600"
    assert not Path(path).exists()                  # removed when the process exited


def test_sweeps_of_kinds_made_many_times_are_spaced_out(tmpdir_, monkeypatch):
    calls = []
    monkeypatch.setattr(scratch, "sweep", lambda kind, directory=None: calls.append(kind) or [])
    for _ in range(3):
        with scratch.private_dir("segment", many=True):
            pass
    assert calls == ["segment"]                     # a task downloads many segments: one look at the directory
    for _ in range(2):
        with scratch.private_dir("spark-submit"):   # one per job: every job looks
            pass
    assert calls == ["segment", "spark-submit", "spark-submit"]
