"""The schema as the commit log itself describes it: ``system_schema`` mutations applied in log order.

Cassandra records every schema change as ordinary mutations of the ``system_schema`` tables, partitioned by
keyspace name: a CREATE TABLE writes the keyspace row, the table row and one row per column; an ALTER
rewrites the table row plus the column rows it changes; DROP TABLE and DROP COLUMN write row deletions;
DROP KEYSPACE deletes the keyspace's partition in every schema table. None of these is a complete
description on its own, so ``SchemaTracker`` keeps a per-keyspace copy of those tables' rows, merges every
update into it the way Cassandra reconciles data (last write wins by timestamp, ties to tombstones;
partition, range and row deletions shadow data at or below their timestamp) and rebuilds the keyspace's
``TableMetadata`` from the live rows (``system_schema.build_keyspace``, shared with ``cdc_lib.cql.schema_from_cluster``).

A keyspace the log touches for the first time is seeded from the base schema (e.g. a CQL file) with rows
older than anything in the log, so an ALTER of a table created before the log began still lands on the
table's full definition.
"""
from __future__ import annotations

import logging
import struct
import uuid
from dataclasses import dataclass
from typing import Iterable, Optional

from cdc_lib.cql.schema import Schema, TableMetadata
from cdc_lib.cql.system_schema import (COLUMNS, DROPPED_COLUMNS, SCHEMA_KEYSPACE, SYSTEM_SCHEMA_DEFINITIONS, TABLES,
                                       TYPES, VIEWS, KeyspaceRows, build_keyspace, keyspace_rows_from_schema,
                                       system_schema_table_name, udt_field_names, with_system_schema)
from cdc_lib.cql.types import read_length_prefixed
from cdc_lib.errors import CqlValueError

from .model import NO_TIMESTAMP, BoundKind, Mutation, PartitionUpdate, RangeTombstoneMarker, Row

log = logging.getLogger(__name__)

# Seed rows sit below every real write: any deletion or write in the log supersedes them.
SEED_TIMESTAMP = NO_TIMESTAMP + 1

# The system_schema tables whose rows make up table and type metadata.
_BUILD_TABLES = (TABLES, VIEWS, COLUMNS, DROPPED_COLUMNS, TYPES)


@dataclass(frozen=True)
class SchemaChange:
    """One change the log made to the schema.

    ``kind`` is one of: table_created, table_dropped, table_altered, column_added, column_dropped,
    column_altered, type_created, type_altered, type_dropped, error (a definition that could not be built;
    the previous one, if any, stays in force). ``name`` is the table or type name, ``detail`` says what.
    """
    kind: str
    keyspace: str
    name: str
    detail: str = ""
    table_id: Optional[uuid.UUID] = None

    @property
    def table(self) -> str:
        """The table (or type) name: an alias of ``name``."""
        return self.name


# ----------------------------------------------------------------------------------------------------------
# Values of system_schema columns. Their types are fixed, so a small codec turns them into the same plain
# Python shapes cassandra-driver returns (str, int, bool, float, UUID, tuple, frozenset, dict; timestamps
# as int milliseconds), which is what build_keyspace reads.
# ----------------------------------------------------------------------------------------------------------

def _collection_items(type_text: str, b: bytes, n_parts: int):
    (count,) = struct.unpack_from(">i", b, 0)
    flat, pos = read_length_prefixed(b, 4, count * n_parts, "element", type_text)
    if pos != len(b):
        raise ValueError("trailing bytes after collection")
    return [flat[i:i + n_parts] for i in range(0, len(flat), n_parts)]


def _text(b):
    return None if b is None else b.decode("utf-8")


