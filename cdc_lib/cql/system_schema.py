"""The ``system_schema`` keyspace: its own (fixed) tables, and the one place that turns its rows into metadata.

Two schema sources read the same rows: ``schema_from_cluster`` gets them from a live cluster through
cassandra-driver, ``cdc_lib.commitlog.schema_from_log`` rebuilds them from ``system_schema`` mutations found in the commit log.
Both hand rows (mappings of column name to Python value, shaped like ``SELECT * FROM system_schema.X``) to
``build_keyspace``, so there is a single truth for "rows -> TableMetadata".

The tables of ``system_schema`` itself never appear as rows anyone can trust across versions, so their
metadata is hard-coded here: the union of the columns of Cassandra 3.0, 3.11, 4.0, 4.1 and 5.0 (taken from
``SchemaKeyspace.java`` of each branch). A superset is safe for decoding: mutations name the columns they
carry, and a column the running version does not have is simply never named. Their table ids are
deterministic (``TableId.forSystemTable``): ``UUID.nameUUIDFromBytes(keyspace + table)``, an MD5 (type 3)
UUID of the UTF-8 bytes of both names concatenated.
"""
from __future__ import annotations

import datetime
import hashlib
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Mapping, Optional

from cdc_lib.errors import CdcError, SchemaError

from .schema import (CLUSTERING, DEFAULT_GC_GRACE_SECONDS, PARTITION_KEY, REGULAR, STATIC, ColumnMetadata,
                     DroppedColumn, Schema, TableMetadata)

SCHEMA_KEYSPACE = "system_schema"

KEYSPACES = "keyspaces"
TABLES = "tables"
COLUMNS = "columns"
DROPPED_COLUMNS = "dropped_columns"
TRIGGERS = "triggers"
VIEWS = "views"
TYPES = "types"
FUNCTIONS = "functions"
AGGREGATES = "aggregates"
INDEXES = "indexes"
COLUMN_MASKS = "column_masks"

_KIND_NAMES = {PARTITION_KEY, CLUSTERING, REGULAR, STATIC}

# system_schema stores dropped_time in milliseconds while DroppedColumn keeps microseconds; rows made from
# metadata (keyspace_rows_from_schema) carry the exact microseconds under this extra key.
DROPPED_TIME_MICROS = "_dropped_time_micros"


def name_uuid_from_bytes(data: bytes) -> uuid.UUID:
    """Java's ``UUID.nameUUIDFromBytes``: MD5 of the bytes with version 3 and the IETF variant set."""
    return uuid.UUID(bytes=hashlib.md5(data).digest(), version=3)


def system_table_id(keyspace: str, table: str) -> uuid.UUID:
    """``TableId.forSystemTable`` (also 3.x ``CFMetaData``'s id of a compiled system table)."""
    return name_uuid_from_bytes(keyspace.encode("utf-8") + table.encode("utf-8"))


# Cassandra's own keyspaces (3.0 to 5.0): never user data, and CDC cannot be enabled on their tables.
SYSTEM_KEYSPACES = frozenset({"system", "system_schema", "system_auth", "system_distributed", "system_traces",
                              "system_views", "system_virtual_schema", "system_cluster_metadata"})


def is_system_table_id(table_id: uuid.UUID) -> bool:
    """Whether a table id is one Cassandra gives its own tables, even when no schema describes the table.

    Cassandra's tables have name-based (version 3) ids (``system_table_id``); a user table gets a time-based
    (version 1) id when it is created (``TableId.generate``, 3.x ``UUIDGen.getTimeUUID``). The commit log holds
    ``system.local``, ``system.compaction_history``, ``system.sstable_activity``... which no user schema lists.
    """
    return table_id.version == 3


# What a table lookup gives for a system table id (``is_system_table_id``) the schema does not describe: its
# entries are skipped as system data, not reported as an unknown table. Shared by both cell-log readers.
SYSTEM_TABLE_NOT_IN_SCHEMA = object()


# ----------------------------------------------------------------------------------------------------------
# The tables of system_schema, as (column, CQL type) lists with their primary keys.
# Every table is partitioned by keyspace_name: one keyspace's schema is one partition of each table.
# ----------------------------------------------------------------------------------------------------------

_MAP_TT = "frozen<map<text, text>>"

