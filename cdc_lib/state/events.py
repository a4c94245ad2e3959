"""Change events: what consumers see when a row's visible state changes.

``apply_batch(table, states, records, now)`` joins a batch of cell-log records of one table into the states
of the affected partitions (``states``: {partition key bytes: ``state.reconcile.PartitionState``}, changed in place;
missing keys start empty) and returns the change events, in the order they must be published.
``expiry_sweep(table, states, now_before, now)`` returns the events of rows whose TTL ran out in
``(now_before, now]``.

Event (a plain dict; values are the Python values of ``cdc_lib.cql.types``, counters as their totals)::

    {"id": str, "op": "c" | "u" | "d" | "r", "key": {primary key column: value},
     "before": row | None, "after": row | None, "changed": [column, ...],
     "source": {"cluster", "node", "keyspace", "table", "segment", "position", "ts_us", "expired",
                "connector": "cassandra-cdc"},
     "ts_ms": int}

Rules:

* A row is a CQL row as ``SELECT *`` shows it (see ``reconcile``): keyed by partition key and clustering; its
  full image (``before``/``after``) carries every column, static columns included. A partition with live
  static data and no visible clustering row shows one row whose clustering columns are null; that row is
  created, updated and deleted like any other (it is deleted when the first clustering row appears, and comes
  back when the last one goes). A static column change therefore emits an update for every visible row of
  the partition.
* An event is emitted only when a row's visible state changes (``before != after``). ``changed`` lists the
  columns whose value differs between ``before`` and ``after`` (a missing image counts as all null; key
  columns are included for creates and deletes).
* **One event per row per mutation.** Cassandra applies a mutation (one commit-log entry: a statement, or
  every statement of a batch that touches one partition) to its partition atomically: no read ever sees part
  of it. So the unit of change is the mutation: a partition's records are grouped by ``mutation_id`` (the
  cell log's id of the entry they came from, shared by every replica's copy), each group is applied whole, and
  then the rows it may have touched are compared with what consumers last saw; each changed row yields one
  event, rows in clustering order (the static-only row first). A collection overwrite (a complex deletion at
  ``ts - 1`` plus the new elements at ``ts``), an INSERT with collections over an existing row, a range or
  partition deletion followed by inserts in one batch, a counter delete and increment in one batch: each is
  one event per row, never a delete and a create, never an image with the collection emptied in between.
* Mutations of a partition are applied in the order of their **write time**, the highest timestamp among
  their records of that partition (``ts`` for a collection overwrite, not ``ts - 1``); equal write times are
  ordered by ``mutation_id`` (unsigned bytes), so the order never depends on arrival. Records without a
  mutation id (not read from a commit-log entry: an SSTable or a CQL scan holds merged state, not history)
  are one change together per partition and batch, with their highest timestamp as write time, before a
  mutation with the same write time: the only states known to have existed are before and after all of them.
* A late mutation (its write time is older than changes already published for the partition, because its
  replicas' segments came in a later batch) is joined into the state as it stands: each row whose visible
  state it changes gets one update whose ``before`` is the row as consumers last saw it and whose ``after`` is
  the row with every mutation seen so far; published history is never rewritten. So for every key each
  event's ``before`` is the previous event's ``after``; ``source.ts_us`` can then be older than the previous
  event's.
* ``source.ts_us`` is the mutation's write time; ``segment``/``position`` are those of the copy with the
  smallest (segment id, position) (the copy ``state.batch.dedupe_records`` keeps). Expiry events have
  ``expired: True``, ``ts_us`` = the expiry time and no segment/position.
* ``id`` is a hash of the table id, the partition key, the row key, ``op``, ``ts_us`` and the row's resulting
  state (its cells and tombstones with their timestamps, its static row, the deletions covering it, and which
  of its cells are live): republishing the same change gives the same id; two different changes never do. It is
  SHA-256 of a canonical binary encoding of those (``_event_id``, below), which the compiled engine writes too.
* ``ts_ms`` is the caller's processing time (``now`` in ms unless ``ts_ms`` is given): nothing here reads the
  clock.

Contract on ``now``: consumers must have seen every partition as it was visible at ``now`` before
``apply_batch(..., now)`` runs, i.e. the expiry sweep up to ``now`` has run first (``process`` does both).
``now`` must not decrease from one call to the next. Under that contract a consumer that applies the events
in order holds exactly ``state.reconcile.visible_rows`` of every partition (``replay`` does that, for tests).

The invariant every event stream satisfies (``tests/event_invariant.py`` checks it against an independent
model, and can check it against a real cluster): **every ``before`` and ``after`` is a state of its row that
``SELECT *`` at consistency ALL could have returned at some moment, and per key the images follow each other in
the order those states occurred.** Precisely, the images are the row after each mutation the pipeline has
seen, applied in write-time order; that is what readers saw whenever mutations were applied in write-time order
and reached the pipeline no later than newer ones (server-side timestamps, no lagging replica). Out-of-order
client timestamps and late segments are the exception: their events still chain, and the latest image is
always the row as it is.

``r`` (a read) is a row a backfill loaded: ``apply_batch(create_op="r")`` for the records of a scan,
``snapshot_events`` for the state as it is. ``apply_batch(quiet_before=...)`` merges changes older than a scan's
read of their partition without an event (``scan.horizon``); the partition's next event in the batch starts from
the row as the events so far showed it.

Other entry points: ``snapshot_events`` (``r`` events of every visible row, for a backfill),
``partition_next_expiry`` (a partition's next TTL expiry, so a store can sweep only what can expire).
"""
from __future__ import annotations

