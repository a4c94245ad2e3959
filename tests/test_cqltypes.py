"""CQL type registry: codecs round-trip, parse_type reads both type-string forms, bad bytes raise CqlValueError."""
from __future__ import annotations

import copy
import datetime
import decimal
import hashlib
import ipaddress
import json
import pickle
import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_lib.cql import types as ct
from cdc_lib.cql.types import (EMPTY, CounterShard, CounterValue, CqlDate, CqlMap, CqlPairs, CqlSet, CqlTime,
                               CqlTimestamp, CqlType, Duration, UdtValue, composite_decode, composite_encode,
                               counter_total, decode_counter_context, encode_counter_context, parse_type, udt_type)
from cdc_lib.errors import CqlValueError, SchemaError

UTC = datetime.timezone.utc
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SCALAR_NAMES = ["ascii", "text", "blob", "boolean", "tinyint", "smallint", "int", "bigint", "varint", "decimal",
                "float", "double", "uuid", "timeuuid", "inet", "date", "time", "timestamp", "duration"]
SCALARS = [parse_type(n) for n in SCALAR_NAMES]


# ---- strategies -----------------------------------------------------------------------------------------------

def _udt(fields):
    names = [f"f{i}" for i in range(len(fields))]
    # The name is derived from the structure, so equal names in one type tree always mean equal types.
    digest = hashlib.sha1(repr([f.cql for f in fields]).encode()).hexdigest()[:8]
    return udt_type("ks", f"u_{digest}", names, fields, frozen=True)


def cql_types(depth=3):
    """Types nested up to ``depth`` levels of frozen collections, tuples, UDTs and vectors."""
    scalar = st.sampled_from(SCALARS)
    if depth == 0:
        return scalar
    child = cql_types(depth - 1)
    makers = {
        "scalar": lambda: scalar,
        "list": lambda: child.map(lambda t: ct.ListType(t)),
        "set": lambda: child.map(lambda t: ct.SetType(t)),
        "map": lambda: st.tuples(child, child).map(lambda kv: ct.MapType(*kv)),
        "tuple": lambda: st.lists(child, min_size=1, max_size=3).map(ct.TupleType),
        "udt": lambda: st.lists(child, min_size=1, max_size=3).map(_udt),
        "vector": lambda: st.tuples(child, st.integers(1, 4)).map(lambda tn: ct.VectorType(*tn)),
    }
    # Choosing the kind first keeps every kind equally likely (st.one_of favours its first branches).
    return st.sampled_from(sorted(makers)).flatmap(lambda k: makers[k]())


_DATE_MIN_DAYS = datetime.date.min.toordinal() - datetime.date(1970, 1, 1).toordinal()
_DATE_MAX_DAYS = datetime.date.max.toordinal() - datetime.date(1970, 1, 1).toordinal()
_TS_MIN_MS = -62135596800000                 # 0001-01-01T00:00:00Z
_TS_MAX_MS = 253402300799999                 # 9999-12-31T23:59:59.999Z


def _decimals():
    return st.tuples(st.integers(-10 ** 40, 10 ** 40), st.integers(-2 ** 31, 2 ** 31 - 1)).map(
        lambda us: decimal.Decimal((1 if us[0] < 0 else 0, tuple(int(c) for c in str(abs(us[0]))), -us[1])))


def _durations():
    pos = st.tuples(st.integers(0, 2 ** 31 - 1), st.integers(0, 2 ** 31 - 1), st.integers(0, 2 ** 63 - 1))
    return st.one_of(pos.map(lambda m: Duration(*m)), pos.map(lambda m: Duration(-m[0], -m[1], -m[2])))


SCALAR_VALUES = {
    "ascii": st.text(st.characters(max_codepoint=127), max_size=20),
    "text": st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
    "blob": st.binary(max_size=20),
    "boolean": st.booleans(),
    "tinyint": st.integers(-2 ** 7, 2 ** 7 - 1),
    "smallint": st.integers(-2 ** 15, 2 ** 15 - 1),
    "int": st.integers(-2 ** 31, 2 ** 31 - 1),
    "bigint": st.integers(-2 ** 63, 2 ** 63 - 1),
    "varint": st.one_of(st.integers(), st.integers(-10 ** 300, 10 ** 300)),
    "decimal": _decimals(),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "uuid": st.uuids(),
    "timeuuid": st.uuids(version=1),
    "inet": st.ip_addresses(),
    "date": st.one_of(st.dates(), st.integers(-2 ** 31, _DATE_MIN_DAYS - 1).map(CqlDate),
                      st.integers(_DATE_MAX_DAYS + 1, 2 ** 31 - 1).map(CqlDate)),
    "time": st.integers(0, 86_399_999_999_999).map(CqlTime),
    "timestamp": st.one_of(
        st.datetimes(timezones=st.just(UTC)).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)),
        st.integers(-2 ** 63, _TS_MIN_MS - 1).map(CqlTimestamp),
        st.integers(_TS_MAX_MS + 1, 2 ** 63 - 1).map(CqlTimestamp)),
    "duration": _durations(),
}