def decode_schema_value(type_text: str, b: bytes):
    """Decode a value of one of the CQL types system_schema columns use."""
    if type_text in ("text", "ascii"):
        return b.decode("utf-8")
    if type_text == "blob":
        return bytes(b)
    if not b:
        return None                    # an empty value of a non-text type reads as null
    if type_text == "boolean":
        return b[0] != 0
    if type_text == "int":
        return struct.unpack(">i", b)[0]
    if type_text in ("timestamp", "bigint"):
        return struct.unpack(">q", b)[0]
    if type_text == "double":
        return struct.unpack(">d", b)[0]
    if type_text == "uuid":
        return uuid.UUID(bytes=bytes(b))
    if type_text == "frozen<set<text>>":
        return frozenset(_text(p[0]) for p in _collection_items(type_text, b, 1))
    if type_text == "frozen<list<text>>":
        return tuple(_text(p[0]) for p in _collection_items(type_text, b, 1))
    if type_text == "frozen<list<boolean>>":
        return tuple(None if not p[0] else p[0][0] != 0 for p in _collection_items(type_text, b, 1))
    if type_text == "frozen<map<text, text>>":
        return {_text(k): _text(v) for k, v in _collection_items(type_text, b, 2)}
    if type_text == "frozen<map<text, blob>>":
        return {_text(k): v for k, v in _collection_items(type_text, b, 2)}
    raise ValueError(f"no system_schema codec for {type_text}")


_COLUMN_TYPES = {name: dict(cols) for name, (cols, _, _) in SYSTEM_SCHEMA_DEFINITIONS.items()}
_CLUSTERING = {name: ck for name, (_, _, ck) in SYSTEM_SCHEMA_DEFINITIONS.items()}


# ----------------------------------------------------------------------------------------------------------
# The materialised rows of one system_schema table's partition (one keyspace).
# ----------------------------------------------------------------------------------------------------------

class _RowState:
    __slots__ = ("liveness", "deletion", "cells")

    def __init__(self):
        self.liveness = NO_TIMESTAMP
        self.deletion = NO_TIMESTAMP
        self.cells = {}                # column -> (timestamp, is_tombstone, raw bytes or None, value)

    def merge_cell(self, column: str, ts: int, tombstone: bool, raw: Optional[bytes], value) -> None:
        old = self.cells.get(column)
        if old is not None:
            ots, otomb, oraw = old[0], old[1], old[2]
            # Cassandra's Cells.reconcile: higher timestamp wins; on a tie a tombstone wins, then the
            # greater value (so every replica, and this copy, converge whatever the arrival order).
            if ts < ots:
                return
            if ts == ots:
                if otomb and not tombstone:
                    return
                if otomb == tombstone and (oraw or b"") >= (raw or b""):
                    return
        self.cells[column] = (ts, tombstone, raw, value)


def _compare_prefix(key: tuple, prefix: tuple) -> int:
    for a, b in zip(key, prefix):
        if a == b:
            continue
        if a is None:
            return -1
        if b is None:
            return 1
        return -1 if a < b else 1
    return 0


class _Range:
    __slots__ = ("start", "start_inclusive", "end", "end_inclusive", "timestamp")

    def __init__(self, start, start_inclusive, end, end_inclusive, timestamp):
        self.start, self.start_inclusive = start, start_inclusive
        self.end, self.end_inclusive = end, end_inclusive
        self.timestamp = timestamp

    def covers(self, key: tuple) -> bool:
        c = _compare_prefix(key, self.start)
        if c < 0 or (c == 0 and self.start and not self.start_inclusive):
            return False
        c = _compare_prefix(key, self.end)
        if c > 0 or (c == 0 and self.end and not self.end_inclusive):
            return False
        return True


class _PartitionState:
    __slots__ = ("deletion", "ranges", "rows")

    def __init__(self):
        self.deletion = NO_TIMESTAMP
        self.ranges = []
        self.rows = {}                 # clustering key (decoded values) -> _RowState

    def row(self, key: tuple) -> _RowState:
        r = self.rows.get(key)
        if r is None:
            r = self.rows[key] = _RowState()
        return r

    def live_rows(self, keyspace: str, table: str) -> list:
        ck_names = _CLUSTERING[table]
        out = []
        for key, row in self.rows.items():
            shadow = max([self.deletion, row.deletion]
                         + [r.timestamp for r in self.ranges if r.covers(key)])
            values = {c: v[3] for c, v in row.cells.items() if not v[1] and v[0] > shadow}
            if row.liveness <= shadow and not values:
                continue
            values["keyspace_name"] = keyspace
            values.update(zip(ck_names, key))
            out.append(values)
        return out