import hashlib
import struct
from operator import itemgetter
from typing import Iterable, Optional

from cdc_lib.celllog.schema import KIND_PARTITION_DELETION, KIND_RANGE_TOMBSTONE

from .reconcile import (ALL_ROWS, STATIC_KEY, PartitionState, StateError, _apply_record, _info, _row_shadow_ts,
                        _typed_row, clustering_sort_key, partition_images)

CONNECTOR = "cassandra-cdc"
OP_CREATE, OP_UPDATE, OP_DELETE, OP_READ = "c", "u", "d", "r"


# Which copy of a mutation an event names as its source: the one with the smallest (segment id, position,
# segment), which is also the copy ``state.batch.dedupe_records`` keeps (records are cell-log records).
_source_copy = itemgetter("segment_id", "position", "segment")


def _partition_changes(records: list) -> list:
    """One partition's records as its changes, in the order they are applied: [(write time, [records])].

    A change is one mutation's records (same ``mutation_id``); records without one are one change together.
    Order: write time (the highest timestamp of the change's records), then mutation id (none first).
    """
    first = records[0]
    if len(records) == 1:
        return [(first["timestamp"], records)]
    mid = first.get("mutation_id")
    write_time = first["timestamp"]
    for rec in records:             # most partitions of a batch have one mutation: no grouping, no sort
        if rec.get("mutation_id") != mid:
            break
        ts = rec["timestamp"]
        if ts > write_time:
            write_time = ts
    else:
        return [(write_time, records)]
    groups: dict = {}
    for rec in records:
        mid = rec.get("mutation_id")
        group = groups.get(mid)
        if group is None:
            groups[mid] = [rec]
        else:
            group.append(rec)
    changes = [(max(r["timestamp"] for r in group), mid or b"", group) for mid, group in groups.items()]
    changes.sort(key=lambda c: (c[0], c[1]))
    return [(write_time, group) for write_time, _, group in changes]