def _distinct(t, values):
    """Values with distinct encodings (and distinct Python keys when hashable), as sets and map keys need."""
    seen, out = set(), []
    for v in values:
        b = t.encode(v)
        if b in seen:
            continue
        try:
            if any(v == o for o in out):
                continue
        except TypeError:
            pass
        seen.add(b)
        out.append(v)
    return out


def values_of(t, nullable=False):
    if t.kind in SCALAR_VALUES:
        s = SCALAR_VALUES[t.kind]
    elif t.kind == "list":
        s = st.lists(values_of(t.subtypes[0]), max_size=3)
    elif t.kind == "set":
        s = st.lists(values_of(t.subtypes[0]), max_size=3).map(lambda vs: CqlSet(_distinct(t.subtypes[0], vs)))
    elif t.kind == "map":
        kt, vt = t.subtypes
        box = CqlMap if ct._hashable_values(kt) else CqlPairs

        def build(pairs):
            keys = _distinct(kt, [k for k, _ in pairs])
            chosen = [next(p for p in pairs if p[0] is k) for k in keys]
            return box(chosen) if box is CqlMap else CqlPairs(tuple(p) for p in chosen)
        s = st.lists(st.tuples(values_of(kt), values_of(vt)), max_size=3).map(build)
    elif t.kind == "tuple":
        s = st.tuples(*[values_of(f, nullable=True) for f in t.subtypes])
    elif t.kind == "udt":
        s = st.tuples(*[values_of(f, nullable=True) for f in t.subtypes]).map(
            lambda vs: UdtValue(zip(t.field_names, vs)))
    elif t.kind == "vector":
        s = st.lists(values_of(t.subtypes[0]), min_size=t.dimension, max_size=t.dimension)
    else:
        raise AssertionError(t.cql)
    return st.one_of(st.none(), s) if nullable else s


def _udts_in(t, acc=None):
    acc = {} if acc is None else acc
    if t.kind == "udt":
        acc[(t.keyspace, t.name)] = t
    for s in t.subtypes:
        _udts_in(s, acc)
    return acc


# ---- round trips ----------------------------------------------------------------------------------------------

@PROPERTY
@given(st.data())
def test_round_trip_every_type_nested_to_depth_3(data):
    t = data.draw(cql_types(3), label="type")
    v = data.draw(values_of(t), label="value")
    b = t.encode(v)
    back = t.decode(b)
    assert back == v
    assert t.encode(back) == b
    if t.fixed_length is not None:
        assert len(b) == t.fixed_length
    json.dumps(t.to_json(back), allow_nan=False)


@PROPERTY
@given(st.data())
def test_type_strings_round_trip_through_cql_and_marshal_forms(data):
    t = data.draw(cql_types(3), label="type")
    udts = _udts_in(t)
    assert parse_type(t.cql, "ks", udts) == t
    assert parse_type(t.marshal) == t
    assert hash(parse_type(t.marshal)) == hash(t)
    assert pickle.loads(pickle.dumps(t)) == t


@PROPERTY
@given(st.data())
def test_non_frozen_collections_round_trip_through_cells(data):
    child = data.draw(cql_types(1), label="element")
    kind = data.draw(st.sampled_from(["list", "set", "map", "udt"]))
    if kind == "list":
        t = parse_type(f"list<{child.cql}>", "ks", _udts_in(child))
    elif kind == "set":
        t = parse_type(f"set<{child.cql}>", "ks", _udts_in(child))
    elif kind == "map":
        t = parse_type(f"map<{child.cql}, {child.cql}>", "ks", _udts_in(child))
    else:
        t = _udt([child, child]).__class__("ks", "u", ["a", "b"], [child, child], multicell=True)
    assert t.multicell and t.fixed_length is None
    v = data.draw(values_of(t.freeze()), label="value")
    if kind == "udt":
        v = UdtValue(v)
    cells = t.encode_cells(v)
    assert t.decode_cells(cells) == v
    for path, value in cells:
        assert t.path_type.decode(path) is not None
        et = t.element_value_type(path)
        if et is None:
            assert kind == "set" and value == b""
        else:
            et.decode(value)
    if kind == "list":
        times = [uuid.UUID(bytes=p).time for p, _ in cells]
        assert times == sorted(set(times))
    # Single-cell (frozen) serialization of the same value agrees.
    assert t.decode(t.freeze().encode(v)) == v


# ---- scalars: exactness details -------------------------------------------------------------------------------