class _KeyspaceState:
    __slots__ = ("name", "partitions")

    def __init__(self, name: str):
        self.name = name
        self.partitions = {t: _PartitionState() for t in SYSTEM_SCHEMA_DEFINITIONS}

    def seed(self, rows: KeyspaceRows) -> None:
        for table in _BUILD_TABLES:
            ck = _CLUSTERING[table]
            part = self.partitions[table]
            for r in getattr(rows, table):
                state = part.row(tuple(r[c] for c in ck))
                state.liveness = max(state.liveness, SEED_TIMESTAMP)
                for col, value in r.items():
                    if col != "keyspace_name" and col not in ck:
                        state.merge_cell(col, SEED_TIMESTAMP, False, None, value)

    def rows(self) -> KeyspaceRows:
        out = KeyspaceRows(self.name)
        for table in _BUILD_TABLES:
            setattr(out, table, self.partitions[table].live_rows(self.name, table))
        return out


def _decode_clustering(table: str, values: tuple) -> tuple:
    types = _COLUMN_TYPES[table]
    return tuple(None if v is None else decode_schema_value(types[c], v)
                 for c, v in zip(_CLUSTERING[table], values))


def _apply_update(part: _PartitionState, table: str, update: PartitionUpdate) -> None:
    if update.partition_deletion is not None and not update.partition_deletion.is_live:
        part.deletion = max(part.deletion, update.partition_deletion.marked_for_delete_at)
    types = _COLUMN_TYPES[table]
    open_start = None                  # (prefix, inclusive, timestamp) of a range tombstone being read
    rows = list(update.unfiltereds)
    if update.static_row is not None:
        rows.insert(0, update.static_row)
    for u in rows:
        if isinstance(u, RangeTombstoneMarker):
            prefix = _decode_clustering(table, u.clustering)
            kind = u.kind
            if kind.is_start:
                open_start = (prefix, kind == BoundKind.INCL_START_BOUND, u.deletion.marked_for_delete_at)
            elif kind.is_end:
                if open_start is not None:
                    part.ranges.append(_Range(open_start[0], open_start[1], prefix,
                                              kind == BoundKind.INCL_END_BOUND, open_start[2]))
                open_start = None
            else:                      # a boundary closes one range and opens the next at the same prefix
                closes_inclusive = kind == BoundKind.INCL_END_EXCL_START_BOUNDARY
                if open_start is not None:
                    part.ranges.append(_Range(open_start[0], open_start[1], prefix, closes_inclusive,
                                              u.end_deletion.marked_for_delete_at))
                open_start = (prefix, not closes_inclusive, u.start_deletion.marked_for_delete_at)
            continue
        if not isinstance(u, Row):
            continue
        key = () if u.is_static else _decode_clustering(table, u.clustering)
        state = part.row(key)
        if u.liveness is not None:
            state.liveness = max(state.liveness, u.liveness.timestamp)
        if u.deletion is not None and not u.deletion.is_live:
            state.deletion = max(state.deletion, u.deletion.marked_for_delete_at)
        for cell in u.cells:
            if cell.path is not None:  # system_schema has no non-frozen collections
                continue
            type_text = types.get(cell.column)
            if cell.is_tombstone:
                value = None
            elif type_text is None:    # a column this union does not know: keep the bytes
                value = cell.value
            else:
                value = decode_schema_value(type_text, cell.value)
            state.merge_cell(cell.column, cell.timestamp, cell.is_tombstone, cell.value, value)
    if open_start is not None:         # an unterminated range reaches the end of the partition
        part.ranges.append(_Range(open_start[0], open_start[1], (), True, open_start[2]))


# ----------------------------------------------------------------------------------------------------------
# Comparing metadata, to say what changed.
# ----------------------------------------------------------------------------------------------------------

