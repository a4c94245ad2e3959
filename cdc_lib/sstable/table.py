"""The table an SSTable belongs to, as ``TableMetadata``: names from the schema, types from the SSTable itself.

Which table: keyspace, table name and id come from the table directory (``<keyspace>/<table>-<id>/``); a schema
(``--schema`` CQL, a live cluster, or the ``schema.cql`` that ``nodetool snapshot`` writes beside the files)
is matched by id, then by keyspace and name, then by table name alone when that is unique.

Which types: the serialization header's. Cassandra decodes every cell with the type the header names for its
column (``SerializationHeader.getType``), not the current schema's, so ALTERed and dropped columns read right;
the header also lists dropped columns that still have data. The header does not name the partition-key and
clustering columns: those names come from the schema, and without one they are Cassandra's own defaults for
unnamed key columns (``key``, ``key2``, … and ``column1``, ``column2``, …).
"""
from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Optional

from cdc_lib.cql.schema import (CLUSTERING, PARTITION_KEY, REGULAR, STATIC, ColumnMetadata, DroppedColumn, Schema,
                                TableMetadata)
from cdc_lib.errors import SchemaError, SSTableError

from .descriptor import Descriptor, table_directory
from .statistics import HeaderColumn, SerializationHeader

log = logging.getLogger(__name__)

SNAPSHOT_SCHEMA = "schema.cql"


def default_key_names(n: int) -> list:
    return ["key" if i == 0 else f"key{i + 1}" for i in range(n)]


def default_clustering_names(n: int) -> list:
    return [f"column{i + 1}" for i in range(n)]


def load_schema_file(path) -> Schema:
    """A CQL schema file for reading SSTables: tables need no ``ID`` option (the directories give the ids)."""
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    return load_cql_schema(Path(path), allow_missing_ids=True, warn_missing_ids=False)


def snapshot_schema(desc: Descriptor) -> Optional[Schema]:
    """The schema ``nodetool snapshot`` wrote beside the files (``schema.cql``), if there is one and it can be
    read on its own (a materialized view's names its base table, which is in another directory's file)."""
    path = desc.directory / SNAPSHOT_SCHEMA
    if not path.is_file():
        return None
    try:
        return load_schema_file(path)
    except SchemaError as e:
        log.warning("%s: not used (%s); key columns get default names", path, e)
        return None


def match_table(schema: Optional[Schema], keyspace: Optional[str], name: Optional[str],
                table_id: Optional[uuid.UUID]) -> Optional[TableMetadata]:
    """The schema's table for an SSTable directory: by id, by keyspace and name, by a unique name."""
    if schema is None:
        return None
    if table_id is not None and (t := schema.get(table_id)) is not None:
        return t
    if keyspace is not None and name is not None and (t := schema.by_name(keyspace, name)) is not None:
        return t
    if name is not None:
        same = [t for t in schema.tables.values() if t.name == name]
        if len(same) == 1:
            return same[0]
    return None


def sstable_table(desc: Descriptor, header: SerializationHeader, schema: Optional[Schema]) -> TableMetadata:
    """TableMetadata for decoding and rendering ``desc``: header types, schema (or default) names."""
    tdir = table_directory(desc.directory)
    source = str(desc.path("Data.db"))
    known = match_table(schema, tdir.keyspace, tdir.table, tdir.table_id)
    if known is None and schema is None:
        snap = snapshot_schema(desc)
        known = match_table(snap, tdir.keyspace, tdir.table, tdir.table_id)
    if known is not None:
        keyspace, name = known.keyspace, known.name
        table_id = tdir.table_id or known.id
    elif tdir.table is not None:
        keyspace, name, table_id = tdir.keyspace, tdir.table, tdir.table_id
    else:
        raise SchemaError(f"{source}: cannot tell which table this SSTable belongs to: it is not in a "
                          f"<keyspace>/<table>-<id>/ directory and no schema names it")
    n_pk = len(header.partition_key_types)
    n_ck = len(header.clustering)
    if known is not None:
        if len(known.partition_key) != n_pk or len(known.clustering) != n_ck:
            raise SSTableError(f"the schema's {known.qualified_name} has {len(known.partition_key)} partition-key "
                               f"and {len(known.clustering)} clustering columns, the SSTable {n_pk} and {n_ck}",
                               source)
        pk_names = [c.name for c in known.partition_key]
        ck_names = [c.name for c in known.clustering]
    else:
        pk_names = default_key_names(n_pk)
        ck_names = default_clustering_names(n_ck)
    pk = [ColumnMetadata(n, t, PARTITION_KEY, i)
          for i, (n, t) in enumerate(zip(pk_names, header.partition_key_types))]
    ck = [ColumnMetadata(n, c.type, CLUSTERING, i, c.reversed)
          for i, (n, c) in enumerate(zip(ck_names, header.clustering))]
    columns = {c.name: c for c in pk + ck}
    dropped = dict(known.dropped) if known is not None else {}
    for kind, cols in ((STATIC, header.static_columns), (REGULAR, header.regular_columns)):
        for c in cols:
            if c.name in columns:
                raise SSTableError(f"column {c.name!r} is listed twice in the serialization header", source)
            ctype = _column_type(c, known, desc)
            if c.name in dropped and (known is None or c.name not in known.columns):
                # a dropped column with data in this SSTable: decodable by name, never shown
                dropped[c.name] = DroppedColumn(c.name, ctype, dropped[c.name].dropped_time, kind)
            else:
                columns[c.name] = ColumnMetadata(c.name, ctype, kind)
    flags = set(known.flags) if known is not None else {"compound"}
    if header.counter:
        flags.add("counter")
    return TableMetadata(keyspace or "", name, table_id, pk, ck, columns, dropped, frozenset(flags),
                         known.cdc if known is not None else False)


def _column_type(column: HeaderColumn, known: Optional[TableMetadata], desc: Descriptor):
    """The header's type, except for Cassandra 3.0's UDT quirk: 3.0 writes a (always frozen) UDT column as
    ``UserType(...)`` without ``FrozenType``, so its header claims a multi-cell column (format reference §4.6).
    When the schema says the column is frozen, a 3.x SSTable's UDT column is read as frozen."""
    t = column.type
    if t.kind == "udt" and t.multicell and desc.version.version.startswith("m") and known is not None:
        current = known.columns.get(column.name) or known.dropped.get(column.name)
        if current is not None and not current.type.multicell:
            return t.freeze()
    return t
