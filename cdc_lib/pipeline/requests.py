"""Backfill requests: work the backfill DAG asks for, done share by share as batches of the one batch sequence.

A request (``checkpoints/backfill-request.json``) is a list of pending items and what they are: archived segments
or batches to replay (``replay``), token ranges of live tables to scan (``cql``), SSTables of a snapshot
(``sstables``). One request is pending at a
time; the ``cassandra_cdc`` runs claim its shares before any new segment, so its batches follow each other with
no stream batch in between, and every topic holds: the stream before the request, the request's batches, the
stream after it.

Exactly once: a claim writes the batch manifest (which names the items it covers, ``covers``) and moves the
pointer *before* it takes those items off the request; a claim that died in between leaves them on the request,
and the next claim, seeing the previous batch finished, takes them off first (``consume_share``). So no item is
done twice and none is lost.

A share: items in order, at most ``per_batch`` of them (the request's; by default ``max_segments``) and at most
``max_bytes`` of their ``size`` (at least one item). What a batch needs besides its items (a replay's purpose, a
scan's consistency level...) is the request's ``batch`` mapping, copied into every batch's ``backfill`` info.
"""
from __future__ import annotations

import time
import uuid
from typing import Optional

from cdc_lib.errors import ConfigError
from cdc_lib.settings import PipelineConfig
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import ObjectStore

from .batches import Batch

REQUEST_KEY = Layout.checkpoint("backfill-request")


def new_request_id(mode: str) -> str:
    return f"{mode}-{int(time.time())}-{uuid.uuid4().hex[:6]}"


def put_request(store: ObjectStore, request_id: str, mode: str, items: list, *, batch: dict,
                per_batch: Optional[int] = None, segments: bool = False) -> dict:
    """Make ``items`` (dicts with a unique ``id``; ``size`` counts against ``max_bytes``) the pending request.

    ``segments``: the items are segments ({key, node, name, size, checksum}) the batches read; otherwise a batch
    finds its items in ``backfill["items"]``. An error when a request is still pending (it names it)."""
    if store.exists(REQUEST_KEY):
        pending = store.get_json(REQUEST_KEY)
        raise ConfigError(f"backfill: request {pending['request_id']} ({pending['mode']}) is still pending with "
                          f"{len(pending['pending'])} item(s); wait until the cassandra_cdc runs have done it")
    request = {"request_id": request_id, "mode": mode, "requested_at": int(time.time()), "batch": batch,
               "per_batch": per_batch, "segments": segments, "total": len(items), "pending": items}
    store.put_json(REQUEST_KEY, request)
    return request


def pending_request(store: ObjectStore) -> Optional[dict]:
    return store.get_json(REQUEST_KEY) if store.exists(REQUEST_KEY) else None


def claim_share(store: ObjectStore, config: PipelineConfig, last: Optional[Batch]) -> Optional[tuple]:
    """The next share of the pending request: (segments, backfill info) for a new batch, or None.

    Items the previous (finished) batch covers are taken off the request first: the claim that took them may have
    died before it could.
    """
    if last is not None and last.backfill:
        consume_share(store, last)          # a no-op unless its claim died before it could do this
    request = pending_request(store)
    if request is None:
        return None
    per_batch = request.get("per_batch") or config.max_segments
    share, size = [], 0
    for item in request["pending"]:
        if share and (len(share) >= per_batch or size + item.get("size", 0) > config.max_bytes):
            break
        share.append(item)
        size += item.get("size", 0)
    info = {**request["batch"], "request_id": request["request_id"], "mode": request["mode"],
            "covers": [item["id"] for item in share], "total": request.get("total", len(request["pending"])),
            "remaining": len(request["pending"]) - len(share)}
    if request.get("segments"):
        return [{k: item[k] for k in ("key", "node", "name", "size", "checksum")} for item in share], info
    info["items"] = share
    return [], info


def consume_share(store: ObjectStore, batch: Batch) -> None:
    """Take the items ``batch`` covers off the pending request (after its manifest and the pointer are written)."""
    request = pending_request(store)
    if request is None or request["request_id"] != batch.backfill.get("request_id"):
        return
    done = set(batch.backfill["covers"])
    left = [p for p in request["pending"] if p["id"] not in done]
    if len(left) == len(request["pending"]):
        return
    if left:
        request["pending"] = left
        store.put_json(REQUEST_KEY, request)
    else:
        store.delete(REQUEST_KEY)