def test_fixed_lengths_follow_cassandra_value_length_if_fixed():
    fixed = {n: parse_type(n).fixed_length for n in SCALAR_NAMES + ["counter", "empty"]}
    assert fixed == {"ascii": None, "text": None, "blob": None, "boolean": 1, "tinyint": None, "smallint": None,
                     "int": 4, "bigint": 8, "varint": None, "decimal": None, "float": 4, "double": 8, "uuid": 16,
                     "timeuuid": 16, "inet": None, "date": None, "time": None, "timestamp": 8, "duration": None,
                     "counter": None, "empty": 0}
    assert parse_type("vector<float, 3>").fixed_length == 12
    assert parse_type("vector<text, 3>").fixed_length is None
    assert parse_type("frozen<list<int>>").fixed_length is None
    assert parse_type("'org.apache.cassandra.db.marshal.LexicalUUIDType'").fixed_length == 16


def test_empty_values():
    assert repr(EMPTY) == "EMPTY"
    assert copy.deepcopy(EMPTY) is EMPTY and pickle.loads(pickle.dumps(EMPTY)) is EMPTY
    for name in ["int", "bigint", "uuid", "timestamp", "varint", "decimal", "inet", "date", "duration",
                 "frozen<list<int>>", "frozen<tuple<int>>", "boolean", "double", "empty", "counter"]:
        t = parse_type(name)
        assert t.decode(b"") is EMPTY
        assert t.encode(EMPTY) == b""
        assert t.to_json(EMPTY) == {"$empty": True}
    assert parse_type("text").decode(b"") == ""
    assert parse_type("ascii").decode(b"") == ""
    assert parse_type("blob").decode(b"") == b""
    # An empty element inside a collection is EMPTY too, and re-encodes to the same bytes.
    t = parse_type("frozen<list<int>>")
    b = struct.pack(">ii", 1, 0)
    assert t.decode(b) == [EMPTY] and t.encode([EMPTY]) == b
    assert parse_type("empty").encode(EMPTY) == b""
    with pytest.raises(CqlValueError):
        parse_type("empty").decode(b"\x00")


def test_null_elements_inside_tuples_udts_and_collections():
    t = parse_type("frozen<tuple<int, text>>")
    b = struct.pack(">ii", 4, 7) + struct.pack(">i", -1)
    assert t.decode(b) == (7, None)
    assert t.encode((7, None)) == b
    lt = parse_type("frozen<list<int>>")
    assert lt.decode(struct.pack(">ii", 1, -1)) == [None]
    assert t.to_json((7, None)) == [7, None]


def test_decimals_keep_precision_and_scale():
    t = parse_type("decimal")
    for text, scale in [("2.71828", 5), ("1.00", 2), ("1.23E+5", -3), ("0E+10", -10), ("-0.000001", 6),
                        ("1E-2147483648", 2147483648 - 0), ("123456789012345678901234567890.123456789", 9)]:
        d = decimal.Decimal(text)
        if scale > 2 ** 31 - 1:
            with pytest.raises(CqlValueError):
                t.encode(d)
            continue
        b = t.encode(d)
        assert struct.unpack(">i", b[:4])[0] == scale
        back = t.decode(b)
        assert back.as_tuple() == d.as_tuple() or (not any(d.as_tuple().digits) and back == d)
        assert t.to_json(back) == str(d)
    assert t.encode(decimal.Decimal("2.71828")) == bytes.fromhex("000000050425d4")   # bytes in the corpus
    with pytest.raises(CqlValueError):
        t.encode(decimal.Decimal("NaN"))
    with pytest.raises(CqlValueError):
        t.decode(b"\x00\x00\x00\x05")          # no unscaled value


def test_varints_of_hundreds_of_digits_and_their_json():
    t = parse_type("varint")
    big = -(7 ** 700)
    assert t.decode(t.encode(big)) == big
    assert t.encode(0) == b"\x00" and t.encode(-1) == b"\xff" and t.encode(128) == b"\x00\x80"
    assert t.to_json(2 ** 53 - 1) == 2 ** 53 - 1
    assert t.to_json(2 ** 53) == str(2 ** 53)
    assert t.to_json(big) == str(big)


@PROPERTY
@given(st.integers(-2 ** 200, 2 ** 200))
def test_varint_bytes_are_minimal_twos_complement_like_java_biginteger(v):
    b = parse_type("varint").encode(v)
    assert int.from_bytes(b, "big", signed=True) == v
    # Minimal: the first byte is not a redundant sign-extension byte.
    assert len(b) == 1 or not ((b[0] == 0x00 and b[1] < 0x80) or (b[0] == 0xFF and b[1] >= 0x80))


def test_varint_boundaries():
    t = parse_type("varint")
    assert [t.encode(v).hex() for v in (127, 128, 255, -128, -129, -256, 54321)] == \
        ["7f", "0080", "00ff", "80", "ff7f", "ff00", "00d431"]


