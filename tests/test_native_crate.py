"""The compiled core's own Rust unit tests (``native/src``: short-key comparison, JSON text, column names), run
with cargo as part of the suite. The comparisons with the Python reference (``test_state_native``,
``test_celllog_paths``, ``test_celllog_fuzz``) reach those pieces only through whole batches; these check each one
at its edges (every length of a short key or name)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[1] / "native"


@pytest.mark.timeout(900)
def test_the_rust_unit_tests_pass():
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("no cargo on this machine (scripts/setup.sh could not have built the compiled core either)")
    done = subprocess.run([cargo, "test", "--release", "--locked"], cwd=NATIVE, capture_output=True, text=True,
                          timeout=840, check=False, env={**os.environ, "CARGO_TARGET_DIR": str(NATIVE / "target")})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    passed = sum(int(n) for n in re.findall(r"test result: ok\. (\d+) passed", done.stdout))
    assert passed > 0, done.stdout[-4000:]
