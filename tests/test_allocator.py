"""The allocator settings ``cdc_lib`` applies on import (``cdc_lib.allocator``) reach the allocators that load after
it, pyarrow's memory pool and the compiled core, and leave a value the user set alone.

mimalloc prints its options when it starts if ``MIMALLOC_VERBOSE=1``: the tests read what each allocator
started with, in a fresh interpreter per case (an allocator reads its options once, when it loads).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cdc_lib import allocator

REPO = Path(__file__).resolve().parents[1]


def _option_seen(code: str, option: str = "purge_decommits", **env) -> list[int]:
    """The ``option`` of each mimalloc that started in ``python -c code``, in start order."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
    environ.update(MIMALLOC_VERBOSE="1", PYTHONPATH=str(REPO), **env)
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return [int(v) for v in re.findall(rf"option '{option}': (-?\d+)", done.stderr)]


def test_pyarrow_imported_after_cdc_lib_resets_freed_pages_instead_of_decommitting():
    seen = _option_seen("import cdc_lib, pyarrow as pa; pa.array([1, 2, 3])")
    assert seen == [0]


def test_the_compiled_core_gets_the_same_setting():
    pytest.importorskip("cdc_native")
    seen = _option_seen("import cdc_lib, pyarrow, cdc_native")
    assert seen == [0, 0]


def test_both_allocators_map_small_pages_instead_of_advising_huge_ones():
    pytest.importorskip("cdc_native")
    assert _option_seen("import cdc_lib, pyarrow, cdc_native", "allow_thp") == [0, 0]
    assert _option_seen("import pyarrow, cdc_lib", "allow_thp") == [1]      # mimalloc's default, when it loads first


def test_a_value_the_user_set_is_kept():
    seen = _option_seen("import cdc_lib, pyarrow", MIMALLOC_PURGE_DECOMMITS="1")
    assert seen == [1]
    assert _option_seen("import cdc_lib, pyarrow", "allow_thp", MIMALLOC_ALLOW_THP="1") == [1]


def test_pyarrow_loaded_before_cdc_lib_keeps_mimallocs_default():
    # why the setting lives in cdc_lib's __init__: a pyarrow already loaded has read its options
    seen = _option_seen("import pyarrow, cdc_lib")
    assert seen == [1]


def test_configure_sets_only_what_is_missing():
    env = {"MIMALLOC_PURGE_DECOMMITS": "1"}
    assert allocator.configure(env) == {"MIMALLOC_PURGE_DECOMMITS": "1", "MIMALLOC_ALLOW_THP": "0"} == env
    env = {}
    assert allocator.configure(env) == {"MIMALLOC_PURGE_DECOMMITS": "0", "MIMALLOC_ALLOW_THP": "0"} == env