class _Emitter:
    """Builds event dicts for one table."""

    def __init__(self, table, cluster: str, node: str, ts_ms: int):
        self.table = table
        self.cluster = cluster
        self.node = node
        self.ts_ms = ts_ms
        self.sort_key = clustering_sort_key(table) if table.clustering else None
        info = self.info = _info(table)     # per-table facts, computed once per table, not per partition
        self.table_id = info.table_id
        self.change_plan = info.change_plan
        self.key_names = info.key_names

    def ordered(self, keys) -> list:
        keys = list(keys)
        if len(keys) == 1:
            return keys
        static = [k for k in keys if k is STATIC_KEY]
        rest = [k for k in keys if k is not STATIC_KEY]
        if self.sort_key is not None and len(rest) > 1:
            rest.sort(key=self.sort_key)
        return static + rest

    def diff(self, pk: bytes, part: PartitionState, before: dict, after: dict, now: int, ts_us: int,
             segment, position, expired: bool, create_op: str = OP_CREATE) -> list:
        """An event per row whose image differs; a row that appears is ``create_op`` (``r`` for a backfill)."""
        out = []
        for key in self.ordered(set(before) | set(after)):
            b = before.get(key)
            a = after.get(key)
            if a == b:
                continue
            out.append(self.event(pk, part, key, b, a, now, ts_us, segment, position, expired, create_op))
        return out

    def event(self, pk, part, key, b_img, a_img, now, ts_us, segment, position, expired,
              create_op=OP_CREATE) -> dict:
        table = self.table
        info = self.info
        op = create_op if b_img is None else (OP_DELETE if a_img is None else OP_UPDATE)
        before = None if b_img is None else _typed_row(info, table, pk, key, b_img)
        after = None if a_img is None else _typed_row(info, table, pk, key, a_img)
        changed = _changed_columns(self.change_plan, b_img, a_img)
        ref = after if after is not None else before
        key_values = {name: ref[name] for name in self.key_names}
        eid = _event_id(table, pk, key, op, ts_us, expired, part, a_img, self.table_id)
        return {
            "id": eid, "op": op, "key": key_values, "before": before, "after": after, "changed": changed,
            "source": {"cluster": self.cluster, "node": self.node, "keyspace": table.keyspace,
                       "table": table.name, "segment": segment, "position": position, "ts_us": ts_us,
                       "expired": expired, "connector": CONNECTOR},
            "ts_ms": self.ts_ms,
        }


def _changed_columns(plan: list, b_img, a_img) -> list:
    """The columns whose value differs between two images (key columns for creates and deletes), in
    ``table.columns`` order; ``plan`` is the table's columns classified once (``_Emitter.change_plan``)."""
    out = []
    b_static, b_row = b_img if b_img is not None else (None, None)
    a_static, a_row = a_img if a_img is not None else (None, None)
    creates_or_deletes = b_img is None or a_img is None
    for name, kind in plan:
        if kind == 0:
            if creates_or_deletes:
                out.append(name)
            continue
        if kind == 1:
            x = None if b_static is None else b_static.get(name)
            y = None if a_static is None else a_static.get(name)
        else:
            x = None if b_row is None else b_row.get(name)
            y = None if a_row is None else a_row.get(name)
        if x != y:
            out.append(name)
    return out


# ---- event ids ------------------------------------------------------------------------------------------------
#
# An event's id is the first 16 bytes (32 hex digits) of SHA-256 over one canonical encoding of what makes the
# change (the table, the row, the op, the write time, the expiry flag) and of the row's resulting state (its cells
# and tombstones with their timestamps, its partition's static row and deletion, the deletions covering it, and what
# it shows). Every field is length-prefixed or of fixed width, so two different inputs never encode alike; integers
# are big-endian; names are UTF-8; a row's cells come by column name, a complex column's by path, rows by key.
# ``native/src/state/events.rs`` writes the same bytes (``tests/test_state_native.py`` compares them).
#
#   input    = TAG, bytes(table id), bytes(partition key), opt(bytes(clustering key)), op (1 byte), i64(ts_us),
#              u8(expired), row(static row), opt(del(partition deletion)),
#              [clustering row:  opt(row(its state)), i64(its shadowing deletion time)
#               static-only row: u32(n), n x (bytes(key), row(state)) of every clustering row, by key],
#              opt(image(static part), opt(image(row part))) of the row after the change (None for a delete)
#   row      = opt(i64 ts, i32 ttl, i64 ldt of its liveness), opt(del(deletion)), opt(del(shadowable deletion)),
#              u32(n), n x (str(column), cell), u32(m), m x (str(column), opt(del(its deletion)), u32(k),
#              k x (bytes(path), cell))
#   cell     = i64 ts, i32 ttl, i64 ldt, u8 tombstone, bytes(value)
#   del      = i64 ts, i64 ldt
#   image    = u32(n), n x (str(column), value): 0 bytes(value) | 1 i128 (a counter's total) |
#              2 u32(k), k x (opt(bytes(path)), bytes(value)) (a complex column's live items)
#   bytes(b) = u32 length, b;  str(s) = bytes(s as UTF-8);  opt(x) = 0 | 1 x
#
# Only events computed again ever meet ids computed before: a redelivery and a re-emit publish the outbox's ids.

