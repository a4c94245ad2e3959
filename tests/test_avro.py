"""Avro schemas and datums of change events: every CQL type round-trips exactly, schemas evolve compatibly."""
from __future__ import annotations

import datetime
import decimal
import io
import json
import uuid

import fastavro
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.cql.types import EMPTY, CqlDate, CqlTime, CqlTimestamp, Duration
from cdc_lib.errors import CqlValueError
from cdc_lib.sinks.avro import (EMPTY_FIELD, compatibility_problems, field_names, from_avro_envelope, from_avro_key,
                                from_avro_row, from_json_event, from_json_key, from_json_row, schema_change_schema,
                                table_schema_dicts, table_schemas, to_avro_envelope, to_avro_key, to_avro_row,
                                to_json_event, to_json_row, value_from_json)

EVERY_TYPE_CQL = """
CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};
CREATE TYPE ks.addr (street text, "zip code" int, tags frozen<set<text>>, loc frozen<tuple<double, double>>);
CREATE TABLE ks.every (
  pk1 int, pk2 text, ck1 timeuuid, "Ck 2" bigint,
  a ascii, b blob, bo boolean, ti tinyint, si smallint, vi varint, de decimal, f float, d double,
  u uuid, ip inet, dt date, tm time, ts timestamp, du duration,
  l list<int>, s set<text>, m map<text, int>, mi map<int, frozen<list<text>>>,
  mm map<frozen<map<int, text>>, varint>, ms frozen<set<frozen<set<inet>>>>,
  tu tuple<int, text, frozen<tuple<date, decimal>>>, ad addr, ads list<frozen<addr>>, v vector<float, 3>,
  vt vector<text, 2>, st int static,
  PRIMARY KEY ((pk1, pk2), ck1, "Ck 2")) WITH ID = 5a1c395e-b41f-11e5-9f22-ba0be0483c18;
"""


@pytest.fixture(scope="module")
def every():
    return load_cql_schema(EVERY_TYPE_CQL).by_name("ks", "every")


def avro_roundtrip(schema, datum, reader=None):
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, datum)
    buf.seek(0)
    return fastavro.schemaless_reader(buf, schema, reader if reader is not None else schema)


# ------------------------------------------------------------------------------------- value strategies

def values_of(t, nan=True):
    """Python values of CQL type ``t`` over its whole range, canonical as cqltypes decodes them."""
    return _raw(t, nan).map(lambda v: t.decode(t.encode(v)))


def _raw(t, nan=True):
    k = t.kind
    if k == "ascii":
        return st.text(alphabet=st.characters(max_codepoint=127), max_size=8)
    if k == "text":
        return st.text(max_size=8)
    if k == "blob":
        return st.binary(max_size=8)
    if k == "boolean":
        return st.booleans()
    bounds = {"tinyint": 7, "smallint": 15, "int": 31, "bigint": 63}
    if k in bounds:
        b = bounds[k]
        return st.integers(-(1 << b), (1 << b) - 1)
    if k == "varint":
        return st.integers(-(1 << 200), 1 << 200)
    if k == "decimal":
        return st.builds(lambda u, s: decimal.Decimal((int(u < 0), tuple(int(c) for c in str(abs(u))), -s)),
                         st.integers(-(10 ** 40), 10 ** 40), st.integers(-(1 << 31), (1 << 31) - 1))
    if k == "float":
        return st.floats(width=32, allow_nan=nan)
    if k == "double":
        return st.floats(allow_nan=nan)
    if k == "uuid":
        return st.uuids()
    if k == "timeuuid":
        return st.uuids(version=1)
    if k == "inet":
        return st.ip_addresses()
    if k == "date":
        return st.integers(-(1 << 31), (1 << 31) - 1).map(CqlDate)
    if k == "time":
        return st.integers(0, 86_399_999_999_999).map(CqlTime)
    if k == "timestamp":
        return st.integers(-(1 << 63), (1 << 63) - 1).map(CqlTimestamp)
    if k == "duration":
        return st.builds(lambda sign, m, d, n: Duration(sign * m, sign * d, sign * n), st.sampled_from([1, -1]),
                         st.integers(0, (1 << 31) - 1), st.integers(0, (1 << 31) - 1),
                         st.integers(0, (1 << 63) - 1))
    if k == "list":
        return st.lists(_raw(t.subtypes[0], nan), max_size=3)
    if k == "vector":
        return st.lists(_raw(t.subtypes[0], nan), min_size=t.dimension, max_size=t.dimension)
    if k == "set":
        e = t.subtypes[0]
        return st.lists(values_of(e, nan), max_size=3, unique_by=lambda x: e.encode(x))
    if k == "map":
        kt, vt = t.subtypes
        return st.lists(st.tuples(values_of(kt, nan), _raw(vt, nan)), max_size=3, unique_by=lambda p: kt.encode(p[0]))
    if k == "tuple":
        return st.tuples(*(st.none() | _raw(s, nan) for s in t.subtypes))
    if k == "udt":
        return st.fixed_dictionaries({n: st.none() | _raw(s, nan) for n, s in zip(t.field_names, t.subtypes)})
    raise AssertionError(f"no strategy for {t.cql}")


