"""Avro schemas and datums for change events (Debezium's envelope shape), and the JSON form of the same events.

Per table (``table_schemas``), under the namespace ``<namespace>.<keyspace>.<table>``:

* ``Key``: the primary-key columns. Partition-key fields are required. Clustering fields are nullable, because
  a partition with static data and no clustering row shows one row whose clustering columns are null (see
  ``cdc_lib.state.events``); such a key still identifies exactly one row.
* ``Value``: every column of the row (``SELECT *`` order: partition key, clustering, then the other columns by
  name). Every non-partition-key field is ``["null", T]`` with default null, so adding a column (readers of new
  data fill null from the default) and dropping one (readers skip it) keep schemas backward and forward
  compatible (``compatibility_problems`` checks this).
* ``Envelope``: ``before`` and ``after`` (both nullable ``Value``), ``source`` (``<namespace>.Source``: connector,
  cluster, node, keyspace, table, segment, position, ts_us, expired, snapshot), ``op`` (c, u, d, r), ``ts_ms``,
  plus ``id`` (the event id) and ``changed`` (the columns whose value changed).

CQL type -> Avro (every field also carries ``"cql.type"``, the column's CQL type, and ``"cql_name"`` when the
Avro field name had to differ from the CQL name):

===================  ==================================================================================
ascii, text          string
blob, custom types   bytes
boolean              boolean
tinyint, smallint,   int
int
bigint, counter      long (a counter's total)
varint               bytes: big-endian two's complement, minimal length (the CQL bytes; Avro's own
                     unscaled-decimal form)
decimal              record ``VariableScaleDecimal`` {scale: int, value: bytes} (Debezium's type of the
                     same name): Avro's ``decimal`` logical type fixes one scale per schema, a CQL decimal
                     has its own scale per value, and a string would make consumers parse; this keeps the
                     exact unscaled value and scale (``1.50`` stays ``1.50``, not ``1.5``)
float / double       float / double (float is 32-bit in both, so values are exact)
uuid, timeuuid       string, logicalType uuid
inet                 string (the address as ``ipaddress`` prints it)
date                 int: days since 1970-01-01 (Debezium ``io.debezium.time.Date``)
time                 long: nanoseconds since midnight (Debezium ``io.debezium.time.NanoTime``); Avro's
                     time-micros would lose the nanoseconds
timestamp            long: milliseconds since the epoch (Debezium ``io.debezium.time.Timestamp``)
duration             record ``CqlDuration`` {months: int, days: int, nanoseconds: long} (no Avro type
                     holds CQL's three independent signed parts)
list, set, vector    array (a set in Cassandra's order; a vector's ``dimension`` is a schema property)
map                  map when the key type is ascii/text; otherwise array of records {key, value} in
                     Cassandra's order (Avro map keys are strings only)
tuple                record with nullable fields f0..fn
UDT                  record named after the type, nullable fields named after the UDT's fields
empty type           null
===================  ==================================================================================

Why date, time and timestamp are plain int/long with Debezium's ``connect.name`` rather than Avro logical
types: CQL dates span +-2^31 days and timestamps +-2^63 ms, far outside years 1..9999, and Python Avro readers
(fastavro) apply the writer's logical type and raise on such values, so one old-or-far-future value would make a
whole topic unreadable. Kafka Connect / Debezium consumers know these names.

Nulls inside collections are not CQL values (Cassandra refuses them) and raise ``CqlValueError``; tuple and UDT
fields may be null.

The CQL *empty value* (zero bytes of a type for which that is not a value, ``cql.types.EMPTY``) of a column is
exact: the column's field is null (a required partition-key field holds its type's zero) and the column's name
is listed in the record's ``_cql_empty`` array. An empty value nested inside a tuple or UDT becomes null there.

JSON (``to_json_row``, ``to_json_key``, ``to_json_event``) uses ``CqlType.to_json`` for every value: the same
event, readable without a schema (see ``cdc_lib.cql.types`` for the exact forms). ``from_json_row`` / ``from_json_key`` /
``from_json_event`` read it back to the exact Python values (only NaN payload bits are not kept by JSON), so an
outbox kept as JSON can still be published as Avro.

API: ``table_schemas`` / ``table_schema_dicts`` (key, value, envelope), ``source_schema``,
``schema_change_schema``; ``to_avro_row`` / ``from_avro_row``, ``to_avro_key`` / ``from_avro_key``,
``to_avro_envelope`` / ``from_avro_envelope``, ``value_to_avro`` / ``value_from_avro``; the JSON functions above;
``compatibility_problems(writer, reader)``.
"""
from __future__ import annotations

import copy
import datetime
import decimal
import ipaddress
import re
import struct
import uuid
from collections.abc import Mapping
from typing import NamedTuple, Optional

import fastavro