def test_float32_exactness_nan_bits_and_json():
    t = parse_type("float")
    for hexbits in ["7f800001", "7fc00001", "ffa00000", "7fc00000", "ff800000", "00000001", "80000000"]:
        b = bytes.fromhex(hexbits)
        assert t.encode(t.decode(b)) == b
    assert t.to_json(t.decode(bytes.fromhex("40c8f5c3"))) == 6.28
    assert t.to_json(float("nan")) == "NaN"
    assert t.to_json(float("-inf")) == "-Infinity"
    assert parse_type("double").to_json(float("inf")) == "Infinity"
    assert parse_type("double").to_json(3.14159) == 3.14159
    with pytest.raises(CqlValueError):
        t.encode(1e300)
    # Float.MAX_VALUE, written by a real Cassandra 5.0: its shorter decimals round past it (used to raise)
    max_float = t.decode(bytes.fromhex("7f7fffff"))
    assert t.to_json(max_float) == 3.4028235e38
    assert t.encode(t.decode(bytes.fromhex("ff7fffff"))) == bytes.fromhex("ff7fffff")
    assert t.to_json(t.decode(bytes.fromhex("ff7fffff"))) == -3.4028235e38


def test_temporal_values_and_their_strings():
    date = parse_type("date")
    assert date.decode(b"\x80\x00\x00\x00") == datetime.date(1970, 1, 1)
    assert date.decode(b"\x00\x00\x00\x00") == CqlDate(-2 ** 31)
    assert str(CqlDate(-2 ** 31)) == "-5877641-06-23"
    assert str(CqlDate(2 ** 31 - 1)) == "+5881580-07-11"
    assert date.to_json(datetime.date(2021, 6, 25)) == "2021-06-25"
    time_t = parse_type("time")
    assert str(CqlTime(9_990_000_000_001)) == "02:46:30.000000001"
    assert time_t.encode(datetime.time(2, 46, 30)) == time_t.encode(CqlTime(9_990_000_000_000))
    ts = parse_type("timestamp")
    v = ts.decode(struct.pack(">q", 1625258843000))
    assert v == datetime.datetime(2021, 7, 2, 20, 47, 23, tzinfo=UTC) and v.tzinfo is not None
    assert ts.to_json(v) == "2021-07-02T20:47:23.000Z"
    assert ts.to_json(ts.decode(struct.pack(">q", -1))) == "1969-12-31T23:59:59.999Z"
    far = ts.decode(struct.pack(">q", 2 ** 63 - 1))
    assert far == CqlTimestamp(2 ** 63 - 1) and ts.to_json(far) == "+292278994-08-17T07:12:55.807Z"
    # naive datetimes are taken as UTC; sub-millisecond digits are floored
    assert ts.encode(datetime.datetime(1970, 1, 1, 0, 0, 0, 1999)) == struct.pack(">q", 1)


@pytest.mark.parametrize("d, text", [
    (Duration(0, 0, 45_000_050_000_000), "12h30m50ms"),
    (Duration(14, 3, 0), "1y2mo3d"),
    (Duration(-1, -2, -3), "-1mo2d3ns"),
    (Duration(0, 0, 1_001_001_001), "1s1ms1us1ns"),
    (Duration(0, 0, 0), "0s"),
])
def test_duration_literals(d, text):
    t = parse_type("duration")
    assert str(d) == text
    assert t.to_json(d) == text
    assert t.decode(t.encode(d)) == d


def test_duration_rejects_mixed_signs_and_encodes_timedelta():
    t = parse_type("duration")
    with pytest.raises(CqlValueError):
        t.encode(Duration(1, -1, 0))
    assert t.decode(t.encode(datetime.timedelta(hours=12, minutes=30, milliseconds=50))) == \
        Duration(0, 0, 45_000_050_000_000)
    assert t.encode(Duration(0, 0, 45_000_050_000_000)) == bytes.fromhex("0000fc51dac7fd8100")  # corpus bytes


def test_uuid_inet_boolean_blob_json():
    assert parse_type("uuid").to_json(uuid.UUID("0CE82E94-0AA4-497A-83C2-D8F0E0687F12")) == \
        "0ce82e94-0aa4-497a-83c2-d8f0e0687f12"
    inet = parse_type("inet")
    assert inet.decode(inet.encode("::1")) == ipaddress.IPv6Address("::1")
    assert inet.to_json(ipaddress.IPv4Address("127.0.0.1")) == "127.0.0.1"
    assert parse_type("blob").to_json(b"\x00\x04\xd2") == "0x0004d2"
    assert parse_type("boolean").to_json(True) is True
    assert parse_type("boolean").decode(b"\x02") is True
    with pytest.raises(CqlValueError):
        parse_type("timeuuid").encode(uuid.uuid4())


# ---- collections, UDTs, vectors -------------------------------------------------------------------------------

