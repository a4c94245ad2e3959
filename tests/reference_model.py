"""A small, deliberately naive model of what Cassandra shows for a table: the oracle for the state engine.

It shares no code with ``cdc_lib.state``: it reads ``cdc_lib.model`` mutations directly, collects every
write, and for each read decides the winner with a plain sort key and applies every deletion by scanning the
full list of tombstones. Values are typed with ``cdc_lib.cqltypes`` and clustering order comes from
``CqlType.sort_key`` (not from ``state.reconcile.compare_values``).

``visible_table(table, mutations, now)`` -> {(partition key bytes, clustering tuple | None): typed row}.
Dropped columns and shadowable (materialized-view) deletions are outside this model.

History (what change events must show): ``published_states(table, batches, nows)`` is the table after every
step the pipeline publishes, in order. A mutation is an atomic unit here by construction: it is added whole to
the list of mutations seen, and the table is recomputed from scratch by ``visible_table``; nothing in between
exists. Mutations new in a batch are taken in write-time order (``write_time``: the highest timestamp the
mutation carries for the table), ties by mutation id; between batches, the table at each TTL expiry time.
"""
from __future__ import annotations

from collections import defaultdict

from cdc_lib.commitlog.model import EXPIRED_LIVENESS_TTL, BoundKind, RangeTombstoneMarker
from cdc_lib.cql.types import decode_counter_context

STATIC = "static"
_NEG = -(1 << 63)


def _cell_rank(c):
    """Cassandra 4.x reconciliation as one sort key: the greatest cell wins."""
    dead = c.is_tombstone or c.ttl != 0
    return (c.timestamp, dead, c.is_tombstone, c.local_deletion_time if dead else 0, c.value, c.ttl)


def _liveness_rank(lv):
    """LivenessInfo.supersedes as a sort key: timestamp, MV-expired, expiring over not, later expiry."""
    return (lv.timestamp, lv.ttl == EXPIRED_LIVENESS_TTL, lv.ttl != 0, lv.local_expiration_time if lv.ttl else 0,
            lv.ttl)


def _ranges(markers):
    """Pair start/boundary/end markers into (start values, start incl, end values, end incl, timestamp)."""
    out = []
    opened = None
    for m in markers:
        if m.kind in (BoundKind.INCL_START_BOUND, BoundKind.EXCL_START_BOUND):
            opened = (m.clustering, m.kind == BoundKind.INCL_START_BOUND, m.deletion.marked_for_delete_at)
        elif m.kind in (BoundKind.INCL_END_BOUND, BoundKind.EXCL_END_BOUND):
            out.append((opened[0], opened[1], m.clustering, m.kind == BoundKind.INCL_END_BOUND, opened[2]))
            opened = None
        else:
            end_incl = m.kind == BoundKind.INCL_END_EXCL_START_BOUNDARY
            out.append((opened[0], opened[1], m.clustering, end_incl, m.end_deletion.marked_for_delete_at))
            opened = (m.clustering, not end_incl, m.start_deletion.marked_for_delete_at)
    return out


def _compare(table, a, b):
    """Order of two clustering prefixes on their common length."""
    for col, x, y in zip(table.clustering, a, b):
        kx, ky = col.type.sort_key(x), col.type.sort_key(y)
        if kx != ky:
            c = -1 if kx < ky else 1
            return -c if col.reversed else c
    return 0


def _covers(table, rt, ck):
    start, start_incl, end, end_incl, _ = rt
    if start:
        c = _compare(table, ck, start)
        if c < 0 or (c == 0 and not start_incl):
            return False
    if end:
        c = _compare(table, ck, end)
        if c > 0 or (c == 0 and not end_incl):
            return False
    return True


