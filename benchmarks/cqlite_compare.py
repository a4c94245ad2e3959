"""cqlite-py beside our SSTable reader on the same real Cassandra 5.0 SSTables: MB/s and the values of both.

    .venv/bin/python benchmarks/bench_sstable.py --cqlite KEYSPACE.cql [--expected expected.json] TABLE_DIR...

``cqlite-py`` (PyPI; a Rust reader of Cassandra 5.0 SSTables, no 3.x formats) answers ``SELECT *`` over a table
directory. Our side is what a backfill runs: the fast path's Arrow cell log, merged by the state engine into the
visible rows. Both row sets are put in the events' JSON forms and compared with each other, and with what
Cassandra's own ``SELECT *`` returned when the SSTables were written (``expected.json``, written by the
tests' ``sstable_check``), the truth neither reader has a say in. A table cqlite cannot read is reported with
cqlite's own error, not left out.
"""
from __future__ import annotations

import json
import os
import time

from sstable_check import cell_log_records, data_files, differences, rows_from_cell_log

from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.sinks.avro import to_json_key


def _json_value(value):
    """A cqlite value in the events' JSON forms, for the types these tables hold (blobs as 0x-hex, maps as
    [key, value] pairs); anything else as cqlite gives it."""
    if isinstance(value, (bytes, bytearray)):
        return "0x" + bytes(value).hex()
    if isinstance(value, dict):
        return [[_json_value(k), _json_value(v)] for k, v in value.items()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_value(v) for v in value]
    return value


def cqlite_rows(table, table_dir: str, schema_file: str) -> dict:
    """{key JSON: row JSON} of cqlite's ``SELECT *`` over one table directory."""
    import cqlite
    out = {}
    with cqlite.open(table_dir, schema=schema_file) as db:
        for row in db.execute(f"SELECT * FROM {table.keyspace}.{table.name}"):
            values = {k: _json_value(v) for k, v in row.to_dict().items()}
            key = {c.name: values.get(c.name) for c in table.partition_key + table.clustering}
            # the key in our JSON form, from the JSON values (ints and text: the key types of these tables)
            out[json.dumps(to_json_key(table, key), separators=(",", ":"), ensure_ascii=False)] = values
    return out


def _equal_rows(actual: dict, expected: dict) -> int:
    """Rows of ``expected`` that ``actual`` has with the same values (an empty value where the driver gave null
    counts as equal: ``sstable_check.differences``)."""
    return sum(1 for k in expected if k in actual and not differences({k: expected[k]}, {k: actual[k]}))


def compare(table_dirs: list, schema_file: str, expected_file: str | None, floor) -> None:
    schema = load_cql_schema(schema_file)
    expected = json.load(open(expected_file)) if expected_file else None
    now = expected["now"] if expected else int(time.time())
    print("MB/s of Data.db, wall: floor = read + CRC + decompress; reader = our fast path to the Arrow cell log; "
          "ours = reader + state merge into the visible rows; cqlite = its SELECT * (decode + merge)")
    print(f"{'table':14s} {'MB':>6s} {'floor':>7s} {'reader':>7s} {'ours':>7s} {'cqlite':>7s}  "
          f"{'rows ours/cqlite/SELECT':>24s}  {'equal: ours=SELECT cqlite=SELECT ours=cqlite':>44s}")
    totals = {"reader": 0.0, "ours": 0.0, "cqlite": 0.0, "bytes": 0}
    for d in table_dirs:
        name = os.path.basename(os.path.normpath(d)).split("-")[0]
        table = next(t for t in schema.tables.values() if t.name == name)
        files = data_files([d])
        size = sum(os.path.getsize(f) for f in files)
        t = time.perf_counter()
        floor(files, decompress=True)
        t_floor = time.perf_counter() - t
        t = time.perf_counter()
        cell_log_records([d])
        t_reader = time.perf_counter() - t
        t = time.perf_counter()
        ours, _ = rows_from_cell_log(table, [d], now)
        t_ours = time.perf_counter() - t
        t = time.perf_counter()
        try:
            theirs = cqlite_rows(table, d, schema_file)
            t_theirs, error = time.perf_counter() - t, None
        except Exception as e:  # noqa: BLE001 - cqlite's own error is the figure to report
            theirs, t_theirs, error = None, None, f"{type(e).__name__}: {e}"
        truth = expected["tables"][name]["rows"] if expected and name in expected["tables"] else None

        def mbs(seconds):
            return f"{size / seconds / 1e6:7.1f}" if seconds else f"{'-':>7s}"
        counts = "/".join(str(len(x)) if x is not None else "-" for x in (ours, theirs, truth))
        eq = [f"{_equal_rows(a, b)}/{len(b)}" if a is not None and b is not None else "-"
              for a, b in ((ours, truth), (theirs, truth), (theirs, ours))]
        print(f"{name:14s} {size / 1e6:6.2f} {mbs(t_floor)} {mbs(t_reader)} {mbs(t_ours)} {mbs(t_theirs)}  "
              f"{counts:>24s}  {eq[0]:>14s} {eq[1]:>14s} {eq[2]:>14s}")
        if error:
            print(f"{'':14s} cqlite: {error[:200]}")
        else:
            totals["reader"] += t_reader
            totals["ours"] += t_ours
            totals["cqlite"] += t_theirs
            totals["bytes"] += size
    if totals["bytes"]:
        mb = totals["bytes"] / 1e6
        print(f"on the tables both read ({mb:.2f} MB of Data.db), MB/s wall: reader {mb / totals['reader']:.1f}, "
              f"ours {mb / totals['ours']:.1f}, cqlite {mb / totals['cqlite']:.1f}")
