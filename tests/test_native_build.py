"""The profile-guided build of the compiled core (``native/build.py``): its training workload keeps running on
the package as it changes (a broken one would leave setup building plain, slower), and it merges counts only with
an ``llvm-profdata`` that reads them."""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
from celllog_diff import require

NATIVE = Path(__file__).resolve().parents[1] / "native"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"native_{name}", NATIVE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_training_workload_runs_through_the_compiled_decoder_and_state_engine(tmp_path, monkeypatch):
    require("native")
    monkeypatch.setenv("CASSANDRA_CDC_NATIVE", "1")
    train = _load("pgo_train")
    # the demo schema's tables, decoded from 3 replicas' segments, in two batches (the second over the first's
    # state, after its 60 s TTLs): some writes change nothing visible, but most make an event
    assert train.demo_batches(tmp_path / "demo", mutations=300) > 150
    # every key-value row inserted, then updated: one create and one update event each
    assert train.kv_batches(tmp_path / "kv", rows=400) == 800


def _fake_run(answers: dict):
    def run(cmd, **kwargs):
        words = [str(c) for c in cmd]
        for prefix, out in answers.items():
            if words[:len(prefix)] == list(prefix):
                return subprocess.CompletedProcess(words, 0 if out is not None else 1, out or "", "")
        raise AssertionError(f"unexpected command {words}")
    return run


def test_an_llvm_profdata_of_another_llvm_than_rustcs_is_not_used(tmp_path, monkeypatch):
    build = _load("build")
    other = tmp_path / "llvm-profdata-14"
    monkeypatch.setattr(build, "_run", _fake_run({
        ("rustc", "-vV"): "rustc 1.95.0\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.2\n",
        ("rustc", "--print", "sysroot"): str(tmp_path / "sysroot"),      # no llvm-tools component there
        ("rustup", "component", "add"): None,                            # and rustup cannot fetch it
        (str(other), "--version"): "Debian LLVM version 14.0.6\n",
    }))
    monkeypatch.setattr(build.shutil, "which", lambda name: str(other) if name.startswith("llvm-profdata") else
                        ("/usr/bin/rustup" if name == "rustup" else None))
    with pytest.raises(build.CannotProfile, match="no llvm-profdata of LLVM 22"):
        build.find_llvm_profdata()
    # the same major version is taken
    monkeypatch.setattr(build, "_llvm_major", lambda tool: 22)
    assert build.find_llvm_profdata() == str(other)