from cdc_lib.cql.masks import masked_json
from cdc_lib.cql.schema import CLUSTERING, PARTITION_KEY, TableMetadata
from cdc_lib.cql.types import EMPTY, CqlMap, CqlPairs, CqlSet, CqlTime, Duration, UdtValue, parse_type
from cdc_lib.errors import CqlValueError, SchemaError

DEFAULT_NAMESPACE = "cdc"
EMPTY_FIELD = "_cql_empty"
OPS = ("c", "u", "d", "r")

_STRING_KEY_KINDS = ("ascii", "text")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DATE = parse_type("date")
_TIMESTAMP = parse_type("timestamp")


class TableSchemas(NamedTuple):
    key: dict        # each parsed with fastavro.parse_schema
    value: dict
    envelope: dict


# ----------------------------------------------------------------------------------------------------- names

def avro_name(name: str) -> str:
    """A valid Avro name for a CQL identifier (quoted CQL names may hold any character)."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not out or out[0].isdigit():
        out = "_" + out
    return out


def field_names(names) -> dict:
    """CQL names -> distinct Avro field names. Valid names keep themselves; others are sanitized and, on a
    clash, numbered, in sorted order so that the mapping of a column never depends on the column order."""
    out: dict = {}
    taken = {n for n in names if _NAME_RE.match(n)} | {EMPTY_FIELD}
    for n in sorted(names):
        if _NAME_RE.match(n) and n != EMPTY_FIELD:
            out[n] = n
            continue
        base = avro_name(n)
        cand, i = base, 2
        while cand in taken:
            cand = f"{base}_{i}"
            i += 1
        taken.add(cand)
        out[n] = cand
    return out


def table_namespace(table: TableMetadata, namespace: str = DEFAULT_NAMESPACE) -> str:
    return f"{namespace}.{avro_name(table.keyspace)}.{avro_name(table.name)}"


def _key_columns(table: TableMetadata) -> list:
    return list(table.partition_key) + list(table.clustering)


def _value_columns(table: TableMetadata) -> list:
    rest = sorted((c for c in table.columns.values() if c.kind not in (PARTITION_KEY, CLUSTERING)),
                  key=lambda c: c.name)
    return _key_columns(table) + rest


# --------------------------------------------------------------------------------------------------- schemas

class _Builder:
    """Builds one schema: named types are defined once, then referenced by full name (Avro requires it)."""

    def __init__(self, namespace: str, table_ns: str):
        self.namespace = namespace
        self.table_ns = table_ns
        self.defined: set = set()

    def named(self, fullname: str, make):
        if fullname in self.defined:
            return fullname
        self.defined.add(fullname)
        return make()

    def type_of(self, t, path: str):
        """The (non-null) Avro type of CQL type ``t``; ``path`` names records made for this position."""
        k = t.kind
        if k in ("ascii", "text"):
            return {"type": "string", "cql.type": k}
        if k in ("blob", "custom"):
            return {"type": "bytes", "cql.type": k if k == "blob" else t.cql}
        if k == "boolean":
            return "boolean"
        if k in ("tinyint", "smallint", "int"):
            return {"type": "int", "cql.type": k}
        if k in ("bigint", "counter"):
            return {"type": "long", "cql.type": k}
        if k == "varint":
            return {"type": "bytes", "cql.type": "varint"}
        if k == "float":
            return "float"
        if k == "double":
            return "double"
        if k in ("uuid", "timeuuid"):
            return {"type": "string", "logicalType": "uuid", "cql.type": k}
        if k == "inet":
            return {"type": "string", "cql.type": "inet"}
        if k == "date":
            return {"type": "int", "connect.name": "io.debezium.time.Date", "cql.type": "date"}
        if k == "time":
            return {"type": "long", "connect.name": "io.debezium.time.NanoTime", "cql.type": "time"}
        if k == "timestamp":
            return {"type": "long", "connect.name": "io.debezium.time.Timestamp", "cql.type": "timestamp"}
        if k == "decimal":
            name = f"{self.namespace}.types.VariableScaleDecimal"
            return self.named(name, lambda: {
                "type": "record", "name": name, "connect.name": "io.debezium.data.VariableScaleDecimal",
                "doc": "CQL decimal: value = unscaled (big-endian two's complement) * 10^-scale",
                "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}]})
        if k == "duration":
            name = f"{self.namespace}.types.CqlDuration"
            return self.named(name, lambda: {
                "type": "record", "name": name, "doc": "CQL duration: three independent signed parts",
                "fields": [{"name": "months", "type": "int"}, {"name": "days", "type": "int"},
                           {"name": "nanoseconds", "type": "long"}]})
        if k in ("list", "set"):
            return {"type": "array", "items": self.type_of(t.subtypes[0], path + "_item"), "cql.type": k}
        if k == "vector":
            return {"type": "array", "items": self.type_of(t.subtypes[0], path + "_item"), "cql.type": "vector",
                    "dimension": t.dimension}
        if k == "map":
            kt, vt = t.subtypes
            if kt.kind in _STRING_KEY_KINDS:
                return {"type": "map", "values": self.type_of(vt, path + "_value"), "cql.type": "map"}
            name = f"{self.table_ns}.{path}_entry"
            return {"type": "array", "cql.type": "map", "items": self.named(name, lambda: {
                "type": "record", "name": name,
                "fields": [{"name": "key", "type": self.type_of(kt, path + "_key")},
                           {"name": "value", "type": self.type_of(vt, path + "_value")}]})}
        if k == "tuple":
            name = f"{self.table_ns}.{path}_tuple"
            return self.named(name, lambda: {
                "type": "record", "name": name, "cql.type": t.cql,
                "fields": [{"name": f"f{i}", "type": ["null", self.type_of(s, f"{path}_f{i}")], "default": None}
                           for i, s in enumerate(t.subtypes)]})
        if k == "udt":
            name = f"{self.namespace}.{avro_name(t.keyspace)}.udt.{avro_name(t.name)}"

            def make():
                names = field_names(t.field_names)
                fields = []
                for n, s in zip(t.field_names, t.subtypes):
                    f = {"name": names[n], "type": ["null", self.type_of(s, f"{avro_name(t.name)}_{names[n]}")],
                         "default": None}
                    if names[n] != n:
                        f["cql_name"] = n
                    fields.append(f)
                return {"type": "record", "name": name, "cql.type": f"{t.keyspace}.{t.name}", "fields": fields}
            return self.named(name, make)
        if k == "empty":
            return "null"
        raise SchemaError(f"CQL type {t.cql} ({k}) has no Avro mapping")

    def field(self, col, avro: str, required: bool) -> dict:
        t = self.type_of(col.type, avro)
        if t == "null":
            f = {"name": avro, "type": "null", "default": None}
        elif required:
            f = {"name": avro, "type": t}
        else:
            f = {"name": avro, "type": ["null", t], "default": None}
        f["cql.type"] = col.type.cql
        if avro != col.name:
            f["cql_name"] = col.name
        return f

    def row_record(self, name: str, table: TableMetadata, columns, doc: str) -> dict:
        names = field_names([c.name for c in columns])
        fields = [self.field(c, names[c.name], c.kind == PARTITION_KEY) for c in columns]
        fields.append({"name": EMPTY_FIELD, "type": {"type": "array", "items": "string"}, "default": [],
                       "doc": "columns holding the CQL empty value (zero bytes); their fields are placeholders"})
        return {"type": "record", "name": name, "doc": doc, "fields": fields}


def source_schema(namespace: str = DEFAULT_NAMESPACE) -> dict:
    return {
        "type": "record", "name": f"{namespace}.Source", "doc": "Where and when the change was written",
        "fields": [
            {"name": "connector", "type": "string"},
            {"name": "cluster", "type": "string"},
            {"name": "node", "type": "string"},
            {"name": "keyspace", "type": "string"},
            {"name": "table", "type": "string"},
            {"name": "segment", "type": ["null", "string"], "default": None},
            {"name": "position", "type": ["null", "long"], "default": None},
            {"name": "ts_us", "type": "long", "doc": "write timestamp (expiry time for expired: true)"},
            {"name": "expired", "type": "boolean", "default": False},
            {"name": "snapshot", "type": "boolean", "default": False, "doc": "from a snapshot/backfill"},
        ]}


def table_schema_dicts(table: TableMetadata, namespace: str = DEFAULT_NAMESPACE) -> TableSchemas:
    """The key, value and envelope schemas as plain JSON-able dicts (what a Schema Registry is sent)."""
    ns = table_namespace(table, namespace)
    kb = _Builder(namespace, ns)
    key = kb.row_record(f"{ns}.Key", table, _key_columns(table), f"Primary key of {table.qualified_name}")
    vb = _Builder(namespace, ns)
    value = vb.row_record(f"{ns}.Value", table, _value_columns(table), f"A row of {table.qualified_name}")
    envelope = {
        "type": "record", "name": f"{ns}.Envelope", "connect.name": f"{ns}.Envelope",
        "doc": f"A change of a row of {table.qualified_name}",
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", f"{ns}.Value"], "default": None},
            {"name": "source", "type": source_schema(namespace)},
            {"name": "op", "type": "string", "doc": "c create, u update, d delete, r snapshot read"},
            {"name": "ts_ms", "type": "long", "doc": "processing time"},
            {"name": "id", "type": "string", "doc": "event id: the same change always has the same id"},
            {"name": "changed", "type": {"type": "array", "items": "string"}, "default": []},
        ]}
    return TableSchemas(key, copy.deepcopy(value), envelope)


def table_schemas(table: TableMetadata, namespace: str = DEFAULT_NAMESPACE) -> TableSchemas:
    """(key, value, envelope) schemas of a table, parsed with fastavro."""
    d = table_schema_dicts(table, namespace)
    try:
        return TableSchemas(*(fastavro.parse_schema(copy.deepcopy(s)) for s in d))
    except fastavro.schema.SchemaParseException as e:
        raise SchemaError(f"Avro schema of {table.qualified_name}: {e}") from None


def schema_change_schema(namespace: str = DEFAULT_NAMESPACE) -> dict:
    """The record of the schema-change topic (plain dict; parse with fastavro.parse_schema)."""
    return {
        "type": "record", "name": f"{namespace}.SchemaChange", "doc": "A change of the CQL schema",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "keyspace", "type": "string"},
            {"name": "table", "type": ["null", "string"], "default": None, "doc": "null for keyspace/type changes"},
            {"name": "kind", "type": "string",
             "doc": "create_keyspace, drop_keyspace, create_table, alter_table, drop_table, create_type, "
                    "alter_type, drop_type"},
            {"name": "detail", "type": ["null", "string"], "default": None,
             "doc": "what changed, CQL-like (e.g. 'ADD c int', 'DROP c')"},
            {"name": "table_id", "type": ["null", "string"], "default": None},
            {"name": "ts_us", "type": ["null", "long"], "default": None, "doc": "schema write timestamp"},
            {"name": "ts_ms", "type": "long", "doc": "processing time"},
        ]}


# ---------------------------------------------------------------------------------------------------- values

def _bad(t, message: str) -> CqlValueError:
    return CqlValueError(f"{t.cql}: {message}")


def _varint_bytes(v: int) -> bytes:
    return v.to_bytes(v.bit_length() // 8 + 1, "big", signed=True)


def _zero(avro_type):
    """A placeholder datum of a required field (used only for an empty partition-key value)."""
    if isinstance(avro_type, list):
        return None if "null" in avro_type else _zero(avro_type[0])
    if isinstance(avro_type, dict):
        if avro_type.get("logicalType") == "uuid":
            return str(uuid.UUID(int=0))
        if avro_type["type"] == "record":
            return {f["name"]: _zero(f["type"]) for f in avro_type["fields"]}
        avro_type = avro_type["type"]
    return {"int": 0, "long": 0, "string": "", "bytes": b"", "boolean": False, "float": 0.0, "double": 0.0,
            "array": [], "map": {}, "null": None}[avro_type]


def value_to_avro(t, v):
    """A Python value of CQL type ``t`` (as ``cdc_lib.cql.types`` decodes it) -> its Avro datum."""
    if v is None or v is EMPTY:
        return None
    k = t.kind
    try:
        if k in ("ascii", "text"):
            if not isinstance(v, str):
                raise TypeError(f"expected str, got {type(v).__name__}")
            return v
        if k in ("blob", "custom"):
            return bytes(v)
        if k == "boolean":
            return bool(v)
        if k in ("tinyint", "smallint", "int", "bigint", "counter"):
            return int(v)
        if k == "varint":
            return _varint_bytes(int(v))
        if k in ("float", "double"):
            return float(v)
        if k == "decimal":
            d = decimal.Decimal(v)
            if not d.is_finite():
                raise ValueError("not a finite decimal")
            sign, digits, exp = d.as_tuple()
            unscaled = int("".join(map(str, digits)) or "0")
            return {"scale": -exp, "value": _varint_bytes(-unscaled if sign else unscaled)}
        if k in ("uuid", "timeuuid"):
            return str(v if isinstance(v, uuid.UUID) else uuid.UUID(str(v)))
        if k == "inet":
            return str(ipaddress.ip_address(v))
        if k == "date":
            return int.from_bytes(_DATE.encode(v), "big") - (1 << 31)
        if k == "timestamp":
            return int.from_bytes(_TIMESTAMP.encode(v), "big", signed=True)
        if k == "time":
            if isinstance(v, datetime.time):
                v = CqlTime.from_time(v)
            return int(v.nanoseconds if isinstance(v, CqlTime) else v)
        if k == "duration":
            return {"months": v.months, "days": v.days, "nanoseconds": v.nanoseconds}
        if k in ("list", "set", "vector"):
            st = t.subtypes[0]
            return [_element(t, st, x) for x in v]
        if k == "map":
            kt, vt = t.subtypes
            items = v.items() if hasattr(v, "items") else v
            if kt.kind in _STRING_KEY_KINDS:
                return {_element(t, kt, a): _element(t, vt, b) for a, b in items}
            return [{"key": _element(t, kt, a), "value": _element(t, vt, b)} for a, b in items]
        if k == "tuple":
            vals = tuple(v)
            return {f"f{i}": value_to_avro(s, vals[i] if i < len(vals) else None) for i, s in enumerate(t.subtypes)}
        if k == "udt":
            names = field_names(t.field_names)
            if not isinstance(v, Mapping):
                raise TypeError(f"expected a mapping, got {type(v).__name__}")
            return {names[n]: value_to_avro(s, v.get(n)) for n, s in zip(t.field_names, t.subtypes)}
        if k == "empty":
            return None
    except CqlValueError:
        raise
    except (TypeError, ValueError, AttributeError, OverflowError) as e:
        raise _bad(t, f"cannot convert {v!r} to Avro: {e}") from None
    raise SchemaError(f"CQL type {t.cql} ({k}) has no Avro mapping")


def _element(t, st, x):
    if x is None or x is EMPTY:
        raise _bad(t, "null or empty element inside a collection has no Avro form")
    return value_to_avro(st, x)


def value_from_avro(t, d):
    """Inverse of ``value_to_avro``: the Python value ``cdc_lib.cql.types`` would decode."""
    if d is None:
        return None
    k = t.kind
    if k in ("ascii", "text", "boolean", "tinyint", "smallint", "int", "bigint", "counter", "float", "double"):
        return d
    if k in ("blob", "custom"):
        return bytes(d)
    if k == "varint":
        return int.from_bytes(d, "big", signed=True)
    if k == "decimal":
        unscaled = int.from_bytes(d["value"], "big", signed=True)
        return decimal.Decimal((1 if unscaled < 0 else 0, tuple(int(c) for c in str(abs(unscaled))), -d["scale"]))
    if k in ("uuid", "timeuuid"):
        return d if isinstance(d, uuid.UUID) else uuid.UUID(d)
    if k == "inet":
        return ipaddress.ip_address(d)
    if k == "date":
        return _DATE.decode((d + (1 << 31)).to_bytes(4, "big"))
    if k == "timestamp":
        return _TIMESTAMP.decode(d.to_bytes(8, "big", signed=True))
    if k == "time":
        return CqlTime(d)
    if k == "duration":
        return Duration(d["months"], d["days"], d["nanoseconds"])
    if k == "list" or k == "vector":
        return [value_from_avro(t.subtypes[0], x) for x in d]
    if k == "set":
        return CqlSet(value_from_avro(t.subtypes[0], x) for x in d)
    if k == "map":
        kt, vt = t.subtypes
        if kt.kind in _STRING_KEY_KINDS:
            pairs = [(a, value_from_avro(vt, b)) for a, b in d.items()]
        else:
            pairs = [(value_from_avro(kt, e["key"]), value_from_avro(vt, e["value"])) for e in d]
        # As cqltypes decodes maps: CqlPairs when the key type's values are unhashable (lists, maps, vectors).
        return CqlMap(pairs) if _hashable_values(kt) else CqlPairs(pairs)
    if k == "tuple":
        return tuple(value_from_avro(s, d.get(f"f{i}")) for i, s in enumerate(t.subtypes))
    if k == "udt":
        names = field_names(t.field_names)
        return UdtValue((n, value_from_avro(s, d.get(names[n]))) for n, s in zip(t.field_names, t.subtypes))
    if k == "empty":
        return None
    raise SchemaError(f"CQL type {t.cql} ({k}) has no Avro mapping")


def _hashable_values(t) -> bool:
    if t.kind in ("list", "map", "vector"):
        return False
    if t.kind in ("set", "tuple", "udt"):
        return all(_hashable_values(s) for s in t.subtypes)
    return True


def _row_to_avro(table: TableMetadata, row: Mapping, columns, required_kinds) -> dict:
    names = field_names([c.name for c in columns])
    out: dict = {}
    empties = []
    for c in columns:
        v = row.get(c.name)
        if v is EMPTY:
            empties.append(c.name)
        if c.kind in required_kinds:
            if v is None:
                raise CqlValueError(f"{table.qualified_name}: partition key column {c.name} is null")
            if v is EMPTY:   # Cassandra refuses empty partition keys; kept exact should one ever appear
                fresh = _Builder(DEFAULT_NAMESPACE, table_namespace(table))   # full definitions, no references
                out[names[c.name]] = _zero(fresh.type_of(c.type, names[c.name]))
                continue
        try:
            out[names[c.name]] = value_to_avro(c.type, v)
        except CqlValueError as e:
            raise CqlValueError(f"{table.qualified_name}.{c.name}: {e}") from None
    out[EMPTY_FIELD] = empties
    return out


def _row_from_avro(table: TableMetadata, datum: Mapping, columns) -> dict:
    names = field_names([c.name for c in columns])
    empties = set(datum.get(EMPTY_FIELD) or ())
    out = {}
    for c in columns:
        if c.name in empties:
            out[c.name] = EMPTY
        else:
            out[c.name] = value_from_avro(c.type, datum.get(names[c.name]))
    return out


def to_avro_row(table: TableMetadata, row: Mapping) -> dict:
    """A row {column: Python value} -> datum of the table's ``Value`` record (absent columns are null)."""
    return _row_to_avro(table, row, _value_columns(table), (PARTITION_KEY,))


def from_avro_row(table: TableMetadata, datum: Mapping) -> dict:
    """A ``Value`` datum -> row {column: Python value} (exactly what ``to_avro_row`` was given)."""
    return _row_from_avro(table, datum, _value_columns(table))


def to_avro_key(table: TableMetadata, key: Mapping) -> dict:
    """Primary-key values {column: value} -> datum of the table's ``Key`` record."""
    return _row_to_avro(table, key, _key_columns(table), (PARTITION_KEY,))


def from_avro_key(table: TableMetadata, datum: Mapping) -> dict:
    return _row_from_avro(table, datum, _key_columns(table))


def to_avro_envelope(table: TableMetadata, event: Mapping) -> dict:
    """An event dict (as ``cdc_lib.state.events`` builds it) -> datum of the table's ``Envelope`` record."""
    op = event["op"]
    if op not in OPS:
        raise CqlValueError(f"{table.qualified_name}: unknown op {op!r}")
    src = event.get("source") or {}
    before, after = event.get("before"), event.get("after")
    return {
        "before": None if before is None else to_avro_row(table, before),
        "after": None if after is None else to_avro_row(table, after),
        "source": {
            "connector": src.get("connector") or "cassandra-cdc", "cluster": src.get("cluster") or "",
            "node": src.get("node") or "", "keyspace": src.get("keyspace") or table.keyspace,
            "table": src.get("table") or table.name, "segment": src.get("segment"),
            "position": src.get("position"), "ts_us": int(src.get("ts_us") or 0),
            "expired": bool(src.get("expired", False)), "snapshot": bool(src.get("snapshot", op == "r")),
        },
        "op": op, "ts_ms": int(event["ts_ms"]), "id": str(event["id"]),
        "changed": list(event.get("changed") or []),
    }


def from_avro_envelope(table: TableMetadata, datum: Mapping) -> dict:
    """Inverse of ``to_avro_envelope`` (``key`` is rebuilt from the row)."""
    before = None if datum["before"] is None else from_avro_row(table, datum["before"])
    after = None if datum["after"] is None else from_avro_row(table, datum["after"])
    ref = after if after is not None else before or {}
    return {
        "id": datum["id"], "op": datum["op"],
        "key": {c.name: ref.get(c.name) for c in _key_columns(table)},
        "before": before, "after": after, "changed": list(datum["changed"]),
        "source": dict(datum["source"]), "ts_ms": datum["ts_ms"],
    }


def event_key(table: TableMetadata, event: Mapping) -> dict:
    """The primary-key values of an event (from ``key`` or, failing that, its row image)."""
    if event.get("key") is not None:
        return dict(event["key"])
    ref = event.get("after") if event.get("after") is not None else event.get("before")
    return {c.name: ref.get(c.name) for c in _key_columns(table)}


# ------------------------------------------------------------------------------------------------------ JSON

def to_json_row(table: TableMetadata, row: Optional[Mapping]) -> Optional[dict]:
    """A row -> its JSON form {column: CqlType.to_json(value)} in ``SELECT *`` order (absent columns null);
    a masked column's value masked (``cql.masks``)."""
    if row is None:
        return None
    return {c.name: masked_json(c, row.get(c.name)) for c in _value_columns(table)}


