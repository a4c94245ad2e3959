"""Temporary files that must not outlive the process that made them: the properties files holding a job's or a
session's secrets (``submit``, ``session``), the zip of ``cdc_lib`` a session ships to its executors
(``session.ship_cdc_lib``), and the private copies of the segments and SSTables a task reads (``merge_job``).

A process removes its own when it is done with them, but a process that is killed (Airflow stopping a task with
SIGKILL, the OOM killer) runs no clean-up: its files would stay in the temporary directory for good, secrets
included. So each is named after its process (``cdc-<kind>-<pid namespace>-<pid>-<random>``), and the next process
that makes one of the same kind first removes those whose process is gone. Only names made in this process's pid
namespace are looked at: a pid read in another namespace (a container sharing the directory) says nothing here.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil

# Kinds a process makes many of (a task's segment copies: one per segment) are swept at most this often by it
SWEEP_INTERVAL_S = 60.0
_swept: dict = {}           # kind -> time.monotonic() of its last sweep in this process


def _namespace() -> int:
    """The inode of this process's pid namespace (0 where there is no /proc)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def prefix(kind: str, pid: int | None = None) -> str:
    """The name prefix of the temporary files of ``kind`` of process ``pid`` (this one's by default), for
    ``tempfile``'s ``prefix``."""
    return f"cdc-{kind}-{_namespace()}-{os.getpid() if pid is None else pid}-"


def sweep(kind: str, directory: str | None = None) -> list:
    """Remove the temporary files and directories of ``kind`` left by processes of this pid namespace that have
    died; returns their paths. Those of live processes, and any this user may not remove, are left."""
    head = f"cdc-{kind}-{_namespace()}-"
    removed = []
    for path in Path(directory or tempfile.gettempdir()).glob(f"{head}*"):
        pid = path.name[len(head):].split("-", 1)[0]
        if not pid.isdigit() or psutil.pid_exists(int(pid)):     # another user's process counts as alive
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(str(path))
    return removed


def _sweep_now_and_then(kind: str, interval_s: float) -> None:
    last = _swept.get(kind)
    if last is None or time.monotonic() - last >= interval_s:
        _swept[kind] = time.monotonic()
        sweep(kind)


def private_dir(kind: str, *, many: bool = False) -> tempfile.TemporaryDirectory:
    """A new directory only this user can enter (mode 0700), removed when its context ends; the leftovers of dead
    processes of the same kind are removed first (``many``: at most every ``SWEEP_INTERVAL_S``)."""
    _sweep_now_and_then(kind, SWEEP_INTERVAL_S if many else 0.0)
    return tempfile.TemporaryDirectory(prefix=prefix(kind), ignore_cleanup_errors=True)


def process_file(kind: str, suffix: str = "") -> Path:
    """A new empty file (mode 0600) kept while this process runs and removed when it exits; the leftovers of dead
    processes of the same kind are removed first."""
    _sweep_now_and_then(kind, 0.0)
    fd, name = tempfile.mkstemp(prefix=prefix(kind), suffix=suffix)
    os.close(fd)
    atexit.register(_remove, name)
    return Path(name)


def _remove(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass
