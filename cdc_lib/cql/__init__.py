"""CQL types, Murmur3 tokens, table metadata and its sources (DDL text, a live cluster).

``types`` is the registry mapping each CQL type to its codec; ``schema`` the table metadata every decoder is
typed with. The third schema source, ``system_schema`` mutations read from the commit log itself, lives in
``cdc_lib.commitlog.schema_from_log`` (it needs the mutation decoder).
"""
from .schema import ColumnMetadata, DroppedColumn, Schema, TableMetadata
from .schema_from_cluster import load_from_cluster
from .schema_from_ddl import load_cql_schema
from .tokens import token
from .types import CqlType, parse_type

__all__ = ["ColumnMetadata", "CqlType", "DroppedColumn", "Schema", "TableMetadata", "load_cql_schema",
           "load_from_cluster", "parse_type", "token"]