def to_json_key(table: TableMetadata, key: Mapping) -> dict:
    """The key's JSON form; a masked key column is masked here too (the key is sent as well as the rows)."""
    return {c.name: masked_json(c, key.get(c.name)) for c in _key_columns(table)}


def to_json_event(table: TableMetadata, event: Mapping) -> dict:
    """An event -> the JSON envelope (same fields as the Avro envelope)."""
    d = to_avro_envelope(table, {**event, "before": None, "after": None})
    d["before"] = to_json_row(table, event.get("before"))
    d["after"] = to_json_row(table, event.get("after"))
    return d


_DATE_RE = re.compile(r"^([+-]?\d{4,})-(\d{2})-(\d{2})$")
_TIMESTAMP_RE = re.compile(r"^([+-]?\d{4,})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{3})Z$")
_TIME_RE = re.compile(r"^(\d{2}):(\d{2}):(\d{2})\.(\d{9})$")
_DURATION_UNIT_RE = re.compile(r"(\d+)(y|mo|ms|m|w|d|h|us|µs|ns|s)", re.IGNORECASE)
_DURATION_NANOS = {"h": 3_600_000_000_000, "m": 60_000_000_000, "s": 1_000_000_000, "ms": 1_000_000,
                   "us": 1000, "µs": 1000, "ns": 1}


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date, for any year (inverse of the civil-from-days
    conversion cqltypes prints dates with)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _parse_duration(text: str) -> Duration:
    body = text[1:] if text.startswith("-") else text
    sign = -1 if text.startswith("-") else 1
    months = days = nanos = 0
    pos = 0
    for m in _DURATION_UNIT_RE.finditer(body):
        if m.start() != pos:
            break
        pos = m.end()
        n, unit = int(m.group(1)), m.group(2).lower()
        if unit == "y":
            months += 12 * n
        elif unit == "mo":
            months += n
        elif unit == "w":
            days += 7 * n
        elif unit == "d":
            days += n
        else:
            nanos += n * _DURATION_NANOS[unit]
    if pos != len(body) or not body:
        raise ValueError(f"not a duration literal: {text!r}")
    return Duration(sign * months, sign * days, sign * nanos)


