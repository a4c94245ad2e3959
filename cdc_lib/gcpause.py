"""Pausing Python's cyclic garbage collector around bulk work.

Decoding, reconciling and building Arrow batches allocate millions of small acyclic tuples, dicts and bytes
while holding them all. Reference counting frees them; the cyclic collector finds nothing to free but walks the
whole growing heap at every full collection (measured: a third of the reconcile time, and 2.5x slower cell-log
batches). The bulk loops run inside ``gc_paused()``.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_pauses = 0                 # blocks inside gc_paused now, in any thread
_restore = False            # whether the collector was on when the first of them began


@contextmanager
def gc_paused():
    """Run the block with the cyclic garbage collector off (restored after).

    A batch allocates millions of small acyclic dicts and tuples (records, states, images, events) while
    holding them all; every full collection walks that whole heap, which made the collector a third of the
    reconcile time. Reference counting still frees everything here: these structures have no cycles.

    The collector's switch is one per process, and blocks overlap across threads (a batch published while the
    next is reconciled): it goes off when the first block begins and back on when the last one ends, not when
    the first one ends under another thread's block.

    On the way out the objects the blocks left behind are moved straight to the oldest generation (a
    ``freeze``/``unfreeze`` pair, which relinks lists without scanning them): otherwise the first young
    collections after re-enabling would scan the millions of survivors one generation at a time, moving the
    cost to whatever runs next. Skipped when someone else keeps objects frozen, not to unfreeze theirs.
    """
    global _pauses, _restore
    with _lock:
        if _pauses == 0:
            _restore = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _restore:
                if gc.get_freeze_count() == 0:
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()