def test_sets_and_maps_given_as_python_sets_and_dicts_are_sorted_like_cassandra():
    st_int = parse_type("frozen<set<int>>")
    assert st_int.decode(st_int.encode({2914, 4, 17})) == CqlSet((4, 17, 2914))
    assert st_int.decode(st_int.encode({-1, 1})) == CqlSet((-1, 1))                 # signed, not byte order
    st_text = parse_type("frozen<set<text>>")
    assert list(st_text.decode(st_text.encode({"b", "a", "B"}))) == ["B", "a", "b"]
    st_float = parse_type("frozen<set<double>>")
    assert list(st_float.decode(st_float.encode({1.5, -2.0, 0.0}))) == [-2.0, 0.0, 1.5]
    m = parse_type("frozen<map<bigint, text>>")
    assert list(m.decode(m.encode({10: "x", -5: "y"})).items()) == [(-5, "y"), (10, "x")]
    # A CqlSet / CqlMap is kept in its own order (it is what decode produced).
    assert st_int.encode(CqlSet((17, 4))) == struct.pack(">iiiii", 2, 4, 17, 4, 4)
    with pytest.raises(CqlValueError):
        st_int.encode([1, 1])


def test_map_json_is_an_object_only_for_text_keys_and_unhashable_keys_give_pairs():
    m = parse_type("frozen<map<text, int>>")
    assert m.to_json(CqlMap({"a": 1})) == {"a": 1}
    mi = parse_type("map<int, frozen<list<int>>>")
    assert mi.to_json(CqlMap({42: [1]})) == [[42, [1]]]
    ml = parse_type("frozen<map<frozen<list<int>>, int>>")
    v = ml.decode(ml.encode([([2], 1), ([1], 0)]))
    assert isinstance(v, CqlPairs) and v == (([1], 0), ([2], 1))
    assert ml.to_json(v) == [[[1], 0], [[2], 1]]


def test_udt_with_missing_trailing_fields_round_trips_bytes():
    t = udt_type("ks", "address", ["street", "zip", "extra"],
                 [parse_type("text"), parse_type("int"), parse_type("frozen<list<int>>")], frozen=True)
    b = struct.pack(">i", 3) + b"elm"                  # written before ALTER TYPE ADD zip, extra
    v = t.decode(b)
    assert v == {"street": "elm", "zip": None, "extra": None}
    assert v.street == "elm" and v["zip"] is None and list(v) == ["street", "zip", "extra"]
    assert t.encode(v) == b
    full = t.encode(UdtValue(street="elm"))
    assert full == b + b"\xff\xff\xff\xff" * 2
    assert t.decode(full) == v
    assert t.to_json(v) == {"street": "elm", "zip": None, "extra": None}
    with pytest.raises(CqlValueError):
        t.encode({"nope": 1})
    assert hash(v) == hash(t.decode(full))
    assert pickle.loads(pickle.dumps(v)) == v


def test_non_frozen_udt_cells():
    t = udt_type("ks", "address", ["street", "zip"], [parse_type("text"), parse_type("int")])
    assert t.multicell and t.cql == "address" and t.freeze().cql == "frozen<address>"
    assert t.path_type == parse_type("smallint")
    assert t.element_value_type(b"\x00\x01") == parse_type("int")
    cells = [(b"\x00\x01", struct.pack(">i", 7))]
    assert t.decode_cells(cells) == {"street": None, "zip": 7}
    assert t.encode_cells(UdtValue(street=None, zip=7)) == cells
    with pytest.raises(CqlValueError):
        t.element_value_type(b"\x00\x05")
    with pytest.raises(CqlValueError):
        t.element_value_type(b"\x01")


def test_complex_type_structure():
    lt, sett, mt = parse_type("list<text>"), parse_type("set<int>"), parse_type("map<text, int>")
    assert lt.path_type == parse_type("timeuuid") and lt.element_value_type(b"x" * 16) == parse_type("text")
    assert sett.path_type == parse_type("int") and sett.element_value_type(b"\0\0\0\1") is None
    assert mt.path_type == parse_type("text") and mt.element_value_type(b"k") == parse_type("int")
    assert mt.subtypes == (parse_type("text"), parse_type("int")) and mt.kind == "map"
    assert mt.freeze() == parse_type("frozen<map<text, int>>") and not mt.freeze().multicell
    assert mt != mt.freeze()
    frozen = parse_type("frozen<list<int>>")
    assert frozen.path_type is None
    with pytest.raises(CqlValueError):
        frozen.decode_cells([])