def _collect(mutations, table):
    parts = defaultdict(lambda: {"pdel": [], "rts": [], "rows": defaultdict(
        lambda: {"lv": [], "del": [], "cells": defaultdict(list), "cdel": defaultdict(list)})})
    for m in mutations:
        for u in m.updates:
            if u.table_id != table.id:
                continue
            p = parts[u.partition_key]
            if u.partition_deletion is not None and not u.partition_deletion.is_live:
                p["pdel"].append(u.partition_deletion.marked_for_delete_at)
            rows = ([u.static_row] if u.static_row is not None else []) + [
                x for x in u.unfiltereds if not isinstance(x, RangeTombstoneMarker)]
            p["rts"] += _ranges([x for x in u.unfiltereds if isinstance(x, RangeTombstoneMarker)])
            for r in rows:
                slot = p["rows"][STATIC if r.is_static else tuple(r.clustering)]
                if r.liveness is not None:
                    slot["lv"].append(r.liveness)
                if r.deletion is not None and not r.deletion.is_live:
                    slot["del"].append(r.deletion.marked_for_delete_at)
                for col, d in r.complex_deletions.items():
                    slot["cdel"][col].append(d.marked_for_delete_at)
                for c in r.cells:
                    slot["cells"][(c.column, c.path)].append(c)
    return parts


def _row_values(table, slot, deleted_at, now):
    """({column: typed value} of live cells, row has live liveness) for one row."""
    live_marker = False
    if slot["lv"]:
        lv = max(slot["lv"], key=_liveness_rank)
        live_marker = (lv.timestamp > deleted_at and lv.ttl != EXPIRED_LIVENESS_TTL
                       and (lv.ttl == 0 or now < lv.local_expiration_time))
    values = {}
    complex_items = defaultdict(list)
    counters = defaultdict(list)
    counter_dead = set()
    for (col_name, path), cells in slot["cells"].items():
        col = table.columns[col_name]
        shadow = max([deleted_at] + slot["cdel"].get(col_name, []))
        if col.type.kind == "counter":
            for c in cells:
                if c.timestamp <= shadow:
                    continue
                if c.is_tombstone:
                    counter_dead.add(col_name)
                else:
                    counters[col_name].append(c)
            continue
        w = max(cells, key=_cell_rank)
        if w.timestamp <= shadow or w.is_tombstone or (w.ttl != 0 and now >= w.local_deletion_time):
            continue
        if path is None:
            values[col_name] = col.type.decode(w.value)
        else:
            complex_items[col_name].append((path, w.value))
    for col_name, items in complex_items.items():
        t = table.columns[col_name].type
        items.sort(key=lambda pv: t.path_type.sort_key(pv[0]))
        values[col_name] = t.decode_cells(items)
    for col_name, cells in counters.items():
        if col_name in counter_dead:
            continue
        best = {}
        for c in cells:
            for sh in decode_counter_context(c.value):
                rank = ({"global": 2, "local": 1, "remote": 0}[sh.kind], sh.clock, sh.count)
                if sh.counter_id not in best or rank > best[sh.counter_id]:
                    best[sh.counter_id] = rank
        values[col_name] = sum(r[2] for r in best.values())
    return values, live_marker


def visible_table(table, mutations, now):
    """{(partition key, clustering tuple or None): typed row} as ``SELECT *`` would show at ``now``."""
    out = {}
    for pk, p in _collect(mutations, table).items():
        pdel = max(p["pdel"], default=_NEG)
        static_vals, static_live = {}, False
        if STATIC in p["rows"]:
            static_vals, static_live = _row_values(table, p["rows"][STATIC], pdel, now)
            static_live = static_live or bool(static_vals)
        pk_values = _split_key(table, pk)
        base = {c.name: c.type.decode(v) for c, v in zip(table.partition_key, pk_values)}
        found = False
        for ck, slot in p["rows"].items():
            if ck == STATIC:
                continue
            deleted_at = max([pdel] + slot["del"] + [rt[4] for rt in p["rts"] if _covers(table, rt, ck)])
            vals, live = _row_values(table, slot, deleted_at, now)
            if not live and not vals:
                continue
            found = True
            row = _empty_row(table, base)
            for c, v in zip(table.clustering, ck):
                row[c.name] = c.type.decode(v)
            row.update(static_vals)
            row.update(vals)
            out[(pk, ck)] = row
        if not found and static_live:
            row = _empty_row(table, base)
            row.update(static_vals)
            out[(pk, None)] = row
    return out