def rows_of(table, nan=True):
    cols = {}
    for c in table.columns.values():
        strat = values_of(c.type, nan)
        if c.kind != "partition_key":
            strat = st.none() | strat
            if not c.type.empty_is_value:   # zero bytes of an int, uuid, ... column: CQL's empty value
                strat = st.just(EMPTY) | strat
        cols[c.name] = strat
    return st.fixed_dictionaries(cols)


def canonical(table, row: dict) -> dict:
    """The row as the decoder would hand it over (cqltypes' canonical Python values)."""
    return {n: v if v is None or v is EMPTY else table.columns[n].type.freeze().decode(
        table.columns[n].type.freeze().encode(v)) for n, v in row.items()}


def same_cql_values(table, a: dict, b: dict) -> bool:
    """Equal as Cassandra sees them: identical serialized bytes (NaN-safe, order-exact)."""
    assert set(a) == set(b)
    for name in a:
        t = table.columns[name].type
        x, y = a[name], b[name]
        if x is None or y is None or x is EMPTY or y is EMPTY:
            assert x is y, name
            continue
        assert t.freeze().encode(x) == t.freeze().encode(y), name
        assert type(x) is type(y), (name, type(x), type(y))
    return True


# ------------------------------------------------------------------------------------------------ tests

# No shrinking: rows of 30 nested columns shrink for minutes, and the assertion already names the column.
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(data=st.data())
def test_every_cql_type_round_trips_through_avro_binary(every, data):
    schemas = table_schemas(every)
    row = data.draw(rows_of(every))
    back = from_avro_row(every, avro_roundtrip(schemas.value, to_avro_row(every, row)))
    same_cql_values(every, row, back)
    key = {c.name: row[c.name] for c in every.partition_key + every.clustering}
    key_back = from_avro_key(every, avro_roundtrip(schemas.key, to_avro_key(every, key)))
    same_cql_values(every, key, key_back)


def test_extreme_values_stay_exact_and_readable(every):
    schemas = table_schemas(every)
    row = {c.name: None for c in every.columns.values()}
    row.update(pk1=-(1 << 31), pk2="", dt=CqlDate(-(1 << 31)), ts=CqlTimestamp((1 << 63) - 1),
               tm=CqlTime(86_399_999_999_999), de=decimal.Decimal("1.50"), vi=-(1 << 100),
               du=Duration(-1, -2, -3), f=float("nan"))
    datum = to_avro_row(every, row)
    assert datum["de"]["scale"] == 2, "decimal keeps its scale: 1.50 is not 1.5"
    assert datum["tm"] == 86_399_999_999_999, "time keeps nanoseconds"
    back = from_avro_row(every, avro_roundtrip(schemas.value, datum))   # fastavro must not choke on year -5877641
    assert back["dt"] == CqlDate(-(1 << 31)) and back["ts"] == CqlTimestamp((1 << 63) - 1)
    assert str(back["de"]) == "1.50" and back["vi"] == -(1 << 100) and back["du"] == Duration(-1, -2, -3)
    same_cql_values(every, row, back)
    d = to_avro_row(every, {**row, "dt": datetime.date(2021, 6, 25), "ts": datetime.datetime(
        2021, 7, 2, 20, 47, 23, 123000, tzinfo=datetime.timezone.utc)})
    assert d["dt"] == 18803 and d["ts"] == 1625258843123


def test_key_and_value_field_rules(every):
    schemas = table_schema_dicts(every)
    value = {f["name"]: f for f in schemas.value["fields"]}
    assert not isinstance(value["pk1"]["type"], list) and not isinstance(value["pk2"]["type"], list)
    for name, f in value.items():
        if name in ("pk1", "pk2", EMPTY_FIELD):
            continue
        assert f["type"][0] == "null" and f["default"] is None, name
    assert value["Ck_2"]["cql_name"] == "Ck 2"
    key = [f["name"] for f in schemas.key["fields"]]
    assert key == ["pk1", "pk2", "ck1", "Ck_2", EMPTY_FIELD]
    # SELECT * order: key columns first, then the rest by name
    assert list(value)[:4] == ["pk1", "pk2", "ck1", "Ck_2"] and list(value)[4:7] == ["a", "ad", "ads"]
    with pytest.raises(CqlValueError):
        to_avro_row(every, {"pk1": None, "pk2": "x"})


def test_field_names_are_valid_and_stable():
    m = field_names(["a b", "a_b", "1x", "ok", "_cql_empty"])
    assert m["a_b"] == "a_b" and m["a b"] == "a_b_2" and m["1x"] == "_1x" and m["ok"] == "ok"
    assert m["_cql_empty"] != "_cql_empty"
    assert field_names(["ok", "a b"])["a b"] == field_names(["a b", "ok", "zz"])["a b"]


def test_empty_values_are_kept_apart_from_null(every):
    schemas = table_schemas(every)
    row = {c.name: None for c in every.columns.values()}
    row.update(pk1=1, pk2="k", f=EMPTY, u=EMPTY, st=None)
    datum = avro_roundtrip(schemas.value, to_avro_row(every, row))
    assert sorted(datum[EMPTY_FIELD]) == ["f", "u"]
    back = from_avro_row(every, datum)
    assert back["f"] is EMPTY and back["u"] is EMPTY and back["st"] is None
    key = from_avro_key(every, avro_roundtrip(schemas.key, to_avro_key(every, {"pk1": EMPTY, "pk2": "k"})))
    assert key["pk1"] is EMPTY and key["ck1"] is None


def test_null_inside_a_collection_is_refused(every):
    with pytest.raises(CqlValueError, match="ks.every.l"):
        to_avro_row(every, {"pk1": 1, "pk2": "k", "l": [1, None]})


def _table(cql_columns: str):
    return load_cql_schema(
        "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};\n"
        f"CREATE TABLE ks.t ({cql_columns}) WITH ID = 5a1c395e-b41f-11e5-9f22-ba0be0483c19;").by_name("ks", "t")


def test_adding_and_dropping_columns_keeps_old_and_new_data_readable():
    v1 = _table("id int, ck int, a text, b int, PRIMARY KEY (id, ck)")
    v2 = _table("id int, ck int, a text, c map<int, text>, PRIMARY KEY (id, ck)")   # b dropped, c added
    s1, s2 = table_schemas(v1), table_schemas(v2)
    old = to_avro_envelope(v1, event(v1, {"id": 1, "ck": 2, "a": "x", "b": 7}))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, s1.envelope, old)
    read_new = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), s1.envelope, s2.envelope)
    assert from_avro_row(v2, read_new["after"]) == {"id": 1, "ck": 2, "a": "x", "c": None}
    new = to_avro_envelope(v2, event(v2, {"id": 1, "ck": 2, "a": "y", "c": {1: "z"}}))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, s2.envelope, new)
    read_old = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), s2.envelope, s1.envelope)
    assert from_avro_row(v1, read_old["after"]) == {"id": 1, "ck": 2, "a": "y", "b": None}
    d1, d2 = table_schema_dicts(v1), table_schema_dicts(v2)
    for w, r in ((d1, d2), (d2, d1)):
        assert compatibility_problems(w.envelope, r.envelope) == []
        assert compatibility_problems(w.key, r.key) == []


def test_compatibility_check_finds_real_breaks():
    v1 = table_schema_dicts(_table("id int PRIMARY KEY, a int"))
    retyped = table_schema_dicts(_table("id int PRIMARY KEY, a text"))
    new_key = table_schema_dicts(_table("id int, k2 int, a int, PRIMARY KEY ((id, k2))"))
    assert any(".after" in p and "a" in p for p in compatibility_problems(v1.envelope, retyped.envelope))
    assert any("k2" in p and "default" in p for p in compatibility_problems(v1.key, new_key.key))
    # int -> bigint is an Avro promotion: old data stays readable
    widened = table_schema_dicts(_table("id int PRIMARY KEY, a bigint"))
    assert compatibility_problems(v1.value, widened.value) == []
    assert compatibility_problems(widened.value, v1.value) != []


