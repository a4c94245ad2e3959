"""Cassandra as the source of truth: compare what the pipeline wrote with what ``SELECT *`` returns.

Used by the demo's closing check and by the tests against a real cluster (``tests/test_real_cluster.py``):

* ``select_rows(session, table)``: the rows of ``SELECT *`` (consistency ALL by default) as the typed values of
  ``cdc_lib.cql.types``. Driver values are serialized with the driver's own codec and decoded with our codec of
  the column's type, so nothing of the decoder or the state engine is used on this side.
* ``select_json(session, table)``: the same rows in the events' JSON forms, ``{key JSON: row JSON}`` (what a
  consumer replaying the Kafka events must end up with, and the states ``tests/event_invariant.py`` checks
  events against).
* ``compare_state(session, root, tables)``: for each table, the Delta state ``WHERE _cdc_live`` (the typed
  columns, what a user queries) against ``SELECT *``, value for value: the CQL values go through the state
  tables' documented type mapping (``sinks.delta.to_arrow_value``) and both sides through Arrow, so a value the
  Delta table holds differently from what Cassandra returns is a difference. Returns the counts (tables, rows,
  cells) and readable differences.

The typed side decodes the driver's bytes with the same codec the pipeline decodes the commit log with, so a
codec bug would be on both sides. ``compare_state`` therefore also compares every scalar column (text, integers,
floats, blob, uuid, inet, varint, date, time, timestamp, duration) straight from the driver's own Python values
(``native_value``: written from the driver's types, no ``cdc_lib`` code) to what the Delta table holds.
"""
from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Iterable, Optional

PROTOCOL_VERSION = 5


def typed_from_driver(our_type, driver_type, value):
    """A driver value as the value ``cdc_lib.cql.types`` decodes: through the driver's serializer."""
    if value is None:
        return None
    if our_type.kind == "counter":          # CQL returns the total, not the counter context
        return value
    return our_type.freeze().decode(driver_type.serialize(value, PROTOCOL_VERSION))


def _statement(cql: str, consistency):
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement
    level = getattr(ConsistencyLevel, consistency) if isinstance(consistency, str) else consistency
    return SimpleStatement(cql, fetch_size=1000, consistency_level=level)


def select_rows(session, table, consistency="ALL", where: str = "", params=None) -> list:
    """``SELECT * FROM table`` as dicts of typed values (every current column); ``where`` (``"k = %s"``, with
    ``params``) reads some rows only."""
    cql = f'SELECT * FROM "{table.keyspace}"."{table.name}"' + (f" WHERE {where}" if where else "")
    rs = session.execute(_statement(cql, consistency), params)
    names, types = rs.column_names, rs.column_types
    return [{n: typed_from_driver(table.columns[n].type, t, v) for n, t, v in zip(names, types, row)} for row in rs]


def key_json(table, key: dict) -> str:
    """The Kafka key of a row (``sinks.avro.to_json_key``, compact)."""
    from cdc_lib.sinks.avro import to_json_key
    return json.dumps(to_json_key(table, key), separators=(",", ":"), ensure_ascii=False)


def select_json(session, table, consistency="ALL", where: str = "", params=None) -> dict:
    """{key JSON: row JSON} of ``SELECT *`` (``where``: as for ``select_rows``), in the events' JSON forms
    (``sinks.avro.to_json_row``)."""
    from cdc_lib.sinks.avro import to_json_row
    keys = table.partition_key + table.clustering
    return {key_json(table, {c.name: row[c.name] for c in keys}): to_json_row(table, row)
            for row in select_rows(session, table, consistency, where, params)}


def delta_live_rows(root: str, table, storage_options: Optional[dict] = None) -> list:
    """The Delta state table's visible rows (``WHERE _cdc_live``): the typed columns of the table's current
    columns, as Arrow gives them back."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from cdc_lib.sinks.delta import state_table_uri, value_columns
    try:
        dt = DeltaTable(state_table_uri(root, table.keyspace, table.name), storage_options=storage_options or None)
    except TableNotFoundError:
        return []                       # the pipeline never wrote the table: no visible row
    data = dt.to_pyarrow_dataset().to_table(filter=pc.field("_cdc_live"))
    return _to_pylist(data.select([c.name for c in value_columns(table)]))


def _days_for_dates(at):
    """``at`` with every date32 (nested ones too) as int32: Python's date cannot hold CQL's whole date range
    (``'-5877641-06-23'``), the day number can."""
    import pyarrow as pa
    if pa.types.is_date32(at):
        return pa.int32()
    if pa.types.is_map(at):
        return pa.map_(_days_for_dates(at.key_type), _days_for_dates(at.item_type))
    if pa.types.is_list(at) or pa.types.is_large_list(at):
        return pa.list_(_days_for_dates(at.value_type))
    if pa.types.is_struct(at):
        return pa.struct([pa.field(f.name, _days_for_dates(f.type)) for f in at])
    return at


def _to_pylist(data) -> list:
    """Arrow rows as Python values, dates as day numbers (``_days_for_dates``)."""
    import pyarrow as pa
    schema = pa.schema([pa.field(f.name, _days_for_dates(f.type)) for f in data.schema])
    return data.cast(schema).to_pylist()


def _as_arrow_rows(table, rows: list) -> list:
    """Typed CQL rows -> the Python values Arrow gives back for the state table's typed columns."""
    import pyarrow as pa

    from cdc_lib.sinks.delta import arrow_type, to_arrow_value, value_columns
    cols = value_columns(table)
    schema = pa.schema([pa.field(c.name, arrow_type(c.type)) for c in cols])
    data = [{c.name: to_arrow_value(c.type, r.get(c.name)) for c in cols} for r in rows]
    return _to_pylist(pa.Table.from_pylist(data, schema=schema))