# Table parameters shared by ``tables`` and ``views``; the version that added a column is noted.
_TABLE_PARAMS = (
    ("additional_write_policy", "text"),          # 4.0
    ("allow_auto_snapshot", "boolean"),           # 5.0
    ("automated_repair_full", _MAP_TT),           # 5.1/trunk
    ("automated_repair_incremental", _MAP_TT),    # 5.1/trunk
    ("bloom_filter_fp_chance", "double"),
    ("caching", _MAP_TT),
    ("cdc", "boolean"),                           # 3.8
    ("comment", "text"),
    ("compaction", _MAP_TT),
    ("compression", _MAP_TT),
    ("crc_check_chance", "double"),
    ("dclocal_read_repair_chance", "double"),     # kept for drivers in 4.0+
    ("default_time_to_live", "int"),
    ("extensions", "frozen<map<text, blob>>"),
    ("gc_grace_seconds", "int"),
    ("id", "uuid"),
    ("incremental_backups", "boolean"),           # 5.0
    ("max_index_interval", "int"),
    ("memtable", "text"),                         # 4.1
    ("memtable_flush_period_in_ms", "int"),
    ("min_index_interval", "int"),
    ("read_repair", "text"),                      # 4.0
    ("read_repair_chance", "double"),             # kept for drivers in 4.0+
    ("speculative_retry", "text"),
)

# name -> (columns, partition key column names, clustering column names)
SYSTEM_SCHEMA_DEFINITIONS: dict = {
    KEYSPACES: ((("keyspace_name", "text"), ("durable_writes", "boolean"), ("replication", _MAP_TT)),
                ("keyspace_name",), ()),
    TABLES: ((("keyspace_name", "text"), ("table_name", "text"), ("flags", "frozen<set<text>>"))
             + _TABLE_PARAMS,
             ("keyspace_name",), ("table_name",)),
    COLUMNS: ((("keyspace_name", "text"), ("table_name", "text"), ("column_name", "text"),
               ("clustering_order", "text"), ("column_name_bytes", "blob"), ("kind", "text"),
               ("position", "int"), ("type", "text")),
              ("keyspace_name",), ("table_name", "column_name")),
    DROPPED_COLUMNS: ((("keyspace_name", "text"), ("table_name", "text"), ("column_name", "text"),
                       ("dropped_time", "timestamp"), ("kind", "text"),   # kind: 3.11.x/4.0
                       ("type", "text")),
                      ("keyspace_name",), ("table_name", "column_name")),
    TRIGGERS: ((("keyspace_name", "text"), ("table_name", "text"), ("trigger_name", "text"),
                ("options", _MAP_TT)),
               ("keyspace_name",), ("table_name", "trigger_name")),
    VIEWS: ((("keyspace_name", "text"), ("view_name", "text"), ("base_table_id", "uuid"),
             ("base_table_name", "text"), ("where_clause", "text"), ("include_all_columns", "boolean"))
            + _TABLE_PARAMS,
            ("keyspace_name",), ("view_name",)),
    TYPES: ((("keyspace_name", "text"), ("type_name", "text"), ("field_names", "frozen<list<text>>"),
             ("field_types", "frozen<list<text>>")),
            ("keyspace_name",), ("type_name",)),
    FUNCTIONS: ((("keyspace_name", "text"), ("function_name", "text"), ("argument_types", "frozen<list<text>>"),
                 ("argument_names", "frozen<list<text>>"), ("body", "text"), ("language", "text"),
                 ("return_type", "text"), ("called_on_null_input", "boolean")),
                ("keyspace_name",), ("function_name", "argument_types")),
    AGGREGATES: ((("keyspace_name", "text"), ("aggregate_name", "text"), ("argument_types", "frozen<list<text>>"),
                  ("final_func", "text"), ("initcond", "text"), ("return_type", "text"),
                  ("state_func", "text"), ("state_type", "text")),
                 ("keyspace_name",), ("aggregate_name", "argument_types")),
    INDEXES: ((("keyspace_name", "text"), ("table_name", "text"), ("index_name", "text"), ("kind", "text"),
               ("options", _MAP_TT)),
              ("keyspace_name",), ("table_name", "index_name")),
    COLUMN_MASKS: ((("keyspace_name", "text"), ("table_name", "text"), ("column_name", "text"),  # 5.0
                    ("function_keyspace", "text"), ("function_name", "text"),
                    ("function_argument_types", "frozen<list<text>>"),
                    ("function_argument_values", "frozen<list<text>>"),
                    ("function_argument_nulls", "frozen<list<boolean>>")),
                   ("keyspace_name",), ("table_name", "column_name")),
}


