"""Replay: re-read archived segments through the normal path, or re-emit the events of past batches.

One request (``request_replay``, the backfill DAG's ``mode = replay``), two purposes, chosen by what was lost:

* ``rebuild``: a state table was lost or damaged (deleted, restored from an old backup, written by a bug). The
  archived segments of the chosen batches are claimed again, as *replay batches* in the one batch sequence, and
  go through the normal transform. Merging is idempotent: a state table that already holds a segment's cells does
  not change and emits nothing, while a lost or damaged table is rebuilt and the events say what the repair
  changed (a ``c`` for a row the state had lost, a ``u`` or ``d`` for one it had wrong), so a consumer that
  mirrored the damaged state is repaired as well. Replayed segments stay in ``archived/``.
* ``reemit``: a consumer lost events (a topic was deleted, retention ran out, a sink dropped data). The outbox rows
  of each chosen batch are copied, in their publish order, into a new batch's outbox and published again, byte
  for byte and with their original event ids, so a consumer that dedupes by id sees nothing twice. The state is
  not touched. It needs the outbox rows still there (``outbox`` retention); a batch whose rows are gone is an
  error that names it, never an empty re-emit.

The selection: batches by sequence number (``batches_from`` .. ``batches_to``) and/or by processing time
(``since`` .. ``until``, epoch seconds, compared with the batch's ``now``); ``nodes`` keeps some nodes' segments
(rebuild), ``tables`` some tables' events (reemit; a rebuild replays whole segments: every table in them is merged
again, which changes nothing where the state is right). What is skipped is counted in the request's answer:
snapshot and sweep batches hold no segments (rebuild skips them; reemit re-emits their events, which a consumer
missed as well), segments that went to quarantine for damaged bytes are not replayed (their readable entries were
processed when they arrived; the damaged ones are kept in quarantine with their reason), and an archived segment
that is no longer in the store (archive retention) is listed as missing.

Exactly once: a replay request is one backfill request (``requests``), consumed batch by batch; the claim writes
the manifest (which names the items it covers) before it takes them off the request, so a crash in between
replays nothing twice. Replay batches come before new segments: a rebuild must not let a new segment's cells land
on a lost table first (the event would carry half a row). A backfill batch of mode ``cql`` or ``sstables`` has no
segments either: a rebuild skips it (counted with the snapshot and sweep batches); load the table again to restore
what it loaded.
"""
from __future__ import annotations

import logging
from typing import Optional

from cdc_lib.errors import ConfigError
from cdc_lib.settings import PipelineConfig
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import ObjectStore

from .batches import Batch, PipelineError, read_batch
from .requests import new_request_id, put_request
from .resources import open_store

log = logging.getLogger("cassandra_cdc.pipeline")

PURPOSES = ("rebuild", "reemit")


def _names(value) -> Optional[list]:
    """A list setting as the DAG form gives it: a list, or comma-separated text; empty = all."""
    if value is None or value == "" or value == []:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(v).strip() for v in items if str(v).strip()] or None


def _int(name: str, value) -> Optional[int]:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"replay: {name} must be a whole number, not {value!r}") from None


def _archived_batches(store: ObjectStore) -> list:
    batches = []
    for key in store.list(f"{Layout.LEDGER}/batches/"):
        batch_id = key.rsplit("/", 1)[-1][:-len(".json")]
        b = read_batch(store, batch_id)
        if b.state == "archived":
            batches.append(b)
    return sorted(batches, key=lambda b: b.batch_seq)


def _damaged_segments(batch: Batch) -> set:
    from cdc_lib.commitlog.segment import DAMAGE_KINDS
    return {(q["node"], q["segment"]) for q in batch.steps.get("quarantined", []) if q["kind"] in DAMAGE_KINDS}


