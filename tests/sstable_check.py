"""Check the SSTable reader against what Cassandra itself returns: ``SELECT *``, ``WRITETIME()`` and ``TTL()``.

Reusable by any test that has a real cluster (and by the prototype script that writes real 5.0 SSTables):

* ``select_table(session, table)``: the rows as ``SELECT *`` returns them, in the events' JSON forms
  ({key JSON: row JSON}; ``cdc_lib.demo.compare.select_json``), and ``select_cell_times(session, table)``:
  {key JSON: {column: [writetime, ttl]}} for every simple non-key column. Driver values are turned into the
  same typed values our decoders produce by serializing them with the driver's own codec and decoding the bytes
  with ``cdc_lib.cql.types`` (``cdc_lib.demo.compare.typed_from_driver``), so nothing of the SSTable reader is
  used on this side.
* ``rows_from_mutations(table, paths, now)``: the rows the reference decoder's partitions show, merged by the
  naive ``reference_model`` (which shares no code with the state engine).
* ``rows_from_cell_log(table, paths, now)``: the rows and cell times the fast path's cell log gives after the
  state engine's merge, as the pipeline would compute them.
* ``differences(expected, actual)``: readable differences, empty when equal.
"""
from __future__ import annotations

from reference_model import json_table, visible_table

from cdc_lib.celllog.schema import decode_clustering
from cdc_lib.demo.compare import key_json as _key_json
from cdc_lib.demo.compare import select_json, typed_from_driver
from cdc_lib.sinks.avro import to_json_row
from cdc_lib.sstable import SSTable, find_data_files, read_sstable_cell_log


def select_table(session, table, consistency="ONE") -> dict:
    """{key JSON: row JSON} of ``SELECT * FROM table``."""
    return select_json(session, table, consistency)


def _timed_columns(table) -> list:
    return [c for c in table.columns.values() if c.kind in ("static", "regular") and not c.type.multicell
            and c.type.kind != "counter"]


def select_cell_times(session, table, consistency="ONE") -> dict:
    """{key JSON: {column: [WRITETIME(column), TTL(column)]}} of every row, for simple non-key columns that
    have a value."""
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement
    cols = _timed_columns(table)
    if not cols:
        return {}
    keys = table.partition_key + table.clustering
    select = ", ".join([f'"{c.name}"' for c in keys] +
                       [f'WRITETIME("{c.name}"), TTL("{c.name}")' for c in cols])
    rs = session.execute(SimpleStatement(f'SELECT {select} FROM "{table.keyspace}"."{table.name}"',
                                         fetch_size=1000,
                                         consistency_level=getattr(ConsistencyLevel, consistency)))
    types = rs.column_types
    out = {}
    for row in rs:
        key = {c.name: typed_from_driver(c.type, t, v) for c, t, v in zip(keys, types, row)}
        times = {}
        for i, c in enumerate(cols):
            wt, ttl = row[len(keys) + 2 * i], row[len(keys) + 2 * i + 1]
            if wt is not None:
                times[c.name] = [wt, ttl]
        if times:
            out[_key_json(table, key)] = times
    return out


def data_files(paths) -> list:
    return [f for p in paths for f in find_data_files(p)]


def rows_from_mutations(table, paths, now: int, schema=None) -> dict:
    """{key JSON: row JSON} from the reference decoder's partitions (whole partitions, one update each)."""
    mutations = []
    for f in data_files(paths):
        for m in SSTable(f, schema).mutations(rows_per_update=1 << 62):
            assert hasattr(m, "updates"), f"damage in {f}: {m}"
            for u in m.updates:                  # typed with the SSTable's header, keyed by the table's id
                u.table_id = table.id
            mutations.append(m)
    return json_table(table, visible_table(table, mutations, now))


def cell_log_records(paths, schema=None, batch_rows: int = 65536) -> list:
    damage = []
    records = []
    for batch in read_sstable_cell_log(data_files(paths), schema, on_damage=damage.append, batch_rows=batch_rows):
        records += batch.to_pylist()
    assert not damage, damage[:3]
    return records


