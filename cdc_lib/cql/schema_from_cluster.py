"""Schema from a live cluster: the ``system_schema`` tables read through cassandra-driver.

The rows are turned into metadata by ``system_schema.build_keyspace``, the same code that rebuilds the
schema from commit-log mutations (``cdc_lib.commitlog.schema_from_log``), so both sources agree on ids, flags, kinds, clustering
order, positions and dropped columns. The system_schema tables themselves come from their hard-coded
definitions (``system_schema``), as in ``cdc_lib.commitlog.schema_from_log``.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Mapping, Optional, Sequence, Union

from cdc_lib.errors import SchemaError

from .masks import check_mask
from .schema import ColumnMask, Schema
from .system_schema import (COLUMNS, DROPPED_COLUMNS, SCHEMA_KEYSPACE, TABLES, TYPES, VIEWS, KeyspaceRows,
                            build_keyspace, with_system_schema)

log = logging.getLogger(__name__)

# The system_schema tables read, in the order build_keyspace needs them (KeyspaceRows attribute names).
SOURCE_TABLES = (TABLES, VIEWS, COLUMNS, DROPPED_COLUMNS, TYPES)


def _row_dict(row) -> dict:
    """A driver row (named tuple, dict or mapping row factory) as a plain dict."""
    if hasattr(row, "_asdict"):
        return dict(row._asdict())
    if isinstance(row, Mapping):
        return dict(row)
    raise SchemaError(f"cannot read a system_schema row of type {type(row).__name__}: use the driver's "
                      f"named_tuple_factory or dict_factory row factory")


def _query(session, cql: str, params: Optional[Sequence] = None) -> list:
    try:
        result = session.execute(cql, params) if params is not None else session.execute(cql)
        return [_row_dict(r) for r in result]
    except SchemaError:
        raise
    except Exception as e:             # the driver's own errors (NoHostAvailable, InvalidRequest, timeouts)
        raise SchemaError(f"reading the schema failed on {cql!r}: {type(e).__name__}: {e}") from e


def _selection(session, table: str) -> str:
    """The select list for a system_schema table: every column, ``dropped_time`` as its milliseconds.

    Cassandra 4.0 and 5.0 record a column dropped from ``system.local`` (``thrift_version``) at
    ``Long.MAX_VALUE`` microseconds, a date no Python datetime holds: read as a timestamp, the driver fails the
    whole ``dropped_columns`` result. The columns are listed from ``system_schema.columns`` (``kind`` is not there
    before 3.11).
    """
    if table != DROPPED_COLUMNS:
        return "*"
    names = [r["column_name"] for r in _query(
        session, f"SELECT column_name FROM {SCHEMA_KEYSPACE}.{COLUMNS} WHERE keyspace_name = %s AND table_name = %s",
        (SCHEMA_KEYSPACE, DROPPED_COLUMNS))]
    if "dropped_time" not in names:
        raise SchemaError(f"{SCHEMA_KEYSPACE}.{DROPPED_COLUMNS} has no dropped_time column: {names}")
    return ", ".join("blobAsBigint(timestampAsBlob(dropped_time)) AS dropped_time" if n == "dropped_time" else n
                     for n in names)


def read_keyspace_rows(session, keyspaces: Optional[Iterable[str]] = None) -> dict:
    """{keyspace: KeyspaceRows} from the cluster; all keyspaces, or only ``keyspaces`` (one query each)."""
    out: dict = {}
    selection = {table: _selection(session, table) for table in SOURCE_TABLES}
    if keyspaces is None:
        names = [r["keyspace_name"] for r in _query(session, f"SELECT keyspace_name FROM {SCHEMA_KEYSPACE}.keyspaces")]
        for ks in names:
            out[ks] = KeyspaceRows(ks)
        for table in SOURCE_TABLES:
            for row in _query(session, f"SELECT {selection[table]} FROM {SCHEMA_KEYSPACE}.{table}"):
                ks = row.get("keyspace_name")
                out.setdefault(ks, KeyspaceRows(ks)).add(table, row)
        return out
    for ks in keyspaces:
        found = _query(session, f"SELECT keyspace_name FROM {SCHEMA_KEYSPACE}.keyspaces WHERE keyspace_name = %s",
                       (ks,))
        if not found:
            raise SchemaError(f"keyspace {ks!r} does not exist in the cluster")
        rows = out[ks] = KeyspaceRows(ks)
        for table in SOURCE_TABLES:
            for row in _query(session, f"SELECT {selection[table]} FROM {SCHEMA_KEYSPACE}.{table} "
                                       "WHERE keyspace_name = %s", (ks,)):
                rows.add(table, row)
    return out


def schema_from_session(session, keyspaces: Optional[Iterable[str]] = None, *, strict: bool = False) -> Schema:
    """A Schema from an open driver session (anything whose ``execute(cql[, params])`` returns rows)."""
    schema = with_system_schema(None)
    problems = []
    for ks, rows in read_keyspace_rows(session, keyspaces).items():
        if ks == SCHEMA_KEYSPACE:      # its tables are the hard-coded union, as in schema_log
            continue
        built = build_keyspace(rows)
        for t in built.tables.values():
            if t.id in schema.tables:
                raise SchemaError(f"table id {t.id} of {t.qualified_name} is also the id of "
                                  f"{schema.tables[t.id].qualified_name}")
            schema.add(t)
        for name, udt in built.types.items():
            schema.types[(ks, name)] = udt
        problems.extend(reason for _, _, reason in built.problems)
    if problems:
        if strict:
            raise SchemaError("schema from the cluster is incomplete: " + "; ".join(problems))
        for p in problems:
            log.warning("schema from the cluster: left out %s", p)
    _add_column_masks(schema, session, keyspaces)
    return schema


def _add_column_masks(schema: Schema, session, keyspaces: Optional[Iterable[str]]) -> None:
    """Cassandra 5 column masks from ``system_schema.column_masks`` onto the columns they mask (older
    versions have no such table: nothing to add)."""
    cql = f"SELECT * FROM {SCHEMA_KEYSPACE}.column_masks"
    rows: list = []
    try:
        if keyspaces is None:
            rows = _query(session, cql)
        else:
            for ks in keyspaces:
                rows += _query(session, cql + " WHERE keyspace_name = %s", (ks,))
    except SchemaError as e:
        text = str(e).lower()
        if "column_masks" in text and ("unconfigured table" in text or "does not exist" in text):   # before 5.0
            return
        raise
    for row in rows:
        table = schema.by_name(row["keyspace_name"], row["table_name"])
        col = table.columns.get(row["column_name"]) if table is not None else None
        if col is None:
            continue
        args = tuple(_mask_argument(v) for v in row.get("function_argument_values") or ())
        where = f"system_schema.column_masks {table.qualified_name}.{col.name}"
        mask = check_mask(ColumnMask(str(row["function_name"]).lower(), args), col.type, where)
        table.columns[col.name] = dataclasses.replace(col, mask=mask)


def _mask_argument(text):
    """A stored mask argument (its CQL text) as a value: null, an integer, a 'string', or the text itself."""
    if text is None or str(text).lower() == "null":
        return None
    text = str(text)
    if text.lstrip("-").isdigit():
        return int(text)
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    return text


def load_from_cluster(session_or_contact_points: Union[object, str, Sequence[str]],
                      keyspaces: Optional[Iterable[str]] = None, *, port: int = 9042, strict: bool = False,
                      **cluster_options) -> Schema:
    """A Schema read from a cluster's system_schema tables.

    ``session_or_contact_points`` is an open cassandra-driver ``Session`` (used as is, not closed) or contact
    points (a host string, comma-separated hosts, or a list); then a ``Cluster`` is opened with ``port`` and
    ``cluster_options`` (e.g. ``auth_provider``, ``ssl_context``) and shut down afterwards.
    ``keyspaces`` limits the read to those keyspaces. Tables that cannot be built are logged and left out
    (their mutations will raise UnknownTableError), or raise SchemaError if ``strict``.
    """
    if hasattr(session_or_contact_points, "execute"):
        return schema_from_session(session_or_contact_points, keyspaces, strict=strict)
    points = session_or_contact_points
    if isinstance(points, str):
        points = [p.strip() for p in points.split(",") if p.strip()]
    points = list(points)
    if not points:
        raise SchemaError("no contact points given")
    try:
        from cassandra.cluster import Cluster
    except ImportError as e:           # pragma: no cover - the driver is a declared dependency
        raise SchemaError("reading the schema from a cluster needs cassandra-driver") from e
    cluster = Cluster(points, port=port, **cluster_options)
    try:
        try:
            session = cluster.connect()
        except Exception as e:         # NoHostAvailable, auth failures...
            raise SchemaError(f"cannot connect to {points} port {port}: {type(e).__name__}: {e}") from e
        return schema_from_session(session, keyspaces, strict=strict)
    finally:
        cluster.shutdown()