def _column_sig(c) -> tuple:
    # The type object, not only its CQL text: ``ALTER TYPE ... ADD`` changes the fields of a UDT that a column
    # names by the same text (``list<frozen<inner>>``), and its values must then decode with the new fields.
    return (c.name, c.type.cql, c.type, c.kind, c.position, c.reversed)


def _table_sig(t: TableMetadata) -> tuple:
    # key columns by position; other columns as a set (sources differ in their order, Cassandra does not care)
    return (t.id, t.flags, t.cdc, t.gc_grace_seconds, tuple(_column_sig(c) for c in t.partition_key + t.clustering),
            tuple(sorted(_column_sig(c) for c in t.columns.values())),
            tuple(sorted((d.name, d.type.cql, d.dropped_time, d.kind) for d in t.dropped.values())))


def _type_sig(t) -> tuple:
    return (tuple(udt_field_names(t)), tuple(s.cql for s in t.subtypes), t.cql)


def _table_changes(ks: str, old: Optional[TableMetadata], new: Optional[TableMetadata]) -> list:
    if old is None:
        cols = ", ".join(f"{c.name} {c.type.cql} {c.kind}" for c in new.columns.values())
        return [SchemaChange("table_created", ks, new.name, f"id {new.id}: {cols}", new.id)]
    if new is None:
        return [SchemaChange("table_dropped", ks, old.name, f"id {old.id}", old.id)]
    if old.id != new.id:               # dropped and re-created under the same name
        return _table_changes(ks, old, None) + _table_changes(ks, None, new)
    out = []
    for name, c in new.columns.items():
        before = old.columns.get(name)
        if before is None:
            out.append(SchemaChange("column_added", ks, new.name, f"{name} {c.type.cql} {c.kind}", new.id))
        elif _column_sig(before) != _column_sig(c):
            detail = f"{name}: {before.type.cql} {before.kind} -> {c.type.cql} {c.kind}"
            if before.type.cql == c.type.cql and before.type != c.type:
                detail = f"{name} {c.type.cql}: a user type it uses changed"
            out.append(SchemaChange("column_altered", ks, new.name, detail, new.id))
    for name, c in old.columns.items():
        if name not in new.columns:
            d = new.dropped.get(name)
            when = f" at {d.dropped_time}" if d is not None else ""
            out.append(SchemaChange("column_dropped", ks, new.name, f"{name} {c.type.cql}{when}", new.id))
    if (old.flags, old.cdc, old.gc_grace_seconds) != (new.flags, new.cdc, new.gc_grace_seconds):
        out.append(SchemaChange("table_altered", ks, new.name,
                                f"flags {sorted(new.flags)} cdc {new.cdc} gc_grace_seconds {new.gc_grace_seconds}",
                                new.id))
    elif not out:
        out.append(SchemaChange("table_altered", ks, new.name, "dropped-column records changed", new.id))
    return out