def rows_from_cell_log(table, paths, now: int, schema=None) -> tuple:
    """({key JSON: row JSON}, {key JSON: {column: [writetime, ttl]}}) after the state engine merged the fast
    path's cell log, as the pipeline would."""
    from cdc_lib.state.batch import process_table
    records = cell_log_records(paths, schema)
    for r in records:
        r["table_id"] = str(table.id)
    rows = {}
    times = {}
    for result in process_table(table, records, {}, now):
        for e in result.events:
            k = _key_json(table, e["key"])
            if e["op"] == "d":
                rows.pop(k, None)
            else:
                rows[k] = to_json_row(table, e["after"])
        times.update(state_cell_times(table, result.partition_key, result.state, now))
    return rows, {k: v for k, v in times.items() if k in rows and v}


def state_cell_times(table, partition_key: bytes, state, now: int) -> dict:
    """{key JSON: {column: [writetime, ttl left at ``now``]}} of one partition's ``state.reconcile.PartitionState``:
    the live simple cells of each row, static cells included (for rows not shown, the caller filters)."""
    timed = {c.name for c in _timed_columns(table)}
    pk_values = _split_key(table, partition_key)
    base = {c.name: c.type.decode(v) for c, v in zip(table.partition_key, pk_values)}
    times = {}
    for ck, row in state.rows.items():
        key = dict(base)
        for c, v in zip(table.clustering, decode_clustering(ck)):
            key[c.name] = c.type.decode(v)
        times[_key_json(table, key)] = _cell_times(row, state.static, timed, now)
    if not state.static.is_empty():                  # the static-only row, if it is the one shown
        key = dict(base, **{c.name: None for c in table.clustering})
        times[_key_json(table, key)] = _cell_times(None, state.static, timed, now)
    return times


def _cell_times(row, static, timed: set, now: int) -> dict:
    out = {}
    for r in (static, row):
        if r is None:
            continue
        for col, cell in r.cells.items():
            ts, ttl, ldt, tomb = cell[0], cell[1], cell[2], cell[3]
            if col in timed and not tomb and (not ttl or now < ldt):
                out[col] = [ts, (ldt - now) if ttl else None]
    return out


def _split_key(table, key: bytes) -> list:
    if len(table.partition_key) == 1:
        return [key]
    from cdc_lib.cql.types import composite_split
    return composite_split(key)


EMPTY_JSON = {"$empty": True}


def _same_value(expected, actual) -> bool:
    # cassandra-driver returns an empty value of a non-string type (e.g. blobAsInt(0x)) as None
    return expected == actual or (expected is None and actual == EMPTY_JSON)


def differences(expected: dict, actual: dict, what: str = "row", ttl_slack: int = 2) -> list:
    """Readable differences between two {key JSON: value} maps. For cell times, TTLs may differ by
    ``ttl_slack`` seconds (TTL() counts down from the query's own clock). An empty value where the driver
    gave null counts as equal (the driver cannot tell them apart)."""
    out = []
    for k in sorted(set(expected) | set(actual)):
        e, a = expected.get(k), actual.get(k)
        if e is None or a is None:
            out.append(f"{what} {k}: expected {e!r}, got {a!r}")
            continue
        if what == "times":
            for col in sorted(set(e) | set(a)):
                ev, av = e.get(col), a.get(col)
                same = ev is not None and av is not None and ev[0] == av[0] and (
                    ev[1] == av[1] or (ev[1] is not None and av[1] is not None and abs(ev[1] - av[1]) <= ttl_slack))
                if not same:
                    out.append(f"times {k} {col}: expected {ev!r}, got {av!r}")
        elif any(not _same_value(e.get(c), a.get(c)) for c in set(e) | set(a)):
            cols = sorted(c for c in set(e) | set(a) if not _same_value(e.get(c), a.get(c)))
            out.append(f"{what} {k}: " + "; ".join(f"{c}: expected {e.get(c)!r}, got {a.get(c)!r}" for c in cols))
    return out