def define_table(keyspace: str, name: str, columns: Iterable, partition_key: Iterable[str],
                 clustering: Iterable[str] = (), table_id: Optional[uuid.UUID] = None,
                 flags: Iterable[str] = ("compound",)) -> TableMetadata:
    """A TableMetadata from (column, CQL type) pairs and key column names (for hard-coded system tables)."""
    from .types import parse_type
    partition_key = list(partition_key)
    clustering = list(clustering)
    cols = {}
    pk, ck = [], []
    for col_name, type_text in columns:
        ctype = parse_type(type_text, keyspace, {})
        if col_name in partition_key:
            c = ColumnMetadata(col_name, ctype, PARTITION_KEY, partition_key.index(col_name))
            pk.append(c)
        elif col_name in clustering:
            c = ColumnMetadata(col_name, ctype, CLUSTERING, clustering.index(col_name))
            ck.append(c)
        else:
            c = ColumnMetadata(col_name, ctype, REGULAR)
        cols[col_name] = c
    pk.sort(key=lambda c: c.position)
    ck.sort(key=lambda c: c.position)
    ordered = {c.name: c for c in pk + ck}
    ordered.update((n, c) for n, c in cols.items() if n not in ordered)
    return TableMetadata(keyspace, name, table_id or system_table_id(keyspace, name), pk, ck, ordered,
                         flags=frozenset(flags))


@lru_cache(maxsize=None)
def _system_schema_tables() -> tuple:
    return tuple(define_table(SCHEMA_KEYSPACE, name, cols, pk, ck)
                 for name, (cols, pk, ck) in SYSTEM_SCHEMA_DEFINITIONS.items())


def system_schema_tables() -> dict:
    """name -> TableMetadata of every system_schema table (a fresh dict; the metadata objects are shared)."""
    return {t.name: t for t in _system_schema_tables()}


SYSTEM_SCHEMA_IDS: dict = {system_table_id(SCHEMA_KEYSPACE, n): n for n in SYSTEM_SCHEMA_DEFINITIONS}


def system_schema_table_name(table_id: uuid.UUID) -> Optional[str]:
    """The system_schema table a table id belongs to, or None."""
    return SYSTEM_SCHEMA_IDS.get(table_id)


def with_system_schema(schema: Optional[Schema]) -> Schema:
    """A copy of ``schema`` (or an empty one) that also knows every system_schema table."""
    out = schema.copy() if schema is not None else Schema()
    for t in _system_schema_tables():
        out.tables[t.id] = t
    return out


# ----------------------------------------------------------------------------------------------------------
# Rows -> metadata. A row is any mapping of column name -> Python value, as cassandra-driver returns them
# (uuid.UUID, str, int, bool, list/tuple, set/SortedSet, datetime for timestamps) or as schema_log decodes
# them (the same, with timestamps as int milliseconds).
# ----------------------------------------------------------------------------------------------------------

@dataclass
class KeyspaceRows:
    """The system_schema rows of one keyspace (each list holds rows of that table for this keyspace)."""
    keyspace: str
    tables: list = field(default_factory=list)
    views: list = field(default_factory=list)
    columns: list = field(default_factory=list)
    dropped_columns: list = field(default_factory=list)
    types: list = field(default_factory=list)

    def add(self, table: str, row: Mapping) -> None:
        getattr(self, table).append(row)


@dataclass
class BuiltKeyspace:
    """What ``build_keyspace`` made of a keyspace's rows; ``problems`` names what could not be built."""
    keyspace: str
    tables: dict = field(default_factory=dict)     # name -> TableMetadata (tables and materialized views)
    types: dict = field(default_factory=dict)      # type name -> UDT CqlType
    problems: list = field(default_factory=list)   # [(what: "table"|"type", name, reason)] left out