def test_vectors():
    fv = parse_type("vector<float, 3>")
    assert fv.kind == "vector" and fv.dimension == 3 and fv.subtypes == (parse_type("float"),)
    assert fv.encode([1.0, 2.0, 3.0]) == struct.pack(">fff", 1, 2, 3)
    tv = parse_type("vector<text, 2>")
    assert tv.encode(["a", ""]) == b"\x01a\x00"
    assert tv.decode(b"\x01a\x00") == ["a", ""]
    with pytest.raises(CqlValueError):
        fv.encode([1.0, 2.0])
    with pytest.raises(CqlValueError):
        fv.decode(b"\x00" * 11)
    with pytest.raises(CqlValueError):
        tv.decode(b"\x05a\x00")


# ---- counters ---------------------------------------------------------------------------------------------------

def test_counter_contexts():
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    shards = [CounterShard(a, 3, 10, "global"), CounterShard(b, 1, -4, "local"), CounterShard(c, 9, 1, "remote")]
    ctx = encode_counter_context(shards)
    assert ctx[:6] == struct.pack(">hhh", 2, 0 - 32768, 1)
    assert decode_counter_context(ctx) == shards
    assert counter_total(ctx) == 7
    t = parse_type("counter")
    v = t.decode(ctx)
    assert isinstance(v, CounterValue) and v == 7 and v.shards == shards
    assert t.encode(v) == ctx
    assert t.to_json(v) == 7
    one = t.encode(5)                      # a plain int: one global shard, as a leader writes it
    assert one[:4] == bytes.fromhex("00018000") and t.decode(one) == 5
    for bad in [b"\x00", ctx[:-1], struct.pack(">hh", 1, 3) + bytes(32)]:
        with pytest.raises(CqlValueError):
            t.decode(bad)


# ---- composite keys ---------------------------------------------------------------------------------------------

def test_composite_partition_keys():
    types = [parse_type("uuid"), parse_type("text")]
    u = uuid.UUID("0ce82e94-0aa4-497a-83c2-d8f0e0687f12")
    b = composite_encode(types, [u, "abc"])
    assert b == b"\x00\x10" + u.bytes + b"\x00" + b"\x00\x03abc\x00"
    assert composite_decode(types, b) == (u, "abc")
    ctype = parse_type("org.apache.cassandra.db.marshal.CompositeType(org.apache.cassandra.db.marshal.UUIDType,"
                       "org.apache.cassandra.db.marshal.UTF8Type)")
    assert ctype.decode(b) == (u, "abc") and ctype.subtypes == tuple(types)
    for bad in [b[:-1], b[:5], b + b"\x00"]:
        with pytest.raises(CqlValueError):
            composite_decode(types, bad)


# ---- parse_type ---------------------------------------------------------------------------------------------------

ADDRESS = udt_type("ks", "address", ["street", "zip"], [parse_type("text"), parse_type("int")])
UDTS = {("ks", "address"): ADDRESS, ("other", "Point"): udt_type("other", "Point", ["x"], [parse_type("int")])}


@pytest.mark.parametrize("text, cql", [
    ("text", "text"), ("VARCHAR", "text"), ("Int", "int"), ("counter", "counter"), ("empty", "empty"),
    ("frozen<map<text, int>>", "frozen<map<text, int>>"),
    ("FROZEN<LIST<INT>>", "frozen<list<int>>"),
    ("map<text, frozen<tuple<int, text>>>", "map<text, frozen<tuple<int, text>>>"),
    ("map<text,tuple<int,text>>", "map<text, frozen<tuple<int, text>>>"),
    ("list<frozen<list<int>>>", "list<frozen<list<int>>>"),
    ("frozen<list<frozen<set<varchar>>>>", "frozen<list<frozen<set<text>>>>"),
    ("tuple<int, tuple<int, text>>", "frozen<tuple<int, frozen<tuple<int, text>>>>"),
    ("vector<float, 3>", "vector<float, 3>"),
    ("vector<frozen<list<int>>,2>", "vector<frozen<list<int>>, 2>"),
    ("'org.apache.cassandra.db.marshal.LexicalUUIDType'", "'org.apache.cassandra.db.marshal.LexicalUUIDType'"),
    ("'org.apache.cassandra.db.marshal.Int32Type'", "int"),
    ("address", "address"), ("frozen<address>", "frozen<address>"), ("ks.address", "address"),
    ('"address"', "address"), ("list<frozen<address>>", "list<frozen<address>>"),
    ('frozen<other."Point">', 'frozen<"Point">'),
    ("org.apache.cassandra.db.marshal.Int32Type", "int"),
    ("UTF8Type", "text"),
    ("ReversedType(org.apache.cassandra.db.marshal.TimestampType)", "timestamp"),
    ("org.apache.cassandra.db.marshal.FrozenType(org.apache.cassandra.db.marshal.ListType("
     "org.apache.cassandra.db.marshal.Int32Type))", "frozen<list<int>>"),
    ("org.apache.cassandra.db.marshal.MapType(org.apache.cassandra.db.marshal.Int32Type,"
     "org.apache.cassandra.db.marshal.Int32Type)", "map<int, int>"),
    ("org.apache.cassandra.db.marshal.ListType(org.apache.cassandra.db.marshal.FrozenType("
     "org.apache.cassandra.db.marshal.SetType(org.apache.cassandra.db.marshal.UTF8Type)))", "list<frozen<set<text>>>"),
    ("org.apache.cassandra.db.marshal.TupleType(org.apache.cassandra.db.marshal.Int32Type,"
     "org.apache.cassandra.db.marshal.ListType(org.apache.cassandra.db.marshal.Int32Type))",
     "frozen<tuple<int, frozen<list<int>>>>"),
    ("org.apache.cassandra.db.marshal.UserType(ks,61646472657373,737472656574:org.apache.cassandra.db.marshal."
     "UTF8Type,7a6970:org.apache.cassandra.db.marshal.Int32Type)", "address"),
    ("org.apache.cassandra.db.marshal.FrozenType(org.apache.cassandra.db.marshal.UserType(ks,61646472657373,"
     "737472656574:org.apache.cassandra.db.marshal.UTF8Type,7a6970:org.apache.cassandra.db.marshal.Int32Type))",
     "frozen<address>"),
    ("org.apache.cassandra.db.marshal.VectorType(org.apache.cassandra.db.marshal.FloatType , 3)",
     "vector<float, 3>"),
    ("org.apache.cassandra.db.marshal.DateType", "timestamp"),
    ("org.apache.cassandra.db.marshal.SimpleDateType", "date"),
    ("org.apache.cassandra.db.marshal.PartitionerDefinedOrder(org.apache.cassandra.dht.Murmur3Partitioner)",
     "'org.apache.cassandra.db.marshal.PartitionerDefinedOrder(org.apache.cassandra.dht.Murmur3Partitioner)'"),
])
def test_parse_type(text, cql):
    t = parse_type(text, "ks", UDTS)
    assert t.cql == cql
    assert isinstance(t, CqlType)