def value_from_json(t, j):
    """Inverse of ``CqlType.to_json``: the Python value ``cdc_lib.cql.types`` would decode (NaN payloads aside)."""
    if j is None:
        return None
    if isinstance(j, dict) and j.get("$empty") is True and len(j) == 1:
        return EMPTY
    k = t.kind
    try:
        if k in ("ascii", "text"):
            if not isinstance(j, str):
                raise TypeError(f"expected a string, got {type(j).__name__}")
            return j
        if k in ("blob", "custom"):
            if not (isinstance(j, str) and j.startswith("0x")):
                raise ValueError("expected 0x-prefixed hex")
            return bytes.fromhex(j[2:])
        if k == "boolean":
            if not isinstance(j, bool):
                raise TypeError("expected true or false")
            return j
        if k in ("tinyint", "smallint", "int", "bigint", "counter", "varint"):
            if isinstance(j, bool) or not isinstance(j, (int, str)):
                raise TypeError(f"expected an integer, got {j!r}")
            return int(j)
        if k == "decimal":
            return decimal.Decimal(str(j))
        if k in ("float", "double"):
            v = float(j)            # also "NaN", "Infinity", "-Infinity"
            return struct.unpack(">f", struct.pack(">f", v))[0] if k == "float" else v
        if k in ("uuid", "timeuuid"):
            return uuid.UUID(j)
        if k == "inet":
            return ipaddress.ip_address(j)
        if k == "date":
            m = _DATE_RE.match(j)
            if not m:
                raise ValueError(f"not a date: {j!r}")
            days = _days_from_civil(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            return _DATE.decode((days + (1 << 31)).to_bytes(4, "big"))
        if k == "timestamp":
            m = _TIMESTAMP_RE.match(j)
            if not m:
                raise ValueError(f"not a timestamp: {j!r}")
            y, mo, d, h, mi, sec, ms = (int(g) for g in m.groups())
            millis = _days_from_civil(y, mo, d) * 86_400_000 + ((h * 60 + mi) * 60 + sec) * 1000 + ms
            return _TIMESTAMP.decode(millis.to_bytes(8, "big", signed=True))
        if k == "time":
            m = _TIME_RE.match(j)
            if not m:
                raise ValueError(f"not a time: {j!r}")
            h, mi, sec, ns = (int(g) for g in m.groups())
            return CqlTime(((h * 60 + mi) * 60 + sec) * 1_000_000_000 + ns)
        if k == "duration":
            return _parse_duration(j)
        if k in ("list", "vector"):
            return [value_from_json(t.subtypes[0], x) for x in j]
        if k == "set":
            return CqlSet(value_from_json(t.subtypes[0], x) for x in j)
        if k == "map":
            kt, vt = t.subtypes
            items = j.items() if isinstance(j, dict) else j
            pairs = [(value_from_json(kt, a), value_from_json(vt, b)) for a, b in items]
            return CqlMap(pairs) if _hashable_values(kt) else CqlPairs(pairs)
        if k == "tuple":
            vals = list(j) + [None] * (len(t.subtypes) - len(j))
            return tuple(value_from_json(s, x) for s, x in zip(t.subtypes, vals))
        if k == "udt":
            return UdtValue((n, value_from_json(s, j.get(n))) for n, s in zip(t.field_names, t.subtypes))
        if k == "empty":
            raise ValueError("the empty type has only the empty value")
    except CqlValueError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError, decimal.InvalidOperation,
            struct.error) as e:
        raise _bad(t, f"cannot read JSON {j!r}: {e}") from None
    raise SchemaError(f"CQL type {t.cql} ({k}) has no JSON mapping")


