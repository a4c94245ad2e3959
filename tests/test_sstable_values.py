"""The CQL value codecs against bytes written by a real Cassandra 3.11 (corpus ``sstables/3.11-types``).

Each table ``testtypes1.<t> (id int PRIMARY KEY, <t>val <t>)`` holds one row. For each, the value cell is read
from Data.db with the library's SSTable reader (``cdc_lib.sstable``, types from the SSTable's own serialization
header, no schema), decoded with the type named in ``schema.cql``, and compared with the value of the INSERT
statement in ``schema.cql``. The expected values are computed here from the CQL literal
text by a small literal parser that does not use the library's decoders; ``encode`` must then give back the
exact bytes of the file.
"""
from __future__ import annotations

import datetime
import decimal
import ipaddress
import json
import re
import struct
import uuid
from pathlib import Path

import pytest

from cdc_lib.cql.types import EMPTY, CqlSet, CqlTime, Duration, parse_type
from cdc_lib.sstable import SSTable, find_data_files

TYPES_DIR = ("sstables", "3.11-types")


# ---- schema.cql -----------------------------------------------------------------------------------------------

_CREATE_RE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\.(\w+) \(id int PRIMARY KEY, (\w+) (.+)\) WITH ")
_INSERT_RE = re.compile(r"^INSERT INTO (\w+)\.(\w+) \(id, (\w+)\) VALUES \(1, (.*)\);$")


def _load_schema(schema_file: Path) -> dict:
    """table -> {"column", "type" (CQL text), "literal" (CQL text)} for every uncommented CREATE/INSERT pair."""
    tables = {}
    for line in schema_file.read_text().splitlines():
        line = line.strip()
        if m := _CREATE_RE.match(line):
            tables[m.group(2)] = {"column": m.group(3), "type": m.group(4)}
        elif m := _INSERT_RE.match(line):
            entry = tables[m.group(2)]
            assert entry["column"] == m.group(3)
            entry["literal"] = m.group(4)
    return tables