class SchemaTracker:
    """The schema in force at each point of a commit log: feed it every decoded mutation, in log order.

    ``schema`` is replaced (never mutated) whenever a system_schema mutation changes something, so a
    Schema handed out earlier stays valid for the mutations it was used on.
    """

    def __init__(self, base: Optional[Schema] = None):
        self.schema: Schema = with_system_schema(base)
        self._keyspaces: dict = {}     # keyspace name -> _KeyspaceState
        self._problems: dict = {}      # keyspace name -> problems already reported (said once, not per mutation)

    def observe(self, mutation: Mutation) -> list:
        """Apply ``mutation`` if it writes system_schema; returns the SchemaChanges it made (often none)."""
        touched = []
        for update in mutation.updates:
            table = system_schema_table_name(update.table_id)
            if table is None:
                continue
            try:
                keyspace = update.partition_key.decode("utf-8")
            except UnicodeDecodeError:
                log.warning("system_schema.%s update with a non-UTF-8 keyspace key %r", table, update.partition_key)
                continue
            if keyspace == SCHEMA_KEYSPACE:    # its own tables are hard-coded: rows of them change nothing
                continue
            state = self._keyspaces.get(keyspace)
            if state is None:
                state = self._keyspaces[keyspace] = _KeyspaceState(keyspace)
                state.seed(keyspace_rows_from_schema(self.schema, keyspace))
            try:
                _apply_update(state.partitions[table], table, update)
            except (ValueError, struct.error, UnicodeDecodeError, CqlValueError) as e:
                where = f" at {mutation.segment}@{mutation.position}" if mutation.segment else ""
                log.warning("undecodable system_schema.%s value for keyspace %s%s: %s", table, keyspace, where, e)
                touched.append(keyspace)
                continue
            if keyspace not in touched:
                touched.append(keyspace)
        changes = []
        for keyspace in touched:
            changes.extend(self._rebuild(keyspace))
        return changes

    def observe_all(self, mutations: Iterable[Mutation]) -> list:
        """Observe several mutations in order; all their changes."""
        out = []
        for m in mutations:
            out.extend(self.observe(m))
        return out

    def _rebuild(self, keyspace: str) -> list:
        state = self._keyspaces[keyspace]
        built = build_keyspace(state.rows())
        old_tables = {t.name: t for t in self.schema.tables.values() if t.keyspace == keyspace}
        old_types = {n: t for (ks, n), t in self.schema.types.items() if ks == keyspace}
        changes = []
        new_tables = dict(built.tables)
        new_types = dict(built.types)
        reported = self._problems.get(keyspace, set())
        self._problems[keyspace] = set(built.problems)
        for what, name, reason in built.problems:
            if (what, name, reason) not in reported:
                changes.append(SchemaChange("error", keyspace, name, reason))
                log.warning("schema from the commit log: %s", reason)
            # a definition we cannot build keeps its previous form rather than vanishing
            if what == "table" and name in old_tables:
                new_tables[name] = old_tables[name]
            elif what == "type" and name in old_types:
                new_types[name] = old_types[name]
        for name in sorted(set(old_types) | set(new_types)):
            a, b = old_types.get(name), new_types.get(name)
            if a is None:
                changes.append(SchemaChange("type_created", keyspace, name, b.cql))
            elif b is None:
                changes.append(SchemaChange("type_dropped", keyspace, name, a.cql))
            elif _type_sig(a) != _type_sig(b):
                changes.append(SchemaChange("type_altered", keyspace, name, f"{a.cql} -> {b.cql}"))
            else:
                new_types[name] = a
        for name in sorted(set(old_tables) | set(new_tables)):
            a, b = old_tables.get(name), new_tables.get(name)
            if a is not None and b is not None and _table_sig(a) == _table_sig(b):
                new_tables[name] = a   # unchanged: keep the very object others may hold
                continue
            changes.extend(_table_changes(keyspace, a, b))
        if not any(c.kind != "error" for c in changes):
            return changes
        schema = Schema({tid: t for tid, t in self.schema.tables.items() if t.keyspace != keyspace},
                        {k: t for k, t in self.schema.types.items() if k[0] != keyspace})
        for t in new_tables.values():
            schema.tables[t.id] = t
        for n, t in new_types.items():
            schema.types[(keyspace, n)] = t
        self.schema = schema
        for c in changes:
            log.info("schema change from the commit log: %s %s.%s %s", c.kind, c.keyspace, c.name, c.detail)
        return changes

    def decode(self, data: bytes, messaging_version: int = 12, *, source: Optional[str] = None,
               position: Optional[int] = None, base_position: int = 0) -> tuple:
        """Decode one commit-log entry with the schema in force, then observe it: (mutation, changes).

        Decoding errors (``UnknownTableError`` for tables no schema knows, ...) propagate unchanged.
        """
        from .mutation import decode_mutation
        m = decode_mutation(data, self.schema, messaging_version, source=source, base_position=base_position)
        m.segment = source if m.segment is None else m.segment
        if position is not None:
            m.position = position
        return m, self.observe(m)
