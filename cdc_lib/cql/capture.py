"""Which tables and columns the pipeline captures: the include/exclude settings applied to a ``Schema``.

Cassandra writes every table's mutations into a CDC segment; the pipeline captures tables with ``cdc = true``
(``Schema.captured_tables``), and of those only what these rules let through:

* keyspaces: ``include_keyspaces`` (empty: all) minus ``exclude_keyspaces``;
* tables (``keyspace.table``): ``include_tables`` (empty: all) minus ``exclude_tables``;
* columns (``keyspace.table.column``): ``exclude_columns``.

``CaptureRules.apply`` returns a copy of the schema in which a table the rules leave out has ``cdc = False`` (so
the reader skips its entries like those of any table without CDC, and no state, sweep or snapshot is made of
it) and an excluded column is a column dropped at the end of time: its cells are still typed when a segment is
read (the entry is not damaged), but they are hidden exactly as Cassandra hides a dropped column's, so no state
table, event or Kafka record holds a value of it. A primary-key column cannot be left out (every row needs its
key), and a rule naming a keyspace, table or column the schema does not have is an error: it is almost always a
typo, and a typo in an exclude list would otherwise ship the data it was meant to keep out.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cdc_lib.errors import ConfigError

from .schema import REGULAR, STATIC, DroppedColumn, Schema

# Later than any write: the column's every cell is hidden (dropped_time is in microseconds).
END_OF_TIME_US = (1 << 63) - 1


@dataclass(frozen=True)
class CaptureRules:
    include_keyspaces: tuple = ()
    exclude_keyspaces: tuple = ()
    include_tables: tuple = ()       # "keyspace.table"
    exclude_tables: tuple = ()
    exclude_columns: tuple = ()      # "keyspace.table.column"

    @property
    def empty(self) -> bool:
        return not any(dataclasses.astuple(self))

    def captures(self, keyspace: str, table: str) -> bool:
        name = f"{keyspace}.{table}"
        if self.include_keyspaces and keyspace not in self.include_keyspaces:
            return False
        if keyspace in self.exclude_keyspaces:
            return False
        if self.include_tables and name not in self.include_tables:
            return False
        return name not in self.exclude_tables

    def apply(self, schema: Schema) -> Schema:
        """A copy of ``schema`` with the rules applied (the schema given is not changed)."""
        if self.empty:
            return schema
        self._check_names(schema)
        columns_out: dict = {}
        for spec in self.exclude_columns:
            keyspace, table, column = spec.split(".", 2)
            columns_out.setdefault((keyspace, table), []).append(column)
        out = schema.copy()
        for tid, t in schema.tables.items():
            if not self.captures(t.keyspace, t.name):
                out.tables[tid] = dataclasses.replace(t, cdc=False)
                continue
            gone = columns_out.get((t.keyspace, t.name))
            if not gone:
                continue
            columns = dict(t.columns)
            dropped = dict(t.dropped)
            for name in gone:
                col = columns.pop(name)
                if col.kind not in (REGULAR, STATIC):
                    raise ConfigError(f"exclude_columns {t.keyspace}.{t.name}.{name}: a {col.kind.replace('_', ' ')} "
                                      "column cannot be left out (every row and event needs its primary key)")
                dropped[name] = DroppedColumn(name, col.type, END_OF_TIME_US, col.kind)
            out.tables[tid] = dataclasses.replace(t, columns=columns, dropped=dropped)
        return out

    def _check_names(self, schema: Schema) -> None:
        keyspaces = {t.keyspace for t in schema.tables.values()}
        tables = {f"{t.keyspace}.{t.name}": t for t in schema.tables.values()}
        problems = []
        for setting in ("include_keyspaces", "exclude_keyspaces"):
            problems += [f"{setting}: no keyspace {k!r} in the schema" for k in getattr(self, setting)
                         if k not in keyspaces]
        for setting in ("include_tables", "exclude_tables"):
            problems += [f"{setting}: no table {n!r} in the schema (write keyspace.table)"
                         for n in getattr(self, setting) if n not in tables]
        for spec in self.exclude_columns:
            keyspace, _, rest = spec.partition(".")
            table, _, column = rest.partition(".")
            t = tables.get(f"{keyspace}.{table}")
            if not column:
                problems.append(f"exclude_columns: {spec!r} is not keyspace.table.column")
            elif t is None:
                problems.append(f"exclude_columns: no table {keyspace}.{table!r} in the schema")
            elif column not in t.columns:
                problems.append(f"exclude_columns: table {keyspace}.{table} has no column {column!r}")
        if problems:
            raise ConfigError("capture rules name what the schema does not have:\n  - " + "\n  - ".join(problems))