def timestamp_millis(value) -> int:
    """A CQL ``timestamp`` as milliseconds since the epoch (from a driver datetime or an int)."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:                     # the driver returns naive UTC datetimes
            value = value.replace(tzinfo=datetime.timezone.utc)
        delta = value - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
        return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000
    return int(value)


def _as_uuid(value) -> Optional[uuid.UUID]:
    if value is None or isinstance(value, uuid.UUID):
        return value
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return uuid.UUID(bytes=bytes(value))
    return uuid.UUID(str(value))


def parse_column_type(type_text: str, keyspace: str, udts: Mapping):
    """The CqlType of a ``system_schema.columns.type`` (or dropped/field type) string; SchemaError if not."""
    # 3.x writes custom (marshal class) types as quoted literals ('org.apache...EmptyType'); parse_type
    # reads those, marshal strings and CQL alike.
    from .types import parse_type
    try:
        return parse_type(type_text, keyspace, udts)
    except CdcError as e:
        if isinstance(e, SchemaError):
            raise
        raise SchemaError(f"cannot parse type {type_text!r}: {e}") from e
    except (ValueError, KeyError, TypeError) as e:
        raise SchemaError(f"cannot parse type {type_text!r}: {e}") from e


def build_types(keyspace: str, type_rows: Iterable[Mapping], problems: list,
                known: Optional[Mapping] = None) -> dict:
    """UDTs of a keyspace from system_schema.types rows, resolving types that use other types first."""
    from .types import udt_type
    pending = {}
    for row in type_rows:
        name = row.get("type_name")
        if name is None:
            continue
        pending[name] = (list(row.get("field_names") or ()), list(row.get("field_types") or ()))
    built: dict = {}
    last_error: dict = {}
    while pending:
        progress = False
        for name in list(pending):
            field_names, field_texts = pending[name]
            udts = _udt_lookup(keyspace, {**(known or {}), **built})
            try:
                field_types = [parse_column_type(t, keyspace, udts) for t in field_texts]
            except SchemaError as e:       # may name a type not built yet: retry after the others
                last_error[name] = e
                continue
            built[name] = udt_type(keyspace, name, field_names, field_types, False)
            del pending[name]
            progress = True
        if not progress:
            break
    for name in pending:
        problems.append(("type", name, f"type {keyspace}.{name}: {last_error.get(name)}"))
    return built


def _udt_lookup(keyspace: str, by_name: Mapping) -> dict:
    """The ``udts`` mapping parse_type takes: (keyspace, name) -> UDT type (see cqltypes.parse_type)."""
    return {(keyspace, n): t for n, t in by_name.items()}


def build_table(keyspace: str, table_row: Mapping, column_rows: Iterable[Mapping],
                dropped_rows: Iterable[Mapping], udts: Mapping, *, is_view: bool = False) -> TableMetadata:
    """One TableMetadata from its system_schema.tables (or views) row, columns and dropped_columns rows."""
    from .types import marshal_is_reversed
    name = table_row.get("view_name" if is_view else "table_name")
    qualified = f"{keyspace}.{name}"
    table_id = _as_uuid(table_row.get("id"))
    if table_id is None:
        raise SchemaError(f"{qualified}: system_schema row has no table id")
    # Views are always CQL (compound, non-dense) tables; their row has no flags column.
    flags = frozenset(str(f).lower() for f in (table_row.get("flags") or ())) if not is_view \
        else frozenset({"compound"})
    pk, ck, others = [], [], []
    for row in column_rows:
        col_name = row.get("column_name")
        kind = str(row.get("kind") or "").lower()
        if col_name is None or kind not in _KIND_NAMES:
            raise SchemaError(f"{qualified}: column row {col_name!r} has unknown kind {row.get('kind')!r}")
        type_text = row.get("type")
        if type_text is None:
            raise SchemaError(f"{qualified}.{col_name}: column row has no type")
        ctype = parse_column_type(type_text, keyspace, udts)
        position = row.get("position")
        position = -1 if position is None else int(position)
        order = str(row.get("clustering_order") or "none").lower()
        # DESC is the clustering_order column; a migrated pre-3.0 type may still spell it ReversedType(...)
        entry = (position, col_name, ctype, kind, order == "desc" or marshal_is_reversed(type_text))
        (pk if kind == PARTITION_KEY else ck if kind == CLUSTERING else others).append(entry)
    if not pk:
        raise SchemaError(f"{qualified}: no partition key column")
    pk.sort(key=lambda e: (e[0], e[1]))
    ck.sort(key=lambda e: (e[0], e[1]))
    for group, what in ((pk, "partition key"), (ck, "clustering")):
        positions = [e[0] for e in group]
        # 3.x/4.x write 0..n-1; a gap means rows are missing (e.g. a partial ALTER seen without its CREATE)
        if positions != list(range(len(group))) and not (len(group) == 1 and positions[0] == -1):
            raise SchemaError(f"{qualified}: {what} positions {positions} are not 0..{len(group) - 1}")
    partition_key = [ColumnMetadata(n, t, PARTITION_KEY, i) for i, (_, n, t, _, _) in enumerate(pk)]
    clustering = [ColumnMetadata(n, t, CLUSTERING, i, rev) for i, (_, n, t, _, rev) in enumerate(ck)]
    columns = {c.name: c for c in partition_key + clustering}
    for kind in (STATIC, REGULAR):
        for _, n, t, k, _ in sorted((e for e in others if e[3] == kind), key=lambda e: e[1]):
            columns[n] = ColumnMetadata(n, t, k)
    dropped = {}
    for row in dropped_rows:
        col_name = row.get("column_name")
        if col_name is None or row.get("type") is None:
            continue
        # Dropped types never name UDTs (Cassandra expands them to tuples before storing), but be lenient.
        ctype = parse_column_type(row["type"], keyspace, udts)
        when = row.get("dropped_time")
        millis = timestamp_millis(when) if when is not None else 0
        micros = row.get(DROPPED_TIME_MICROS)     # exact value kept when rows were made from metadata,
        if micros is None or micros // 1000 != millis:   # unless dropped_time was rewritten since
            micros = millis * 1000
        kind = str(row.get("kind") or REGULAR).lower()
        dropped[col_name] = DroppedColumn(col_name, ctype, micros, STATIC if kind == STATIC else REGULAR)
    gc_grace = table_row.get("gc_grace_seconds")
    return TableMetadata(keyspace, name, table_id, partition_key, clustering, columns, dropped, flags,
                         bool(table_row.get("cdc") or False),
                         DEFAULT_GC_GRACE_SECONDS if gc_grace is None else int(gc_grace))


def build_keyspace(rows: KeyspaceRows, known_types: Optional[Mapping] = None) -> BuiltKeyspace:
    """Every table, view and UDT of one keyspace from its system_schema rows.

    A table that cannot be built (missing rows, unparseable type) is left out and named in ``problems``
    rather than failing the keyspace: one bad definition must not hide every other table.
    """
    ks = rows.keyspace
    out = BuiltKeyspace(ks)
    out.types = build_types(ks, rows.types, out.problems, known_types)
    udts = _udt_lookup(ks, {**(known_types or {}), **out.types})
    columns_by_table: dict = {}
    for row in rows.columns:
        columns_by_table.setdefault(row.get("table_name"), []).append(row)
    dropped_by_table: dict = {}
    for row in rows.dropped_columns:
        dropped_by_table.setdefault(row.get("table_name"), []).append(row)
    for is_view, table_rows in ((False, rows.tables), (True, rows.views)):
        for trow in table_rows:
            name = trow.get("view_name" if is_view else "table_name")
            if name is None:
                continue
            try:
                out.tables[name] = build_table(ks, trow, columns_by_table.get(name, ()),
                                               dropped_by_table.get(name, ()), udts, is_view=is_view)
            except SchemaError as e:
                out.problems.append(("table", name, str(e)))
    return out


# ----------------------------------------------------------------------------------------------------------
# Metadata -> rows: the inverse, so a schema known from elsewhere (a CQL file) can seed the rows that
# commit-log schema mutations then update (an ALTER rewrites only the rows it changes).
# ----------------------------------------------------------------------------------------------------------

def keyspace_rows_from_schema(schema: Schema, keyspace: str) -> KeyspaceRows:
    """The system_schema rows that describe ``keyspace`` as ``schema`` knows it."""
    out = KeyspaceRows(keyspace)
    for (ks, name), t in schema.types.items():
        if ks != keyspace:
            continue
        out.types.append({"keyspace_name": ks, "type_name": name,
                          "field_names": tuple(udt_field_names(t)),
                          "field_types": tuple(s.cql for s in t.subtypes)})
    for t in schema.tables.values():
        if t.keyspace != keyspace:
            continue
        out.tables.append({"keyspace_name": keyspace, "table_name": t.name, "id": t.id,
                           "flags": frozenset(t.flags), "cdc": t.cdc, "gc_grace_seconds": t.gc_grace_seconds})
        for c in t.columns.values():
            order = ("desc" if c.reversed else "asc") if c.kind == CLUSTERING else "none"
            out.columns.append({"keyspace_name": keyspace, "table_name": t.name, "column_name": c.name,
                                "column_name_bytes": c.name.encode("utf-8"), "kind": c.kind,
                                "position": c.position if c.kind in (PARTITION_KEY, CLUSTERING) else -1,
                                "clustering_order": order, "type": c.type.cql})
        for d in t.dropped.values():
            out.dropped_columns.append({"keyspace_name": keyspace, "table_name": t.name,
                                        "column_name": d.name, "dropped_time": d.dropped_time // 1000,
                                        DROPPED_TIME_MICROS: d.dropped_time,
                                        "kind": d.kind, "type": d.type.cql})
    return out


def udt_field_names(udt) -> list:
    """The field names of a UDT CqlType (whatever attribute cqltypes keeps them in)."""
    for attr in ("field_names", "fields", "names"):
        v = getattr(udt, attr, None)
        if v is not None:
            return [f if isinstance(f, str) else f[0] for f in v]
    raise SchemaError(f"UDT {udt!r} does not expose its field names")
