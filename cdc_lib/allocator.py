"""How the process's mimalloc allocators hand freed memory back: settled when ``cdc_lib`` is imported.

pyarrow's default memory pool and the compiled core (``cdc_native``) both allocate with mimalloc. By default
mimalloc purges memory 10 ms after it is freed by decommitting it: the pages go back to the kernel, and the next
batch, which allocates about as much as the one before freed, faults each page in again while the kernel zeroes
it. With ``MIMALLOC_PURGE_DECOMMITS=0`` a purge resets the pages instead (``MADV_FREE`` on Linux): they stay
mapped, the kernel takes them back only when it runs short of memory, and a page written again before that costs
no fault and no zeroing. In ``benchmarks/bench_pipeline.py`` that is about a third fewer page faults and less
system time (README, Benchmarks); the process's resident size stays near its peak instead, with pages the
kernel may reclaim at any time.

mimalloc reads its options once, when the library that carries it loads (pyarrow's when ``pyarrow`` is imported,
the compiled core's when it is): the setting reaches only what loads after ``cdc_lib`` is imported. A value the
environment already holds is kept, so ``MIMALLOC_PURGE_DECOMMITS=1`` restores mimalloc's own default. Child
processes (a local Spark's JVM and its Python workers) inherit it; a cluster's executors get it from the job's
``spark.executorEnv`` (``spark.session.session_properties``).
"""
from __future__ import annotations

import os
from collections.abc import MutableMapping

SETTINGS = {"MIMALLOC_PURGE_DECOMMITS": "0"}


def configure(environ: MutableMapping[str, str] = os.environ) -> dict:
    """Set each of ``SETTINGS`` that ``environ`` does not hold yet; returns the values ``environ`` now holds."""
    for name, value in SETTINGS.items():
        environ.setdefault(name, value)
    return {name: environ[name] for name in SETTINGS}