def test_parse_type_udt_resolution_and_multicell():
    t = parse_type("address", "ks", UDTS)
    assert t == ADDRESS and t.multicell
    assert parse_type("frozen<address>", "ks", UDTS) == ADDRESS.freeze()
    assert parse_type("address", None, UDTS) == ADDRESS                  # unique name, no keyspace needed
    assert parse_type(ADDRESS.marshal) == ADDRESS
    assert parse_type(ADDRESS.freeze().marshal) == ADDRESS.freeze()
    assert ADDRESS.field_names == ("street", "zip") and ADDRESS.keyspace == "ks" and ADDRESS.name == "address"


@pytest.mark.parametrize("text", [
    "", "list<int", "map<int>", "frozen<>", "nosuchtype", "ks.nosuchtype", "vector<float>", "vector<float, x>",
    "list<int>>", "tuple<>", "int int", "map<int, int, int>", "org.apache.cassandra.db.marshal.ListType(",
    "org.apache.cassandra.db.marshal.MapType(org.apache.cassandra.db.marshal.Int32Type)", "list<in$t>",
])
def test_parse_type_rejects(text):
    with pytest.raises(SchemaError):
        parse_type(text, "ks", UDTS)


def test_ambiguous_udt_name_without_keyspace():
    udts = {("a", "p"): udt_type("a", "p", ["x"], [parse_type("int")]),
            ("b", "p"): udt_type("b", "p", ["y"], [parse_type("int")])}
    with pytest.raises(SchemaError):
        parse_type("p", None, udts)
    assert parse_type("b.p", None, udts).keyspace == "b"


def test_types_are_immutable_hashable_and_equal_by_structure():
    assert parse_type("varchar") == parse_type("text") and hash(parse_type("varchar")) == hash(parse_type("text"))
    assert parse_type("map<text, int>") == parse_type("org.apache.cassandra.db.marshal.MapType("
                                                      "org.apache.cassandra.db.marshal.UTF8Type,"
                                                      "org.apache.cassandra.db.marshal.Int32Type)")
    assert len({parse_type("int"), parse_type("Int"), parse_type("bigint")}) == 2
    assert parse_type("uuid") != parse_type("timeuuid")
    assert udt_type("ks", "a", ["x"], [parse_type("int")]) != udt_type("ks", "a", ["y"], [parse_type("int")])
    with pytest.raises(AttributeError):
        parse_type("int").cql = "bigint"
    assert repr(parse_type("list<int>")) == "CqlType('list<int>')"