def from_json_row(table: TableMetadata, row: Optional[Mapping]) -> Optional[dict]:
    """Inverse of ``to_json_row`` (columns the table no longer has are dropped)."""
    if row is None:
        return None
    out = {}
    for c in _value_columns(table):
        try:
            out[c.name] = value_from_json(c.type, row.get(c.name))
        except CqlValueError as e:
            raise CqlValueError(f"{table.qualified_name}.{c.name}: {e}") from None
    return out


def from_json_key(table: TableMetadata, key: Mapping) -> dict:
    return {c.name: value_from_json(c.type, key.get(c.name)) for c in _key_columns(table)}


def from_json_event(table: TableMetadata, doc: Mapping) -> dict:
    """Inverse of ``to_json_event``: an event dict as ``cdc_lib.state.events`` builds it, e.g. to re-encode a JSON outbox
    row as Avro."""
    before, after = from_json_row(table, doc.get("before")), from_json_row(table, doc.get("after"))
    ref = after if after is not None else before or {}
    return {"id": doc["id"], "op": doc["op"], "key": {c.name: ref.get(c.name) for c in _key_columns(table)},
            "before": before, "after": after, "changed": list(doc.get("changed") or []),
            "source": dict(doc.get("source") or {}), "ts_ms": doc["ts_ms"]}