def event(table, after, before=None, op=None):
    key = {c.name: (after or before)[c.name] for c in table.partition_key + table.clustering}
    return {"id": uuid.uuid4().hex, "op": op or ("c" if before is None else "u"), "key": key,
            "before": before, "after": after, "changed": sorted(after or {}),
            "source": {"connector": "cassandra-cdc", "cluster": "c1", "node": "n1", "keyspace": table.keyspace,
                       "table": table.name, "segment": "CommitLog-7-1.log", "position": 1234,
                       "ts_us": 1_700_000_000_000_001, "expired": False},
            "ts_ms": 1_700_000_000_123}


def test_envelope_round_trip(every):
    schemas = table_schemas(every)
    before = {c.name: None for c in every.columns.values()}
    before.update(pk1=1, pk2="k", ck1=uuid.uuid1(), **{"Ck 2": 5}, m={"x": 1}, ad={"street": "s", "zip code": 9})
    before = canonical(every, before)
    after = canonical(every, dict(before, m={"x": 2}, st=4))
    ev = event(every, after, before)
    ev["changed"] = ["m", "st"]
    back = from_avro_envelope(every, avro_roundtrip(schemas.envelope, to_avro_envelope(every, ev)))
    assert back["op"] == "u" and back["id"] == ev["id"] and back["changed"] == ["m", "st"]
    assert back["ts_ms"] == ev["ts_ms"] and back["key"] == ev["key"]
    assert back["source"] == dict(ev["source"], snapshot=False)
    same_cql_values(every, back["after"], after)
    same_cql_values(every, back["before"], before)
    delete = event(every, None, after, op="d")
    back = from_avro_envelope(every, avro_roundtrip(schemas.envelope, to_avro_envelope(every, delete)))
    assert back["after"] is None and back["key"] == delete["key"]
    with pytest.raises(CqlValueError):
        to_avro_envelope(every, dict(ev, op="x"))


def test_json_event_is_strict_json_with_exact_values(every):
    row = {c.name: None for c in every.columns.values()}
    row.update(pk1=1, pk2="k", de=decimal.Decimal("1.50"), vi=1 << 80, d=float("inf"), b=b"\x01\xff",
               mi={2: ["a"]}, ts=CqlTimestamp(-(1 << 62)), f=EMPTY)
    ev = event(every, row)
    text = json.dumps(to_json_event(every, ev), allow_nan=False)
    back = json.loads(text)
    a = back["after"]
    assert a["de"] == "1.50" and a["vi"] == str(1 << 80) and a["d"] == "Infinity" and a["b"] == "0x01ff"
    assert a["mi"] == [[2, ["a"]]] and a["f"] == {"$empty": True}
    assert back["before"] is None and back["op"] == "c" and back["source"]["position"] == 1234
    assert list(to_json_row(every, row))[:4] == ["pk1", "pk2", "ck1", "Ck 2"]


def test_schema_change_schema():
    s = fastavro.parse_schema(schema_change_schema())
    datum = {"id": "x1", "keyspace": "ks", "table": "t", "kind": "alter_table", "detail": "ADD c int",
             "table_id": str(uuid.uuid4()), "ts_us": 5, "ts_ms": 6}
    assert avro_roundtrip(s, datum) == datum


def test_events_from_the_event_builder_round_trip_including_a_static_only_row():
    from cdc_lib.celllog.schema import encode_clustering
    from cdc_lib.commitlog.model import NO_DELETION_TIME
    from cdc_lib.state.events import apply_batch
    table = _table("pk int, ck int, v int, tags set<int>, st int static, PRIMARY KEY (pk, ck)")
    INT = table.columns["pk"].type
    n = [0]

    def rec(kind, ts, c=None, column=None, value=None, is_static=False, path=None):
        n[0] += 1
        return {"kind": kind, "timestamp": ts, "clustering": b"" if c is None else encode_clustering([INT.encode(c)]),
                "column": column, "value": value, "ttl": 0, "local_deletion_time": NO_DELETION_TIME, "path": path,
                "is_static": is_static, "clustering_end": None, "start_inclusive": None, "end_inclusive": None,
                "partition_key": INT.encode(1), "segment": "CommitLog-7-1.log", "segment_id": 1, "position": n[0],
                "entry_index": 0, "seq": 0}

    states: dict = {}
    events = apply_batch(table, states, [rec("cell", 10, None, "st", INT.encode(3), is_static=True)], 1000)
    events += apply_batch(table, states, [rec("row_liveness", 11, 1), rec("cell", 11, 1, "v", INT.encode(5)),
                                          rec("cell", 11, 1, "tags", b"", path=INT.encode(9))], 1000)
    assert [e["op"] for e in events] == ["c", "d", "c"], "static-only row created, then replaced by row ck=1"
    assert events[0]["key"] == {"pk": 1, "ck": None}
    schemas = table_schemas(table)
    for ev in events:
        back = from_avro_envelope(table, avro_roundtrip(schemas.envelope, to_avro_envelope(table, ev)))
        assert {k: back[k] for k in ("id", "op", "key", "before", "after", "changed", "ts_ms")} == \
            {k: ev[k] for k in ("id", "op", "key", "before", "after", "changed", "ts_ms")}
        key = from_avro_key(table, avro_roundtrip(schemas.key, to_avro_key(table, ev["key"])))
        assert key == ev["key"]
    assert events[-1]["after"]["tags"] == (9,)