_ID_TAG = b"cassandra-cdc event id 2\n"
_U32, _I64, _DEL, _LIVENESS, _CELL = (struct.Struct(f) for f in (">I", ">q", ">qq", ">qiq", ">qiqB"))


def _id_bytes(out: bytearray, b: bytes) -> None:
    out += _U32.pack(len(b))
    out += b


def _id_opt(out: bytearray, x, write) -> None:
    """opt(x): 0 for None, else 1 then ``x`` as ``write(out, x)`` encodes it."""
    if x is None:
        out.append(0)
    else:
        out.append(1)
        write(out, x)


def _id_del(out: bytearray, d) -> None:
    _id_opt(out, d, lambda o, d: o.extend(_DEL.pack(d[0], d[1])))


def _id_cell(out: bytearray, cell) -> None:
    out += _CELL.pack(cell[0], cell[1], cell[2], 1 if cell[3] else 0)
    _id_bytes(out, cell[4])


def _id_row(out: bytearray, row) -> None:
    _id_opt(out, row.liveness, lambda o, lv: o.extend(_LIVENESS.pack(*lv)))
    _id_del(out, row.deletion)
    _id_del(out, row.shadowable)
    out += _U32.pack(len(row.cells))
    for col in sorted(row.cells):
        _id_bytes(out, col.encode())
        _id_cell(out, row.cells[col])
    out += _U32.pack(len(row.complex))
    for col in sorted(row.complex):
        deletion, cells = row.complex[col]
        _id_bytes(out, col.encode())
        _id_del(out, deletion)
        out += _U32.pack(len(cells))
        for path in sorted(cells):
            _id_bytes(out, path)
            _id_cell(out, cells[path])


def _id_image(out: bytearray, img: dict) -> None:
    out += _U32.pack(len(img))
    for col in sorted(img):
        _id_bytes(out, col.encode())
        v = img[col]
        if isinstance(v, (bytes, bytearray)):
            out.append(0)
            _id_bytes(out, v)
        elif isinstance(v, int):
            out.append(1)
            out += v.to_bytes(16, "big", signed=True)
        else:
            out.append(2)
            out += _U32.pack(len(v))
            for path, value in v:
                _id_opt(out, path, _id_bytes)
                _id_bytes(out, value)


def _id_after(out: bytearray, a_img) -> None:
    """The row after the change: image(static part), opt(image(row part))."""
    static_img, row_img = a_img
    _id_image(out, static_img)
    _id_opt(out, row_img, _id_image)


def _event_id(table, pk: bytes, key, op: str, ts_us: int, expired: bool, part: PartitionState, a_img,
              table_id: Optional[str] = None) -> str:
    """The event's id: SHA-256 of the canonical encoding above, its first 16 bytes in hex."""
    out = bytearray(_ID_TAG)
    _id_bytes(out, (str(table.id) if table_id is None else table_id).encode())
    _id_bytes(out, pk)
    _id_opt(out, None if key is STATIC_KEY else key, _id_bytes)
    out += op.encode()
    out += _I64.pack(ts_us)
    out.append(1 if expired else 0)
    _id_row(out, part.static)
    _id_del(out, part.deletion)
    if key is not STATIC_KEY:
        _id_opt(out, part.rows.get(key), _id_row)
        out += _I64.pack(_row_shadow_ts(table, part, key, None))
    else:
        # the static-only row exists or not depending on the partition's clustering rows
        out += _U32.pack(len(part.rows))
        for k in sorted(part.rows):
            _id_bytes(out, k)
            _id_row(out, part.rows[k])
    _id_opt(out, a_img, _id_after)
    return hashlib.sha256(out).hexdigest()[:32]


