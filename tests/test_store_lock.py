"""The Delta writer lock on S3 (``cdc_lib.storage.lock``), against the real S3 server: one holder at a time, a
waiter that gives up names the holder, and the lease of a holder that died is taken over once it expires.

(Why not at once when the dead holder ran on this machine: the Spark job it started may still be finishing a
Delta commit, and on S3 two writers committing together can overwrite each other's log entry. The lease's
expiry is the margin for that.)"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid

import pytest

from cdc_lib.storage.layout import Layout
from cdc_lib.storage.lock import StoreLockBusy, store_lock
from cdc_lib.storage.objects import ObjectStore

TTL_S = 3.0       # the dead holder's lease


@pytest.fixture
def store(s3_server) -> ObjectStore:
    return ObjectStore.from_url(f"s3://{s3_server.bucket}/lock-{uuid.uuid4().hex[:12]}", **s3_server.s3fs_kwargs())


_DIE_HOLDING = """
import json, os, sys
from cdc_lib.storage.lock import store_lock
from cdc_lib.storage.objects import ObjectStore
store = ObjectStore.from_url(sys.argv[1], **json.loads(os.environ["STORE_OPTIONS"]))
with store_lock(store, "w", "a batch that dies", ttl_s=float(sys.argv[2]), wait_s=5):
    print("held", flush=True)
    os._exit(9)          # no release: the lease stays, its holder gone
"""


def _die_holding_the_lock(store: ObjectStore, s3_server) -> dict:
    """Another process takes the lock and dies with it; the lease it left."""
    env = {**os.environ, "STORE_OPTIONS": json.dumps(s3_server.s3fs_kwargs())}     # secrets: not in argv
    done = subprocess.run([sys.executable, "-c", _DIE_HOLDING, store.url, str(TTL_S)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 9 and done.stdout == "held\n", done.stderr[-2000:]
    return json.loads(store.get_bytes(Layout.checkpoint("w")))


def test_a_live_holder_keeps_the_lock_and_the_waiter_names_it(store):
    with store_lock(store, "w", "the running batch", ttl_s=TTL_S, wait_s=5):
        with pytest.raises(StoreLockBusy, match=r"held by the running batch \(pid %d on " % os.getpid()):
            with store_lock(store, "w", "maintenance", ttl_s=TTL_S, wait_s=1.5, poll_s=0.5):
                pass


def test_a_holder_that_died_frees_the_lock_when_its_lease_expires(store, s3_server, caplog):
    lease = _die_holding_the_lock(store, s3_server)
    with pytest.raises(StoreLockBusy, match="a batch that dies"):
        with store_lock(store, "w", "the retry", ttl_s=TTL_S, wait_s=1.0, poll_s=0.5):
            pass
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="cassandra_cdc.storage.lock"):
        with store_lock(store, "w", "the retry", ttl_s=TTL_S, wait_s=30, poll_s=0.5) as me:
            assert json.loads(store.get_bytes(Layout.checkpoint("w")))["token"] == me["token"]
    assert time.time() >= lease["expires"] and time.monotonic() - t0 < 15
    assert any("a batch that dies" in r.getMessage() and "expired without being released" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not store.exists(Layout.checkpoint("w"))           # released at the end of the block