@pytest.mark.parametrize("column", list("abcdefghi"))
def test_empty_partition_key_component_of_any_type_round_trips(column):
    import ipaddress
    table = _table("a uuid, b decimal, c frozen<tuple<int, text>>, d duration, e inet, f date, g timestamp, "
                   "h frozen<map<int, int>>, i decimal, v int, PRIMARY KEY ((a, b, c, d, e, f, g, h, i))")
    key = canonical(table, {"a": uuid.uuid4(), "b": decimal.Decimal("1.0"), "c": (1, "x"), "d": Duration(1, 1, 1),
                            "e": ipaddress.ip_address("::1"), "f": datetime.date(2020, 1, 1),
                            "g": datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc), "h": {1: 2},
                            "i": decimal.Decimal("-3")})
    key[column] = EMPTY
    back = from_avro_key(table, avro_roundtrip(table_schemas(table).key, to_avro_key(table, key)))
    same_cql_values(table, key, back)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(data=st.data())
def test_every_cql_type_round_trips_through_json(every, data):
    """JSON (the outbox form) reads back to the same values, so a JSON outbox can be re-encoded as Avro."""
    row = data.draw(rows_of(every, nan=False))
    back = from_json_row(every, json.loads(json.dumps(to_json_row(every, row), allow_nan=False)))
    same_cql_values(every, row, back)
    key = {c.name: row[c.name] for c in every.partition_key + every.clustering}
    same_cql_values(every, key, from_json_key(every, json.loads(json.dumps(
        {k: every.columns[k].type.to_json(v) for k, v in key.items()}))))


def test_json_special_values():
    import math

    from cdc_lib.cql.types import parse_type
    assert math.isnan(value_from_json(parse_type("double"), "NaN"))
    assert value_from_json(parse_type("float"), "-Infinity") == float("-inf")
    assert value_from_json(parse_type("date"), "-5877641-06-23") == CqlDate(-(1 << 31))
    assert value_from_json(parse_type("timestamp"), "+292278994-08-17T07:12:55.807Z") == CqlTimestamp((1 << 63) - 1)
    assert value_from_json(parse_type("duration"), "-1y2mo3d4h5m6s7ms8us9ns") == Duration(-14, -3, -14_706_007_008_009)
    assert value_from_json(parse_type("int"), {"$empty": True}) is EMPTY
    for bad_type, bad in (("int", "x"), ("date", "2020-1-1"), ("duration", "5x"), ("blob", "abc"),
                          ("boolean", 1), ("int", True)):
        with pytest.raises(CqlValueError):
            value_from_json(parse_type(bad_type), bad)


def test_json_outbox_event_re_encodes_as_avro(every):
    """What the pipeline needs to publish Avro from the JSON outbox: JSON event -> typed event -> Avro."""
    row = {c.name: None for c in every.columns.values()}
    row.update(pk1=1, pk2="k", de=decimal.Decimal("1.50"), ts=CqlTimestamp(-(1 << 62)), tm=CqlTime(5),
               mm=[({1: "a"}, 10 ** 30)], f=EMPTY)
    row = canonical(every, row)
    ev = event(every, row)
    doc = json.loads(json.dumps(to_json_event(every, ev)))
    typed = from_json_event(every, doc)
    assert typed["key"] == ev["key"] and typed["id"] == ev["id"] and typed["source"]["position"] == 1234
    back = from_avro_envelope(every, avro_roundtrip(table_schemas(every).envelope, to_avro_envelope(every, typed)))
    same_cql_values(every, back["after"], row)