def _scope(table, part: PartitionState, rec):
    """Which rows a record can change: ALL_ROWS or one clustering key (before applying it)."""
    kind = rec["kind"]
    if kind == KIND_PARTITION_DELETION or kind == KIND_RANGE_TOMBSTONE or rec["is_static"]:
        return ALL_ROWS
    return rec["clustering"] or b""


def apply_batch(table, states: dict, records: Iterable, now: int, *, cluster: str = "", node: str = "",
                ts_ms: Optional[int] = None, create_op: str = OP_CREATE, quiet_before=None) -> list:
    """Join ``records`` (cell-log dicts of one table) into ``states`` and return the change events.

    ``create_op``: the op of an event for a row that becomes visible: ``c``, or ``r`` when the records load rows
    that existed before (a backfill scan: ``OP_READ``). ``quiet_before(partition key) -> microseconds or None``:
    a change written before that time is merged without an event (a backfill scan read the partition later: the
    change is in what it read; ``scan.horizon``)."""
    emitter = _Emitter(table, cluster, node, now * 1000 if ts_ms is None else ts_ms)
    info = emitter.info
    by_key: dict = {}
    table_id = emitter.table_id
    for rec in records:
        rid = rec.get("table_id")
        if rid is not None and rid != table_id:
            raise StateError(f"record of table {rid} in a batch for {table.qualified_name} ({table_id})")
        recs = by_key.get(rec["partition_key"])
        if recs is None:
            by_key[rec["partition_key"]] = [rec]
        else:
            recs.append(rec)
    events = []
    for pk, recs in by_key.items():
        part = states.get(pk)
        if part is None:
            part = states[pk] = PartitionState()
        horizon = quiet_before(pk) if quiet_before is not None else None
        # the partition as the events so far showed it, once a quiet change may have moved it silently: a scan
        # shows no tombstones, so an older write merged again can bring back what a deletion the scan saw
        # removed. The next event's before image is what consumers hold, not that moment.
        shown = None
        for ts, group in _partition_changes(recs):
            if horizon is not None and ts < horizon:
                if shown is None:
                    shown = part.copy()
                for rec in group:
                    _apply_record(info, table, part, rec)
                continue
            scope = set()
            whole = False
            for rec in group:
                s = _scope(table, part, rec)
                if s is ALL_ROWS:
                    whole = True
                    break
                scope.add(s)
            if whole:
                only = None
                before = partition_images(table, part if shown is None else shown, now, None)
            else:
                # Most mutations change nothing (replica copies, losing late writes): apply them to copies of
                # the rows in scope and compute the "before" images only when something changed.
                only = scope
                saved = {ck: part.rows.get(ck) for ck in scope}
                for ck, row in saved.items():
                    if row is not None:
                        part.rows[ck] = row.copy()
            changed = False
            for rec in group:
                if _apply_record(info, table, part, rec) is not None:
                    changed = True
            if not changed:
                continue
            if not whole:
                current = {ck: part.rows.get(ck) for ck in scope}
                if shown is None:
                    _swap_rows(part, saved)
                    before = partition_images(table, part, now, only)
                    _swap_rows(part, current)
                else:
                    before = partition_images(table, shown, now, only)
            after = partition_images(table, part, now, only)
            source = group[0] if len(group) == 1 else min(group, key=_source_copy)
            events += emitter.diff(pk, part, before, after, now, ts, source.get("segment"), source.get("position"),
                                   False, create_op)
            if shown is not None:       # what this change's images covered is shown as it is now
                if whole:
                    shown = None
                else:
                    _swap_rows(shown, {ck: None if row is None else row.copy() for ck, row in current.items()})
    return events


