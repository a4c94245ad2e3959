"""Table metadata: what a decoder needs to read a table's mutations, and what consumers need to type them.

A ``Schema`` maps table ids to ``TableMetadata``. It can be built from a CQL schema file
(``cql.schema_from_ddl.load_cql_schema``), from a live cluster (``cql.schema_from_cluster.load_from_cluster``) or from the
commit log itself (``commitlog.schema_from_log.SchemaTracker``), which applies ``system_schema`` mutations as they appear so
each mutation is decoded with the schema in force when it was written.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Optional

from cdc_lib.errors import UnknownColumnError, UnknownTableError

from .types import CqlType

PARTITION_KEY = "partition_key"
CLUSTERING = "clustering"
STATIC = "static"
REGULAR = "regular"

# Cassandra's default ``gc_grace_seconds`` (10 days): how long a tombstone is kept before compaction may purge it.
DEFAULT_GC_GRACE_SECONDS = 864000

# What the commit-log readers take a table id for when the pipeline does not capture the table (no cdc = true)
NOT_CAPTURED = object()


@dataclass(frozen=True)
class ColumnMask:
    """A Cassandra 5 column mask (``MASKED WITH mask_inner(1, 2)``): the function's name without its ``system.``
    keyspace, and its arguments after the column value (int, float, str or None). Applied by ``cql.masks``."""
    function: str
    args: tuple = ()


@dataclass(frozen=True)
class ColumnMetadata:
    name: str
    type: CqlType
    kind: str                      # PARTITION_KEY, CLUSTERING, STATIC or REGULAR
    position: int = -1             # index within the partition key or clustering; -1 for other columns
    reversed: bool = False         # clustering column with DESC order
    mask: Optional[ColumnMask] = None   # Cassandra 5 column mask: events carry the masked value

    @property
    def is_complex(self) -> bool:
        """A non-frozen collection or UDT: stored as one cell per element, with cell paths."""
        return self.type.multicell

    @property
    def is_static(self) -> bool:
        return self.kind == STATIC


@dataclass(frozen=True)
class DroppedColumn:
    name: str
    type: CqlType
    dropped_time: int              # microseconds; cells written at or before it are gone on read
    kind: str = REGULAR

    @property
    def is_complex(self) -> bool:
        return self.type.multicell


@dataclass
class TableMetadata:
    keyspace: str
    name: str
    id: uuid.UUID
    partition_key: list            # [ColumnMetadata] in key order
    clustering: list               # [ColumnMetadata] in clustering order
    columns: dict                  # name -> ColumnMetadata, every column including keys
    dropped: dict = field(default_factory=dict)   # name -> DroppedColumn
    flags: frozenset = frozenset()  # Cassandra table flags: 'compound', 'dense', 'super', 'counter'
    cdc: bool = False
    # the table option: tombstones (and expired TTL data) older than this are purged from the Delta state
    # (``state.purge``), as Cassandra's compaction purges them
    gc_grace_seconds: int = DEFAULT_GC_GRACE_SECONDS

    @property
    def qualified_name(self) -> str:
        return f"{self.keyspace}.{self.name}"

    @property
    def is_counter(self) -> bool:
        return "counter" in self.flags

    @property
    def static_columns(self) -> list:
        return [c for c in self.columns.values() if c.kind == STATIC]

    @property
    def regular_columns(self) -> list:
        return [c for c in self.columns.values() if c.kind == REGULAR]

    def column_for_data(self, name: str):
        """The current column named ``name``, or its dropped-column record; raises UnknownColumnError.

        Data for a dropped column is still serialized by name in older mutations, so the decoder must be
        able to type it (Cassandra does the same through its dropped-columns table).
        """
        col = self.columns.get(name)
        if col is not None:
            return col
        dropped = self.dropped.get(name)
        if dropped is not None:
            return dropped
        raise UnknownColumnError(self.qualified_name, name)


@dataclass
class Schema:
    """Tables by id and user types by (keyspace, name). Copy before changing a schema others hold."""
    tables: dict = field(default_factory=dict)       # uuid.UUID -> TableMetadata
    types: dict = field(default_factory=dict)        # (keyspace, name) -> cqltypes UDT CqlType

    def table(self, table_id: uuid.UUID) -> TableMetadata:
        t = self.tables.get(table_id)
        if t is None:
            raise UnknownTableError(table_id)
        return t

    def get(self, table_id: uuid.UUID) -> Optional[TableMetadata]:
        return self.tables.get(table_id)

    def by_name(self, keyspace: str, name: str) -> Optional[TableMetadata]:
        for t in self.tables.values():
            if t.keyspace == keyspace and t.name == name:
                return t
        return None

    def add(self, table: TableMetadata) -> None:
        self.tables[table.id] = table

    def copy(self) -> "Schema":
        return Schema(dict(self.tables), dict(self.types))

    def captured_tables(self) -> list:
        """The tables the pipeline captures: those with ``cdc = true``. A segment Cassandra keeps in ``cdc_raw``
        holds the mutations of every table written while it was active; only these tables' become state and
        events (Cassandra refuses ``cdc`` on its own tables, so system tables are never among them)."""
        return [t for t in self.tables.values() if t.cdc]
