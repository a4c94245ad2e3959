"""Building the benchmarks' Rust programs with cargo on first use (``bench_merge.py``'s output floor,
``engine_phases.py``'s engine with phase times). No ``cdc_lib`` import here: ``engine_phases.py`` builds before
it imports the package, which loads the installed ``cdc_native``."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def cargo_build(manifest: Path, target: Path, *args: str) -> str | None:
    """``cargo build --release`` of ``manifest`` into ``target`` (its ``CARGO_TARGET_DIR``), with ``args``: None
    when built, else why not (no cargo, or the build's errors)."""
    cargo = shutil.which("cargo")
    if cargo is None:
        return "no cargo"
    env = {**os.environ, "CARGO_TARGET_DIR": str(target)}
    built = subprocess.run([cargo, "build", "--release", "--quiet", *args, "--manifest-path", str(manifest)],
                           env=env, capture_output=True, text=True, check=False)
    return None if built.returncode == 0 else f"cargo build failed\n{built.stderr}"