# ---- bad input ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_text, data", [
    ("int", b"\x00\x00\x01"), ("bigint", b"\x00" * 9), ("uuid", b"\x00" * 15), ("boolean", b"\x00\x01"),
    ("smallint", b"\x00"), ("tinyint", b"\x00\x00"), ("date", b"\x00" * 5), ("time", b"\x00" * 7),
    ("timestamp", b"\x00" * 4), ("float", b"\x00" * 8), ("double", b"\x00" * 4), ("inet", b"\x7f\x00\x00"),
    ("ascii", b"\xc3\xa9"), ("text", b"\xff\xfe"), ("duration", b"\x00\x00"), ("duration", b"\x00\x00\x00\x00"),
    ("frozen<list<int>>", b"\x00\x00\x00\x02\x00\x00\x00\x04\x00\x00\x00\x01"),
    ("frozen<list<int>>", b"\x00\x00\x00"), ("frozen<list<int>>", b"\xff\xff\xff\xff"),
    ("frozen<list<int>>", b"\x00\x00\x00\x01\xff\xff\xff\xfe"),
    ("frozen<list<int>>", b"\x00\x00\x00\x00\x00"),
    ("frozen<map<int, int>>", b"\x7f\xff\xff\xff\x00\x00\x00\x04"),
    ("frozen<tuple<int, int>>", b"\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00"),
    ("frozen<tuple<int>>", b"\x00\x00\x00\x04\x00\x00\x00\x01\x00"),
    ("frozen<tuple<int>>", b"\x00\x00\x00\x04\x00\x00\x00\x01\xff\xff\xff\xff"),     # a second field
    ("frozen<set<int>>", b"\x00\x00\x00\x01\x00\x00\x00\x03\x00\x00\x01"),
])
def test_bad_bytes_raise_cql_value_error(type_text, data):
    with pytest.raises(CqlValueError):
        parse_type(type_text).decode(data)


def test_length_prefixed_values_read_nulls_and_stop_where_told():
    data = struct.pack(">i", 2) + b"ab" + struct.pack(">ii", -1, 0) + b"tail"
    assert ct.read_length_prefixed(data, 0, 3) == ([b"ab", None, b""], 14)
    assert ct.read_length_prefixed(data[:14]) == ([b"ab", None, b""], 14)      # no count: up to the end
    assert ct.read_length_prefixed(data, 6, 1) == ([None], 10)


@pytest.mark.parametrize("data, message, position", [
    (struct.pack(">i", 1) + b"a" + b"\x00\x00", "truncated element: element 1 at byte 5", 5),        # a cut length
    (struct.pack(">i", 1) + b"a" + struct.pack(">i", 3) + b"x",                                # a cut value
     "truncated element: element 1 needs 3 bytes at byte 9", 9),
    (struct.pack(">i", -2), "element 0 has negative length -2 at byte 0", 0),                    # only -1 is null
])
def test_length_prefixed_values_cut_short_name_the_value_and_byte(data, message, position):
    """Never a value sliced short: the error names which value and where, after the caller's context."""
    with pytest.raises(CqlValueError) as e:
        ct.read_length_prefixed(data, 0, 2, "element")
    assert e.value.reason == message and e.value.position == position
    with pytest.raises(CqlValueError) as e:
        ct.read_length_prefixed(data, 0, 2, "element", "ks.t.tags")
    assert e.value.reason == "ks.t.tags: " + message and e.value.position == position
    with pytest.raises(CqlValueError) as e:
        parse_type("frozen<list<blob>>").decode(struct.pack(">i", 2) + data)
    assert e.value.reason == "frozen<list<blob>>: " + message.replace(f"byte {position}", f"byte {position + 4}")
    assert e.value.position == position + 4


@PROPERTY
@given(st.data())
def test_arbitrary_and_truncated_bytes_never_raise_anything_but_cql_value_error(data):
    t = data.draw(cql_types(2), label="type")
    v = data.draw(values_of(t), label="value")
    good = t.encode(v)
    cut = data.draw(st.integers(0, max(0, len(good) - 1)), label="cut")
    noise = data.draw(st.binary(max_size=40), label="noise")
    for b in (good[:cut], noise, good + noise[:1]):
        try:
            t.decode(b)
        except CqlValueError:
            pass


@pytest.mark.parametrize("type_text, value", [
    ("int", "1"), ("int", 2 ** 31), ("int", True), ("text", b"x"), ("ascii", "é"), ("blob", "x"),
    ("uuid", "not-a-uuid"), ("inet", "300.1.1.1"), ("date", datetime.datetime(2020, 1, 1)),
    ("frozen<list<int>>", "abc"), ("frozen<list<int>>", [1, "x"]), ("frozen<tuple<int>>", (1, 2)),
    ("frozen<map<int, int>>", {1: 2, None: 3}), ("vector<int, 2>", [1, None]), ("decimal", 1.5),
    ("boolean", 1), ("tinyint", 128), ("time", "02:00"), ("duration", "1h"),
])
def test_bad_python_values_raise_cql_value_error(type_text, value):
    with pytest.raises(CqlValueError):
        parse_type(type_text).encode(value)
    with pytest.raises(CqlValueError):
        parse_type(type_text).encode(None)
