"""How the process's mimalloc allocators take memory from the kernel and hand freed memory back: settled when
``cdc_lib`` is imported.

pyarrow's default memory pool and the compiled core (``cdc_native``) both allocate with mimalloc. By default
mimalloc purges memory shortly after it is freed (1 s in mimalloc 3) by decommitting it: the pages go back to the
kernel, and the next batch, which allocates about as much as the one before freed, faults each page in again while
the kernel zeroes it. With ``MIMALLOC_PURGE_DECOMMITS=0`` a purge resets the pages instead (``MADV_FREE`` on Linux):
they stay mapped, the kernel takes them back only when it runs short of memory, and a page written again before that
costs no fault and no zeroing. In ``benchmarks/bench_pipeline.py`` that is about a third fewer page faults and less
system time (docs/benchmarks.md); the process's resident size stays near its peak instead, with pages the kernel may
reclaim at any time.

With ``MIMALLOC_ALLOW_THP=0`` mimalloc (version 3, in both libraries) no longer advises transparent huge pages
(``MADV_HUGEPAGE``) for the memory it maps, and the kernel backs it with 4 KiB pages. A huge page is 2 MiB of
contiguous free memory, which a virtual machine whose host takes back the guest's free memory (virtio-balloon free
page reporting, as on this project's machines: the kernel reports free blocks of 2 MiB and more,
``/sys/module/page_reporting/parameters``) gets back from the host page by page when the kernel zeroes it, while
small pages come first from memory freed a moment ago. On such a machine the first batch of a process spent most of
its time in the kernel zeroing huge pages (``perf`` over four engine calls in one process: a third of all samples in
``clear_page_erms`` under ``do_huge_pmd_anonymous_page``), and a 1,000,000-change batch's engine call took 1.1-1.2 s
instead of 1.6-3.4 s (docs/benchmarks.md). On bare metal, huge pages save page faults and TLB misses:
``MIMALLOC_ALLOW_THP=1`` in the environment restores mimalloc's default.

mimalloc reads its options once, when the library that carries it loads (pyarrow's when ``pyarrow`` is imported, the
compiled core's when it is): the settings reach only what loads after ``cdc_lib`` is imported. A value the
environment already holds is kept, so ``MIMALLOC_PURGE_DECOMMITS=1`` restores mimalloc's own default. Child
processes (a local Spark's JVM and its Python workers) inherit them; a cluster's executors get them from the job's
``spark.executorEnv`` (``spark.session.session_properties``).
"""
from __future__ import annotations

import os
from collections.abc import MutableMapping

SETTINGS = {"MIMALLOC_PURGE_DECOMMITS": "0", "MIMALLOC_ALLOW_THP": "0"}


def configure(environ: MutableMapping[str, str] = os.environ) -> dict:
    """Set each of ``SETTINGS`` that ``environ`` does not hold yet; returns the values ``environ`` now holds."""
    for name, value in SETTINGS.items():
        environ.setdefault(name, value)
    return {name: environ[name] for name in SETTINGS}