def _empty_row(table, base):
    row = {c: None for c in table.columns}
    row.update(base)
    return row


def _split_key(table, key):
    if len(table.partition_key) == 1:
        return [key]
    out, i = [], 0
    while i < len(key):
        n = int.from_bytes(key[i:i + 2], "big")
        out.append(key[i + 2:i + 2 + n])
        i += 3 + n
    return out


def json_table(table, rows: dict) -> dict:
    """A model table in the events' JSON forms: {key JSON: row JSON}, the shape replayed events are compared in."""
    import json

    from cdc_lib.sinks.avro import to_json_key, to_json_row
    out = {}
    for row in rows.values():
        key = {c.name: row[c.name] for c in table.partition_key + table.clustering}
        out[json.dumps(to_json_key(table, key), separators=(",", ":"), ensure_ascii=False)] = to_json_row(table, row)
    return out


# ---------------------------------------------------------------------------------------------------------
# History: the table after each mutation, as consumers must see it change

def write_time(table, mutation) -> int:
    """The highest timestamp ``mutation`` carries for ``table``: cells, liveness and every kind of deletion."""
    times = []
    for u in mutation.updates:
        if u.table_id != table.id:
            continue
        if u.partition_deletion is not None and not u.partition_deletion.is_live:
            times.append(u.partition_deletion.marked_for_delete_at)
        for x in u.unfiltereds + ([u.static_row] if u.static_row is not None else []):
            if isinstance(x, RangeTombstoneMarker):
                times += [d.marked_for_delete_at for d in (x.deletion, x.end_deletion, x.start_deletion)
                          if d is not None]
                continue
            if x.liveness is not None:
                times.append(x.liveness.timestamp)
            if x.deletion is not None and not x.deletion.is_live:
                times.append(x.deletion.marked_for_delete_at)
            times += [d.marked_for_delete_at for d in x.complex_deletions.values()]
            times += [c.timestamp for c in x.cells]
    return max(times, default=_NEG)


def _expiry_times(table, mutations, after: int, upto: int) -> list:
    """Every expiry time (seconds) in ``(after, upto]`` of an expiring cell or row marker of ``table``."""
    out = set()
    for m in mutations:
        for u in m.updates:
            if u.table_id != table.id:
                continue
            for r in ([u.static_row] if u.static_row is not None else []) + [
                    x for x in u.unfiltereds if not isinstance(x, RangeTombstoneMarker)]:
                if r.liveness is not None and r.liveness.ttl:
                    out.add(r.liveness.local_expiration_time)
                out |= {c.local_deletion_time for c in r.cells if c.ttl and not c.is_tombstone}
    return sorted(t for t in out if after < t <= upto)


def published_states(table, batches, nows, end: int | None = None) -> list:
    """The table (``json_table`` form) before any event and after each step consumers see, in order.

    ``batches``: lists of mutations as the pipeline receives them (replica copies share a ``mutation_id``
    and count once; a copy of a mutation seen in an earlier batch changes nothing); ``nows``: each batch's
    processing time. Before batch ``i``: the table at every expiry time in ``(nows[i - 1], nows[i]]``; then the
    batch's new mutations one at a time, each applied whole, in (write time, mutation id) order. ``end``: a
    last expiry sweep up to that time.
    """
    seen: list = []
    ids: set = set()
    states = [{}]
    prev = None
    for batch, now in list(zip(batches, nows)) + ([([], end)] if end is not None else []):
        if prev is not None:
            for t in _expiry_times(table, seen, prev, now):
                states.append(json_table(table, visible_table(table, seen, t)))
        new = []
        for m in batch:
            assert m.mutation_id is not None, "published_states needs mutation ids (replica copies share one)"
            if m.mutation_id not in ids:
                ids.add(m.mutation_id)
                new.append(m)
        for m in sorted(new, key=lambda m: (write_time(table, m), m.mutation_id)):
            seen.append(m)
            states.append(json_table(table, visible_table(table, seen, now)))
        prev = now
    return states