def _native_days(v) -> int:
    return v.days_from_epoch if hasattr(v, "days_from_epoch") else (v - datetime.date(1970, 1, 1)).days


# cassandra-driver's value of a scalar CQL type -> the value Arrow gives back for the Delta column (the state
# tables' documented mapping: README, "Delta state tables")
_NATIVE = {
    **dict.fromkeys(("ascii", "text", "varchar", "boolean", "tinyint", "smallint", "int", "bigint", "counter",
                     "double", "float"), lambda v: v),
    "blob": bytes,
    **dict.fromkeys(("uuid", "timeuuid", "inet", "varint"), str),
    "date": _native_days,
    "time": lambda v: v.nanosecond_time if hasattr(v, "nanosecond_time") else int(v),
    "timestamp": lambda v: v.replace(tzinfo=datetime.timezone.utc),
    "duration": lambda v: {"months": v.months, "days": v.days, "nanoseconds": v.nanoseconds},
}


def native_value(kind: str, value):
    """The driver's value of a scalar column as the Delta table should hold it (None when it has none)."""
    return None if value is None else _NATIVE[kind](value)


def select_native(session, table, consistency="ALL") -> list:
    """``SELECT *`` as the driver returns it, scalar columns only, mapped by ``native_value``."""
    rs = session.execute(_statement(f'SELECT * FROM "{table.keyspace}"."{table.name}"', consistency))
    kinds = {c.name: c.type.kind for c in table.columns.values() if c.type.kind in _NATIVE}
    return [{n: native_value(kinds[n], v) for n, v in zip(rs.column_names, row) if n in kinds} for row in rs]


def compare_native(table, native_rows: list, delta_rows: list, out: "Comparison") -> None:
    """The scalar columns of ``SELECT *`` as the driver gives them against the Delta rows (matched by key)."""
    key_columns = table.partition_key + table.clustering
    if any(c.type.kind not in _NATIVE for c in key_columns):
        return                              # rows cannot be matched by driver values: compare_table covers them
    keys = [c.name for c in key_columns]
    actual = {_canon([r[k] for k in keys]): r for r in delta_rows}
    for e in native_rows:
        k = _canon([e[c] for c in keys])
        a = actual.get(k)
        if a is None:
            out.differences.append(f"{table.qualified_name} {k}: missing in Delta (driver values)")
            continue
        for col, value in e.items():
            out.native_cells += 1
            if _canon(value) != _canon(a.get(col)):
                out.differences.append(f"{table.qualified_name} {k} {col}: driver {value!r}, Delta {a.get(col)!r}")


def _canon_default(value):
    if isinstance(value, datetime.datetime):        # the instant, whichever tzinfo object says UTC
        return value.isoformat()
    return repr(value)


def _canon(value) -> str:
    """One string per value, equal exactly when the values are (NaN included, dict order ignored)."""
    return json.dumps(value, sort_keys=True, default=_canon_default, ensure_ascii=False)


@dataclass
class Comparison:
    """What ``compare_state`` compared, and what differed (empty when the state equals ``SELECT *``)."""
    tables: int = 0
    rows: int = 0
    cells: int = 0
    native_cells: int = 0                # scalar values also compared with the driver's own values
    differences: list = field(default_factory=list)
    rows_by_table: dict = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        if self.equal:
            return (f"Delta state equals SELECT * for {self.tables} tables, {self.rows} rows "
                    f"({self.cells} values compared, {self.native_cells} of them also as the driver's own values)")
        shown = "\n  ".join(self.differences[:20])
        more = f"\n  ... {len(self.differences) - 20} more" if len(self.differences) > 20 else ""
        return (f"Delta state differs from SELECT * ({len(self.differences)} differences over {self.tables} tables, "
                f"{self.rows} rows):\n  {shown}{more}")


def compare_table(table, selected: list, delta_rows: list, out: Comparison) -> None:
    """Compare one table's ``SELECT *`` rows (typed) with its Delta visible rows (Arrow values) into ``out``."""
    keys = [c.name for c in table.partition_key + table.clustering]
    expected = {_canon([r[k] for k in keys]): r for r in _as_arrow_rows(table, selected)}
    actual: dict = {}
    for r in delta_rows:
        k = _canon([r[k] for k in keys])
        if k in actual:
            out.differences.append(f"{table.qualified_name} {k}: two visible rows in the Delta table")
        actual[k] = r
    out.tables += 1
    out.rows += len(expected)
    out.rows_by_table[table.qualified_name] = len(expected)
    for k in sorted(set(expected) | set(actual)):
        e, a = expected.get(k), actual.get(k)
        if e is None or a is None:
            out.differences.append(f"{table.qualified_name} {k}: " + ("not in SELECT *, but visible in Delta"
                                                                       if e is None else "missing in Delta"))
            continue
        for col, value in e.items():
            out.cells += 1
            if _canon(value) != _canon(a.get(col)):
                out.differences.append(f"{table.qualified_name} {k} {col}: SELECT * {value!r}, "
                                       f"Delta {a.get(col)!r}")


def compare_state(session, root: str, tables: Iterable, *, storage_options: Optional[dict] = None,
                  consistency="ALL") -> Comparison:
    """Every table's Delta state (``WHERE _cdc_live``) against ``SELECT *`` at ``consistency``."""
    out = Comparison()
    for table in tables:
        delta_rows = delta_live_rows(root, table, storage_options)
        compare_table(table, select_rows(session, table, consistency), delta_rows, out)
        compare_native(table, select_native(session, table, consistency), delta_rows, out)
    return out