# --------------------------------------------------------------------------------------- schema evolution

_PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
               ("float", "double"), ("string", "bytes"), ("bytes", "string")}


def _index_names(schema, names: dict, ns: str = "") -> None:
    if isinstance(schema, list):
        for s in schema:
            _index_names(s, names, ns)
    elif isinstance(schema, dict):
        t = schema.get("type")
        if t in ("record", "enum", "fixed", "error"):
            name = schema["name"]
            full = name if "." in name else (f"{ns}.{name}" if ns else name)
            names[full] = schema
            ns = full.rsplit(".", 1)[0] if "." in full else ""
            for f in schema.get("fields", ()):
                _index_names(f["type"], names, ns)
        elif t == "array":
            _index_names(schema["items"], names, ns)
        elif t == "map":
            _index_names(schema["values"], names, ns)
        elif isinstance(t, (dict, list)):
            _index_names(t, names, ns)


def compatibility_problems(writer: dict, reader: dict) -> list:
    """Why data written with ``writer`` cannot be read with ``reader`` (Avro schema resolution); [] if it can.

    Covers what table schemas use: records (fields matched by name; a reader field the writer lacks needs a
    default), unions, arrays, maps, named references, enums/fixed by name and the primitive promotions.
    """
    wn: dict = {}
    rn: dict = {}
    _index_names(writer, wn)
    _index_names(reader, rn)
    problems: list = []
    seen: set = set()

    def resolve(s, names):
        while isinstance(s, str) and s in names:
            s = names[s]
        while isinstance(s, dict) and isinstance(s.get("type"), (dict, list)):
            s = s["type"]
        if isinstance(s, dict) and s.get("type") in names:
            return resolve(s["type"], names)
        return s

    def kind(s):
        if isinstance(s, list):
            return "union"
        if isinstance(s, dict):
            return s["type"]
        return s

    def check(w, r, path) -> bool:
        w, r = resolve(w, wn), resolve(r, rn)
        kw, kr = kind(w), kind(r)
        if kw == "union":
            ok = True
            for branch in w:
                ok &= check(branch, r, path)
            return ok
        if kr == "union":
            for branch in r:
                if check_quiet(w, branch):
                    return True
            same = [b for b in r if kind(resolve(b, rn)) == kw]
            if len(same) == 1:          # say what is wrong inside the branch that should have matched
                return check(w, same[0], path)
            problems.append(f"{path}: writer type {kw} matches no branch of the reader union")
            return False
        if kw != kr and (kw, kr) not in _PROMOTIONS:
            problems.append(f"{path}: writer {kw} cannot be read as {kr}")
            return False
        if kw == "array":
            return check(w["items"], r["items"], path + "[]")
        if kw == "map":
            return check(w["values"], r["values"], path + "{}")
        if kw in ("record", "error"):
            if w["name"].rsplit(".", 1)[-1] != r["name"].rsplit(".", 1)[-1]:
                problems.append(f"{path}: record {w['name']} read as {r['name']}")
                return False
            key = (id(w), id(r))
            if key in seen:             # a recursive record being checked further up
                return True
            seen.add(key)
            wf = {f["name"]: f for f in w["fields"]}
            ok = True
            for f in r["fields"]:
                if f["name"] in wf:
                    ok &= check(wf[f["name"]]["type"], f["type"], f"{path}.{f['name']}")
                elif "default" not in f:
                    problems.append(f"{path}.{f['name']}: reader field missing in writer and has no default")
                    ok = False
            seen.discard(key)
            return ok
        if kw in ("enum", "fixed") and w.get("name", "").rsplit(".", 1)[-1] != r.get("name", "").rsplit(".", 1)[-1]:
            problems.append(f"{path}: {kw} {w.get('name')} read as {r.get('name')}")
            return False
        if kw == "fixed" and w.get("size") != r.get("size"):
            problems.append(f"{path}: fixed size {w.get('size')} read as {r.get('size')}")
            return False
        if kw == "enum":
            missing = set(w["symbols"]) - set(r["symbols"])
            if missing and "default" not in r:
                problems.append(f"{path}: enum symbols {sorted(missing)} unknown to the reader")
                return False
        return True

    def check_quiet(w, r) -> bool:
        n = len(problems)
        ok = check(w, r, "")
        del problems[n:]
        return ok

    check(writer, reader, "")
    return problems
