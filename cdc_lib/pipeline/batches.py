"""The batch manifest (``ledger/batches/<batch_id>.json``), the claim pointer, request flags and step metrics.

Every step reads and writes the manifest in the object store, so a retry or a rerun after a crash at any
instant finds what is done and does the rest. Counters of every step are logged and accumulated in
``checkpoints/metrics.json``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from cdc_lib.errors import CdcError
from cdc_lib.metrics import new_histogram, observe
from cdc_lib.settings import PipelineConfig
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import ObjectStore

from .resources import open_store

log = logging.getLogger("cassandra_cdc.pipeline")

POINTER_KEY = Layout.checkpoint("pipeline")
METRICS_KEY = Layout.checkpoint("metrics")
SWEEP_REQUEST_KEY = Layout.checkpoint("sweep-request")
SNAPSHOT_REQUEST_KEY = Layout.checkpoint("snapshot-request")
# record_metrics reads, changes and writes back one object: steps of two batches running at once in a process (one
# published while the next is transformed) take turns, or one step's counters could overwrite the other's.
_METRICS_LOCK = threading.Lock()
STATES = ("claimed", "transformed", "published", "archived")
FAULT_POINTS = ("claim:manifest_written", "claim:pointer_written", "transform:before", "transform:outbox",
                "transform:state", "transform:done", "publish:before", "publish:<publisher point>",
                "publish:done", "archive:before", "archive:segment", "archive:done")

Fault = Callable[[str], None]

# Counters that describe the store at one moment (a backlog, a count of foreign segments): the last value is
# kept, never summed into the totals.
GAUGES = frozenset({"batch_seq", "pending", "incomplete_uploads", "foreign_segments", "backlog",
                    "other_datacenter_segments", "loaded"})


class PipelineError(CdcError):
    """A step cannot go on (e.g. archive asked before the batch was published)."""


@dataclass
class Batch:
    """One batch as its manifest stores it. ``segments``: [{key, node, name, size, checksum, attributes (the
    sidecar's), shipped_at, closed_at}]."""

    batch_id: str = ""
    batch_seq: int = 0
    state: str = "empty"
    segments: list = field(default_factory=list)
    now: int = 0
    prev_now: Optional[int] = None
    sweep: bool = False
    snapshot: bool = False                        # a backfill: 'r' events for every live row (no segments)
    backfill: dict = field(default_factory=dict)  # a share of a backfill request: request_id, mode, covers...
                                                  # (requests.py; replay.py and bootstrap.py say the rest)
    resumed: bool = False
    claimed_by: str = ""
    steps: dict = field(default_factory=dict)     # step -> its counters (as the step returned them)

    @property
    def empty(self) -> bool:
        return not self.batch_id

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> dict:
        """What a task returns (Airflow logs and stores it as XCom): the batch's identity and each step's
        counters, without the segment list and quarantine records (the next task reads the manifest)."""
        return {"batch_id": self.batch_id, "batch_seq": self.batch_seq, "state": self.state,
                "segments": len(self.segments), "sweep": self.sweep, "snapshot": self.snapshot,
                "backfill": self.backfill.get("mode"), "resumed": self.resumed,
                "steps": {step: counters for step, counters in self.steps.items() if step != "quarantined"}}

    @classmethod
    def from_dict(cls, d: dict) -> "Batch":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})


def batch_id_for(seq: int) -> str:
    return f"b-{seq:010d}"


def manifest_key(batch_id: str) -> str:
    Layout.ledger(batch_id)   # validates the name
    return f"{Layout.LEDGER}/batches/{batch_id}.json"


def save_batch(store: ObjectStore, batch: Batch) -> None:
    store.put_json(manifest_key(batch.batch_id), batch.to_dict())


def read_batch(store: ObjectStore, batch_id: str) -> Batch:
    return Batch.from_dict(store.get_json(manifest_key(batch_id)))


def reload_batch(store: ObjectStore, batch) -> Batch:
    """The manifest as stored: a task gets a ``Batch.summary`` (or an older ``Batch``) from the task before it;
    only its ``batch_id`` counts."""
    batch_id = batch.batch_id if isinstance(batch, Batch) else (batch or {}).get("batch_id", "")
    if not batch_id:
        return Batch()
    return read_batch(store, batch_id)


def segment_sources(store: ObjectStore, batch: Batch) -> tuple[list, dict]:
    """Where the transform reads the batch's segments from, and the sha256 each was claimed with: a local store's
    files in place, a remote store's objects by URL (each reader downloads and checks its own copy)."""
    import os
    sources = [os.path.join(store.root, *s["key"].split("/")) if store.local else store.url_for(s["key"])
               for s in batch.segments]
    return sources, {src: s["checksum"] for src, s in zip(sources, batch.segments)}


def no_fault(point: str) -> None:
    pass


def processing_time(config: PipelineConfig) -> int:
    return int(config.now) if config.now is not None else int(time.time())


def record_metrics(store: ObjectStore, step: str, counters: dict,
                   observations: dict[str, list[float]] | None = None) -> None:
    """Log the step's counters and fold them into ``checkpoints/metrics.json``.

    It keeps the last run per step (``last``), totals of the numeric counters (``totals``, ``<step>.<counter>``;
    a counter that is a mapping, such as events per table and op, is summed key by key) and histograms
    (``histograms``): the step's ``duration_s`` as ``step_duration_seconds.<step>``, and each of
    ``observations`` (name -> values, e.g. the publish step's ``lag_seconds``).
    """
    log.info("%s: %s", step, json.dumps(counters, sort_keys=True))
    with _METRICS_LOCK:
        _fold_metrics(store, step, counters, observations)


def _fold_metrics(store: ObjectStore, step: str, counters: dict, observations: dict[str, list[float]] | None) -> None:
    try:
        m = store.get_json(METRICS_KEY)     # one request, not an existence check first (four steps per batch)
    except Exception:  # noqa: BLE001 - none yet (ObjectNotFound), or a broken one that must not stop the pipeline:
        m = {}          # it is written anew
    m.setdefault("totals", {})
    m.setdefault("last", {})
    m.setdefault("histograms", {})
    m["last"][step] = {**counters, "at": int(time.time())}
    summable = {"resumed"} if counters.get("repeat") else None    # a resumed step's work is counted once
    for k, v in counters.items():
        if (summable is None or k in summable) and not k.endswith("_s") and k not in GAUGES:
            key = f"{step}.{k}"
            if isinstance(v, dict):
                m["totals"][key] = _sum_into(m["totals"].get(key) or {}, v)
            elif _is_count(v):
                m["totals"][key] = m["totals"].get(key, 0) + v
    observed = dict(observations or {})
    if _is_count(counters.get("duration_s")):
        observed[f"step_duration_seconds.{step}"] = [counters["duration_s"]]
    for name, values in observed.items():
        hist = m["histograms"].get(name) or new_histogram()
        for value in values:
            observe(hist, value)
        m["histograms"][name] = hist
    store.put_json(METRICS_KEY, m)


def _is_count(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _sum_into(total: dict, add: dict) -> dict:
    """``add`` summed into ``total`` key by key, nested mappings too."""
    for k, v in add.items():
        if isinstance(v, dict):
            total[k] = _sum_into(total.get(k) or {}, v)
        elif _is_count(v):
            total[k] = total.get(k, 0) + v
    return total


def read_metrics(config: PipelineConfig) -> dict:
    store = open_store(config)
    return store.get_json(METRICS_KEY) if store.exists(METRICS_KEY) else {}


def read_pointer(store: ObjectStore) -> dict:
    return store.get_json(POINTER_KEY) if store.exists(POINTER_KEY) else {"batch_seq": 0}