def request_replay(config: PipelineConfig, *, purpose: str = "rebuild", batches_from=None, batches_to=None,
                   since=None, until=None, nodes=None, tables=None) -> dict:
    """Ask the next ``cassandra_cdc`` runs to replay the chosen archived batches; returns what was selected and
    what will be skipped (and why). Errors name the problem: nothing selected, a replay already pending, a bad
    value."""
    if purpose not in PURPOSES:
        raise ConfigError(f"replay: purpose {purpose!r}: use one of {', '.join(PURPOSES)}")
    lo, hi = _int("batches_from", batches_from), _int("batches_to", batches_to)
    t_lo, t_hi = _int("since", since), _int("until", until)
    nodes, tables = _names(nodes), _names(tables)
    if purpose == "rebuild" and tables:
        raise ConfigError("replay: tables selects events to re-emit (purpose reemit); a rebuild replays whole "
                          "segments, which changes nothing in tables whose state is right")
    if purpose == "reemit" and nodes:
        raise ConfigError("replay: nodes selects segments to rebuild from (purpose rebuild); a re-emit copies "
                          "whole batches' events (use tables to narrow it)")
    store = open_store(config)
    chosen = [b for b in _archived_batches(store)
              if (lo is None or b.batch_seq >= lo) and (hi is None or b.batch_seq <= hi)
              and (t_lo is None or b.now >= t_lo) and (t_hi is None or b.now <= t_hi)]
    answer = {"purpose": purpose, "batches": len(chosen), "skipped_batches_without_segments": 0,
              "skipped_quarantined_segments": 0, "missing_segments": [], "items": 0}
    items = []
    for b in chosen:
        if purpose == "reemit":
            items.append({"id": b.batch_id, "batch_id": b.batch_id,
                          "events": int((b.steps.get("publish") or {}).get("events", 0))})
            continue
        if not b.segments:
            answer["skipped_batches_without_segments"] += 1
            continue
        damaged = _damaged_segments(b)
        for s in b.segments:
            if nodes and s["node"] not in nodes:
                continue
            if (s["node"], s["name"]) in damaged:
                answer["skipped_quarantined_segments"] += 1
                continue
            key = Layout.archived(config.cluster, s["node"], s["name"])
            if not store.exists(key):
                answer["missing_segments"].append(key)
                continue
            items.append({"id": key, "key": key, "node": s["node"], "name": s["name"], "size": s["size"],
                          "checksum": s["checksum"], "from_batch": b.batch_id})
    if not items:
        what = (f"batches {lo if lo is not None else 'first'}..{hi if hi is not None else 'last'}, processed "
                f"{t_lo if t_lo is not None else '-'}..{t_hi if t_hi is not None else '-'}"
                + (f", nodes {','.join(nodes)}" if nodes else ""))
        raise ConfigError(f"replay ({purpose}): nothing to replay among the archived batches ({what}): "
                          f"{answer['batches']} batch(es) matched, "
                          f"{answer['skipped_batches_without_segments']} without segments, "
                          f"{answer['skipped_quarantined_segments']} quarantined and "
                          f"{len(answer['missing_segments'])} missing segment(s)")
    request_id = new_request_id("replay")
    # a re-emit share is one source batch (its events stay one batch); a rebuild share is segments within
    # max_segments / max_bytes
    put_request(store, request_id, "replay", items, batch={"purpose": purpose, "tables": tables},
                per_batch=1 if purpose == "reemit" else None, segments=purpose == "rebuild")
    answer.update(request_id=request_id, items=len(items))
    for key in answer["missing_segments"]:
        log.warning("replay: %s is no longer in the store (archive retention?): not replayed", key)
    log.info("replay requested: %s", answer)
    return answer


def reemit_outbox(config: PipelineConfig, root: str, batch: Batch, hook) -> int:
    """Outbox of a re-emit batch: the source batches' outbox rows (only ``tables``, if given) in their publish
    order, under this batch's id and sequence; the events themselves (ids, keys, JSON) are copied unchanged."""
    import pyarrow as pa

    from cdc_lib.sinks.delta import OUTBOX_SCHEMA, DeltaRsStateStore, read_outbox
    st = DeltaRsStateStore(root, config.delta_options(), app_id=config.app_id, fail_hook=hook)
    if st.outbox_committed(batch.batch_seq):
        return 0   # written by an earlier attempt (publish counts the events)
    tables = set(batch.backfill.get("tables") or ())
    store = open_store(config)
    rows: list = []
    for source in batch.backfill["covers"]:
        source_rows = list(read_outbox(root, source, config.delta_options()))
        published = int((read_batch(store, source).steps.get("publish") or {}).get("events", 0))
        if not source_rows and published:
            raise PipelineError(f"replay: the outbox no longer holds the {published} events of batch {source} "
                                "(outbox retention): they cannot be re-emitted from it; rebuild the state from "
                                "the archive or take a snapshot instead")
        for r in source_rows:
            if tables and f"{r['keyspace']}.{r['table']}" not in tables:
                continue
            rows.append({**r, "batch_id": batch.batch_id, "batch_seq": batch.batch_seq, "seq": len(rows)})
    st.write_outbox(batch.batch_seq, pa.Table.from_pylist(rows, schema=OUTBOX_SCHEMA), batch.batch_id)
    return len(rows)


def describe(batch: Batch) -> str:
    """What a replay batch does, for the transform's first log line."""
    r = batch.backfill
    if r["purpose"] == "reemit":
        only = f" (tables {', '.join(r['tables'])})" if r.get("tables") else ""
        return f"replay {r['request_id']}: re-emit the events of {', '.join(r['covers'])}{only}"
    return (f"replay {r['request_id']}: rebuild from {len(batch.segments)} archived segments "
            f"({r['remaining']} left after this batch)")