def _swap_rows(part: PartitionState, rows: dict) -> None:
    for ck, row in rows.items():
        if row is None:
            part.rows.pop(ck, None)
        else:
            part.rows[ck] = row


def snapshot_events(table, states: dict, now: int, *, cluster: str = "", node: str = "",
                    ts_ms: Optional[int] = None) -> list:
    """``r`` (read) events for every visible row of ``states`` at ``now``: a backfill of the current table."""
    emitter = _Emitter(table, cluster, node, now * 1000 if ts_ms is None else ts_ms)
    events = []
    for pk, part in states.items():
        events += emitter.diff(pk, part, {}, partition_images(table, part, now), now, 0, None, None, False,
                               OP_READ)
    return events


def _expiries(row, lo: int, hi: int, acc: set) -> None:
    lv = row.liveness
    if lv is not None and lv[1] and lo < lv[2] <= hi:
        acc.add(lv[2])
    for c in row.cells.values():
        if c[1] and not c[3] and lo < c[2] <= hi:
            acc.add(c[2])
    for _, cells in row.complex.values():
        for c in cells.values():
            if c[1] and not c[3] and lo < c[2] <= hi:
                acc.add(c[2])


def partition_next_expiry(part: PartitionState, after: int) -> Optional[int]:
    """The earliest expiry time (seconds) after ``after`` of any expiring cell or liveness, or None.

    A store can keep it per partition to sweep only partitions with something to expire.
    """
    acc: set = set()
    _expiries(part.static, after, 1 << 62, acc)
    for row in part.rows.values():
        _expiries(row, after, 1 << 62, acc)
    return min(acc) if acc else None


def expiry_sweep(table, states: dict, now_before: int, now: int, *, cluster: str = "", node: str = "",
                 ts_ms: Optional[int] = None) -> list:
    """Events for rows whose visible state changed because TTLs expired in ``(now_before, now]``.

    Each distinct expiry time yields its own events, in time order, so a row whose cells expire at
    different times shows each step. ``source.expired`` is True and ``source.ts_us`` the expiry time.
    """
    emitter = _Emitter(table, cluster, node, now * 1000 if ts_ms is None else ts_ms)
    events = []
    if now <= now_before:
        return events
    for pk, part in states.items():
        static_times: set = set()
        _expiries(part.static, now_before, now, static_times)
        times = set(static_times)
        row_times: dict = {}
        for ck, row in part.rows.items():
            acc: set = set()
            _expiries(row, now_before, now, acc)
            if acc:
                row_times[ck] = acc
                times |= acc
        if not times:
            continue
        t_prev = now_before
        for t in sorted(times):
            if t in static_times:
                only = None
            else:
                only = {ck for ck, acc in row_times.items() if t in acc}
            before = partition_images(table, part, t_prev, only)
            after = partition_images(table, part, t, only)
            events += emitter.diff(pk, part, before, after, t, t * 1_000_000, None, None, True)
            t_prev = t
    return events


def process(table, states: dict, records: Iterable, now: int, prev_now: Optional[int] = None, **kw) -> list:
    """The expiry sweep over ``states`` for ``(prev_now, now]`` (when ``prev_now`` is given), then the batch.

    ``states`` must then hold every partition of the table whose rows can expire in the window (a caller that
    loads only the batch's partitions runs ``expiry_sweep`` over the others itself).
    """
    events = []
    if prev_now is not None:
        events += expiry_sweep(table, states, prev_now, now, **kw)
    events += apply_batch(table, states, records, now, **kw)
    return events


def replay(table, events: Iterable) -> dict:
    """The table a consumer holds after applying ``events`` in order: {(pk tuple, ck tuple): after row}."""
    out = {}
    for e in events:
        k = tuple(sorted((c, repr(v)) for c, v in e["key"].items()))
        if e["after"] is None:
            out.pop(k, None)
        else:
            out[k] = e["after"]
    return out
