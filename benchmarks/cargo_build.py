"""Building the benchmarks' Rust programs with cargo on first use (``bench_merge.py``'s output floor,
``engine_phases.py``'s engine with phase times, ``engine_instructions.py``'s builds to compare), and a built engine
as a ``cdc_native`` package to import instead of the installed one. No ``cdc_lib`` import here:
``engine_phases.py`` builds before it imports the package, which loads the installed ``cdc_native``."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def cargo_build(manifest: Path, target: Path, *args: str, env: dict | None = None) -> str | None:
    """``cargo build --release`` of ``manifest`` into ``target`` (its ``CARGO_TARGET_DIR``), with ``args`` and
    the environment variables ``env`` added: None when built, else why not (no cargo, or the build's errors)."""
    cargo = shutil.which("cargo")
    if cargo is None:
        return "no cargo"
    env = {**os.environ, **(env or {}), "CARGO_TARGET_DIR": str(target)}
    built = subprocess.run([cargo, "build", "--release", "--quiet", *args, "--manifest-path", str(manifest)],
                           env=env, capture_output=True, text=True, check=False)
    return None if built.returncode == 0 else f"cargo build failed\n{built.stderr}"


def native_package(target: Path, prefix: str) -> Path:
    """The ``cdc_native`` library a release build of ``native/`` left in ``target`` (its ``CARGO_TARGET_DIR``), as a
    ``cdc_native`` package in a new temporary directory (returned: put it first on ``sys.path`` to import that
    build instead of the installed one; the caller removes it)."""
    lib = target / "release" / ("libcdc_native.dylib" if sys.platform == "darwin" else "libcdc_native.so")
    pkg = Path(tempfile.mkdtemp(prefix=prefix)) / "cdc_native"
    pkg.mkdir()
    shutil.copy(lib, pkg / "cdc_native.abi3.so")
    (pkg / "__init__.py").write_text("from .cdc_native import *  # noqa: F403\n")
    return pkg.parent
