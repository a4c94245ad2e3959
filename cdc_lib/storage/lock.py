"""A lock in the store: at most one holder at a time across processes and machines (``store_lock``).

The pipeline holds ``DELTA_WRITER_LOCK`` while it writes the Delta tables of a batch, and the maintenance DAG while
it compacts and vacuums them, so that the two never commit at the same time. delta-rs would survive that (its
commits are conditional PUTs), but Spark's S3 log store allows one writing driver at a time, and a compaction
racing a MERGE makes one of them fail; a second pipeline pointed at the same store by mistake is held off too.

* **S3** (and S3-compatible stores: conditional PUTs, ``If-None-Match`` and ``If-Match``): a lease object
  ``checkpoints/<name>.json`` holding its owner and an expiry. Taking the lock creates the object only if it does
  not exist; the holder renews the expiry every ``ttl_s / 3`` seconds with a PUT that succeeds only if the object
  is still the one it wrote; a lease that expired (its holder died without releasing it) is taken over the same way,
  by exactly one waiter. Expiries are compared with this machine's clock: keep the clocks in sync (NTP), far
  better than ``ttl_s``.
* **A local directory**: ``flock`` on ``checkpoints/<name>.lock``, which the kernel releases when its holder dies.
* **memory://** (tests): a lock of this process (the memory filesystem is this process's).

``StoreLockBusy`` names the holder when the lock stays taken longer than the caller waits; ``StoreLockLost`` says
a holder's lease was taken over while it worked (it stopped renewing for longer than ``ttl_s``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Iterator

from cdc_lib.errors import ConfigError, StorageError

from .layout import Layout

DELTA_WRITER_LOCK = "delta-writer"

log = logging.getLogger("cassandra_cdc.storage.lock")
_memory_locks: dict = {}
_memory_guard = threading.Lock()


class StoreLockBusy(StorageError):
    """Another holder kept the lock for longer than the caller waits."""


class StoreLockLost(StorageError):
    """The lease was taken over while its holder still worked (it did not renew it for ``ttl_s``)."""


def _owner(purpose: str) -> dict:
    return {"owner": purpose, "host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex,
            "since": time.time()}


def _describe(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(holder.get("since", 0)))
    return (f"{holder.get('owner', '?')} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
            f"since {since} UTC)")


@contextlib.contextmanager
def store_lock(store, name: str, purpose: str, *, ttl_s: float = 60.0, wait_s: float = 900.0,
               poll_s: float = 1.0) -> Iterator[dict]:
    """Hold lock ``name`` of ``store`` (a ``storage.ObjectStore``) for the block; wait up to ``wait_s`` for it.

    ``purpose`` says who holds it (shown to waiters). Yields the holder record written to the store.
    """
    me = _owner(purpose)
    if store.local:
        lock = _local_lock
    elif "memory" in (store.fs.protocol if isinstance(store.fs.protocol, (tuple, list)) else (store.fs.protocol,)):
        lock = _memory_lock
    elif hasattr(store.fs, "call_s3"):
        lock = _s3_lease
    else:
        raise ConfigError(f"store {store.url}: no lock for this kind of store (S3 or a local directory)")
    with lock(store, name, me, ttl_s=ttl_s, wait_s=wait_s, poll_s=poll_s):
        yield me


def _waited_too_long(name: str, holder: dict, wait_s: float) -> StoreLockBusy:
    return StoreLockBusy(f"lock {name} is held by {_describe(holder)}; waited {wait_s:.0f} s for it")


@contextlib.contextmanager
def _local_lock(store, name, me, *, ttl_s, wait_s, poll_s):
    import fcntl
    path = os.path.join(store.root, *Layout.checkpoint(name).split("/"))[:-len(".json")] + ".lock"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    try:
                        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
                    except ValueError:
                        holder = {}
                    raise _waited_too_long(name, holder, wait_s) from None
                time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        yield
    finally:
        os.close(fd)          # releases the flock


@contextlib.contextmanager
def _memory_lock(store, name, me, *, ttl_s, wait_s, poll_s):
    with _memory_guard:
        lock = _memory_locks.setdefault((store.url, name), threading.Lock())
    if not lock.acquire(timeout=wait_s):
        raise _waited_too_long(name, {"owner": "another thread of this process"}, wait_s)
    try:
        yield
    finally:
        lock.release()


class _S3Lease:
    """The lease object of one lock on S3 (see the module docstring)."""

    def __init__(self, store, name: str, timeout_s: float):
        self.fs = store.fs
        self.path = store._path(Layout.checkpoint(name))
        self.bucket, self.key = self.path.split("/", 1)
        # Every call gives up after timeout_s (fsspec's own deadline, TimeoutError): a PUT to a server that stopped
        # answering waited for ever in a test (SIGSTOP), its read timeout notwithstanding, and the holder must be
        # able to give the lock up, and a waiter to fail, while the store is unwell.
        self.timeout_s = timeout_s

    def create(self, body: dict) -> str | None:
        """Write the lease if there is none: its ETag, or None when one exists."""
        try:
            out = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=json.dumps(body).encode(),
                                  IfNoneMatch="*", timeout=self.timeout_s)
        except (FileExistsError, OSError) as e:
            if _precondition_failed(e):
                return None
            raise
        return out["ETag"]

    def replace(self, body: dict, etag: str) -> str | None:
        """Overwrite the lease if it is still the version ``etag``: the new ETag, or None when it changed."""
        try:
            out = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=json.dumps(body).encode(),
                                  IfMatch=etag, timeout=self.timeout_s)
        except (FileNotFoundError, FileExistsError, OSError) as e:
            if isinstance(e, FileNotFoundError) or _precondition_failed(e):
                return None
            raise
        return out["ETag"]

    def read(self) -> tuple[dict, str] | None:
        """(lease, ETag) as one consistent read, or None when there is no lease."""
        from fsspec.asyn import sync

        async def get():
            resp = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.key)
            try:
                return await resp["Body"].read(), resp["ETag"]
            finally:
                resp["Body"].close()
        try:
            body, etag = sync(self.fs.loop, get, timeout=self.timeout_s)
        except FileNotFoundError:
            return None
        try:
            return json.loads(body), etag
        except ValueError:
            return {"expires": 0}, etag        # unreadable: treat as expired, to be taken over

    def delete(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, timeout=self.timeout_s)


def _precondition_failed(e: Exception) -> bool:
    import errno
    return isinstance(e, FileExistsError) or getattr(e, "errno", None) == errno.EINVAL or "412" in str(e) \
        or "PreconditionFailed" in str(e)


@contextlib.contextmanager
def _s3_lease(store, name, me, *, ttl_s, wait_s, poll_s):
    lease = _S3Lease(store, name, timeout_s=ttl_s / 3)     # a renewal slower than that would be too late anyway
    deadline = time.monotonic() + wait_s
    while True:
        etag = lease.create({**me, "expires": time.time() + ttl_s})
        if etag is not None:
            break
        current = lease.read()
        if current is not None:
            holder, their_etag = current
            if holder.get("expires", 0) < time.time():
                log.warning("lock %s: the lease of %s expired without being released; taking it over", name,
                            _describe(holder))
                etag = lease.replace({**me, "expires": time.time() + ttl_s}, their_etag)
                if etag is not None:
                    break
            elif time.monotonic() >= deadline:
                raise _waited_too_long(name, holder, wait_s)
        time.sleep(poll_s)

    state = {"etag": etag, "lost": None}
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl_s / 3):
            try:
                new = lease.replace({**me, "expires": time.time() + ttl_s}, state["etag"])
            except Exception as e:  # noqa: BLE001 - a store hiccup: try again before the lease runs out
                log.warning("lock %s: could not renew the lease (%s); retrying", name, e)
                continue
            if new is None:
                current = lease.read()
                state["lost"] = _describe(current[0]) if current else "nobody (it was deleted)"
                log.error("lock %s: the lease was taken over by %s while this process held it", name, state["lost"])
                return
            state["etag"] = new

    thread = threading.Thread(target=renew, name=f"lock-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if state["lost"] is None:
            try:
                current = lease.read()
                if current is not None and current[1] == state["etag"]:
                    lease.delete()
            except Exception as e:  # noqa: BLE001 - the store is unwell: the lease expires after ttl_s anyway
                log.warning("lock %s: could not release the lease (%s); it expires within %.0f s", name, e, ttl_s)
    if state["lost"] is not None:
        raise StoreLockLost(f"lock {name}: the lease was taken over by {state['lost']} while {me['owner']} held it "
                            f"(it was not renewed for {ttl_s:.0f} s); what ran under it may have overlapped")
