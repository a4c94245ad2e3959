"""``gcpause.gc_paused`` when blocks overlap across threads (a batch published while the next is reconciled)."""
from __future__ import annotations

import gc
import threading

from cdc_lib.gcpause import gc_paused


def test_the_collector_stays_off_until_the_last_overlapping_block_ends_then_is_back_on():
    assert gc.isenabled()
    inside, release = threading.Event(), threading.Event()

    def other_thread():
        with gc_paused():
            inside.set()
            release.wait(10)
    t = threading.Thread(target=other_thread)
    with gc_paused():
        t.start()
        assert inside.wait(10)
    # this thread's block ended first: the other thread's block still runs with the collector off
    assert not gc.isenabled()
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_a_collector_switched_off_by_its_user_stays_off():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