# ---- a small CQL literal parser -------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"""\s*(?:
      (?P<string>'(?:[^']|'')*')
    | (?P<uuid>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})
    | (?P<duration>-?(?:\d+(?:y|mo|w|d|h|ms|m|s|us|µs|ns))+)(?![\w.])
    | (?P<hex>0[xX][0-9a-fA-F]*)
    | (?P<number>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)
    | (?P<ident>[A-Za-z_]\w*)
    | (?P<punct>[{}\[\](),:])
    )""", re.VERBOSE)


def _tokens(text):
    pos, out = 0, []
    while pos < len(text.rstrip()):
        m = _TOKEN_RE.match(text, pos)
        assert m and m.end() > pos, f"cannot tokenize {text[pos:]!r}"
        out.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    return out


def parse_literal(text: str):
    """CQL literal -> a small tree: (kind, payload)."""
    toks = _tokens(text)
    i = 0

    def nxt():
        nonlocal i
        i += 1
        return toks[i - 1]

    def peek():
        return toks[i][1] if i < len(toks) else None

    def items(close):
        out = []
        if peek() == close:
            nxt()
            return out
        while True:
            out.append(value())
            sep = nxt()[1]
            if sep == close:
                return out
            assert sep in (",", ":"), sep
            if sep == ":":
                out.append(":")

    def value():
        kind, tok = nxt()
        if kind == "punct":
            if tok == "[":
                return ("list", items("]"))
            if tok == "(":
                return ("tuple", items(")"))
            if tok == "{":
                raw = items("}")
                if ":" in raw:
                    rest = [x for x in raw if x != ":"]
                    return ("map", list(zip(rest[0::2], rest[1::2])))
                return ("set", raw)
            raise AssertionError(f"unexpected {tok!r}")
        if kind == "ident" and peek() == "(":
            nxt()
            return ("call", (tok.lower(), items(")")))
        if kind == "string":
            return ("string", tok[1:-1].replace("''", "'"))
        return (kind, tok)

    v = value()
    assert i == len(toks), f"trailing tokens in {text!r}"
    return v


_DURATION_UNITS = {"y": (12, 0, 0), "mo": (1, 0, 0), "w": (0, 7, 0), "d": (0, 1, 0), "h": (0, 0, 3_600_000_000_000),
                   "m": (0, 0, 60_000_000_000), "s": (0, 0, 1_000_000_000), "ms": (0, 0, 1_000_000),
                   "us": (0, 0, 1000), "µs": (0, 0, 1000), "ns": (0, 0, 1)}


def _duration(text: str) -> Duration:
    sign = -1 if text.startswith("-") else 1
    months = days = nanos = 0
    for n, unit in re.findall(r"(\d+)(mo|ms|us|µs|ns|y|w|d|h|m|s)", text):
        mo, d, ns = _DURATION_UNITS[unit]
        months, days, nanos = months + int(n) * mo, days + int(n) * d, nanos + int(n) * ns
    return Duration(sign * months, sign * days, sign * nanos)


def _time_nanos(text: str) -> int:
    h, m, s = text.split(":")
    sec, _, frac = s.partition(".")
    return ((int(h) * 60 + int(m)) * 60 + int(sec)) * 1_000_000_000 + int((frac + "000000000")[:9])


def _float32(x: float) -> float:
    return struct.unpack(">f", struct.pack(">f", x))[0]


def expected_value(t, lit):
    """The Python value a CQL literal denotes for type ``t`` (None for non-deterministic literals like now())."""
    kind, payload = lit
    k = t.kind
    if kind == "call":
        name, args = payload
        if name == "now":
            return None
        if name == "intasblob":
            return int(args[0][1]).to_bytes(4, "big", signed=True)
        raise AssertionError(f"unsupported function {name}")
    if k in ("ascii", "text"):
        return payload
    if k in ("int", "bigint", "smallint", "tinyint", "varint"):
        return int(payload)
    if k == "boolean":
        return {"true": True, "false": False}[payload.lower()]
    if k == "decimal":
        return decimal.Decimal(payload)
    if k == "double":
        return float(payload)
    if k == "float":
        return _float32(float(payload))
    if k == "blob":
        return bytes.fromhex(payload[2:])
    if k in ("uuid", "timeuuid"):
        return uuid.UUID(payload)
    if k == "inet":
        return ipaddress.ip_address(payload)
    if k == "date":
        return datetime.date.fromisoformat(payload)
    if k == "time":
        return CqlTime(_time_nanos(payload))
    if k == "timestamp":
        ts = datetime.datetime.fromisoformat(payload)
        return ts if ts.tzinfo else ts.replace(tzinfo=datetime.timezone.utc)
    if k == "duration":
        return _duration(payload)
    if k == "list":
        return [expected_value(t.subtypes[0], x) for x in payload]
    if k == "set":
        return {expected_value(t.subtypes[0], x) for x in payload}
    if k == "map":
        return {expected_value(t.subtypes[0], a): expected_value(t.subtypes[1], b) for a, b in payload}
    if k == "tuple":
        return tuple(expected_value(s, x) for s, x in zip(t.subtypes, payload))
    raise AssertionError(f"no literal conversion for {t.cql}")


# ---- the tests -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def types_corpus(corpus):
    base = corpus.joinpath(*TYPES_DIR)
    return base, _load_schema(base / "schema.cql")


def _table_dirs(base: Path) -> dict:
    return {d.name.rsplit("-", 1)[0]: d for d in (base / "data").iterdir() if d.is_dir()}


def read_sstable(table_dir: Path):
    """(serialization header, partition updates) of the one SSTable in ``table_dir``; no damage allowed."""
    (data_file,) = find_data_files(table_dir)
    sst = SSTable(data_file)
    updates = []
    for m in sst.mutations():
        assert hasattr(m, "updates"), m
        updates += m.updates
    return sst.header, updates


def test_every_table_directory_has_a_schema_entry(types_corpus):
    base, schema = types_corpus
    assert set(_table_dirs(base)) == set(schema)
    assert all("literal" in e for e in schema.values())
    assert len(schema) == 24


def _cases():
    base = Path(__file__).resolve().parents[2] / "shared" / "corpus" / Path(*TYPES_DIR)
    if not (base / "schema.cql").exists():
        return ["missing-corpus"]
    return sorted(_load_schema(base / "schema.cql"))


@pytest.mark.parametrize("table", _cases())
def test_value_matches_insert(types_corpus, table):
    base, schema = types_corpus
    entry = schema[table]
    t = parse_type(entry["type"])
    header, partitions = read_sstable(_table_dirs(base)[table])

    # The SSTable header's marshal type string names the same type as the CQL schema.
    (col,) = [c for c in header.regular_columns if c.name == entry["column"]]
    assert col.type == t, (col.type_string, entry["type"])
    assert parse_type(header.partition_key_type) == parse_type("int")

    (partition,) = partitions
    assert parse_type("int").decode(partition.partition_key) == 1
    (row,) = partition.rows
    cells = [c for c in row.cells if c.column == entry["column"]]
    lit = parse_literal(entry["literal"])
    expected = expected_value(t, lit)

    if t.multicell:
        assert cells and all(c.path is not None for c in cells)
        pairs = [(c.path, c.value) for c in cells]
        value = t.decode_cells(pairs)
        if t.kind == "set":
            assert all(c.value == b"" for c in cells)                   # set cells carry no value
            assert isinstance(value, CqlSet) and set(value) == expected
            assert list(value) == sorted(expected)                      # Cassandra's order: numeric for int
            assert t.encode_cells(expected) == pairs                   # a Python set re-sorts to the file order
            assert t.encode_cells(value) == pairs
        elif t.kind == "map":
            assert value == expected
            assert t.encode_cells(expected) == pairs
        elif t.kind == "list":
            assert value == expected
            paths = [p for p, _ in pairs]
            assert all(t.path_type.decode(p).version == 1 for p in paths)
            assert [t.element_value_type(p).decode(v) for p, v in pairs] == expected
            made = t.encode_cells(value)
            assert [v for _, v in made] == [v for _, v in pairs]
            assert all(uuid.UUID(bytes=p).version == 1 for p, _ in made)
            assert [uuid.UUID(bytes=p).time for p, _ in made] == sorted(uuid.UUID(bytes=p).time for p, _ in made)
        else:
            raise AssertionError(f"unexpected complex type {t.cql}")
        # The same value also encodes as a frozen (single-cell) value and reads back.
        assert t.freeze().decode(t.freeze().encode(value)) == value
    else:
        (cell,) = cells
        raw = cell.value
        assert raw is not None and raw != b""
        if t.fixed_length is not None:
            assert len(raw) == t.fixed_length
        value = t.decode(raw)
        assert value is not EMPTY
        if expected is None:                                            # now(): a fresh version-1 timeuuid
            assert isinstance(value, uuid.UUID) and value.version == 1
            uuid_micros = (value.time - 0x01B21DD213814000) // 10
            assert abs(uuid_micros - cell.timestamp) < 1_000_000        # minted at write time
        else:
            assert value == expected
            assert type(value) is type(expected)
            assert t.encode(expected) == raw
        assert t.encode(value) == raw
    json.dumps(t.to_json(value))                                        # the JSON form is serializable


def test_json_forms_of_corpus_values(types_corpus):
    """Where the CQL literal already is the JSON form, to_json gives exactly the literal text back."""
    base, schema = types_corpus
    dirs = _table_dirs(base)
    checked = 0
    for table, entry in schema.items():
        t = parse_type(entry["type"])
        kind, payload = parse_literal(entry["literal"])
        if t.kind not in ("ascii", "text", "date", "inet", "uuid", "duration", "decimal", "int", "bigint",
                          "smallint", "tinyint", "varint"):
            continue
        _, (partition,) = read_sstable(dirs[table])
        (cell,) = [c for c in partition.rows[0].cells if c.column == entry["column"]]
        got = t.to_json(t.decode(cell.value))
        if kind == "number" and t.kind != "decimal":
            assert got == int(payload)
        else:
            assert got == payload            # decimal: its exact string, e.g. "2.71828"
        checked += 1
    assert checked >= 12
