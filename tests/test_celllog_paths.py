"""``read_cell_log``'s readers (pure Python, compiled) against the reference decoder, on real and generated
segments: identical records, batches, damage records and counters (``celllog_diff``). Also which reader runs
(``CASSANDRA_CDC_NATIVE``), and the entries where the fast paths once disagreed with the reference."""
import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

from celllog_diff import check, reader, run  # noqa: F401 - reader is a fixture
from cdc_lib import wire
from cdc_lib.celllog import native, read_cell_log
from cdc_lib.commitlog.segment import SegmentBytes, SegmentReader
from cdc_lib.commitlog.writer import SegmentWriter
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.demo.workload import Workload, sample_schema, write_cluster_segments

DIRS = ["3.0.29", "4.0.11", "2.2-lz4", "2.2-snappy", "2.2-lz4-bitrot", "2.2-lz4-bitrot2", "2.2-lz4-truncated"]
CODECS = [None, "LZ4Compressor", "SnappyCompressor", "DeflateCompressor", "ZstdCompressor"]


def _files(corpus, d):
    return sorted(glob.glob(str(corpus / "commitlog" / d / "*.log")))


# ---------------------------------------------------------------------------------------- real segments

@pytest.mark.parametrize("d", DIRS)
@pytest.mark.parametrize("schema_from_log", [True, False])
@pytest.mark.parametrize("batch_rows", [65536, 100, 1])
def test_real_segments(corpus, reader, d, schema_from_log, batch_rows):
    r = check(reader, _files(corpus, d), schema_from_log=schema_from_log, batch_rows=batch_rows)
    if d in ("3.0.29", "4.0.11") and schema_from_log:
        assert sum(b.num_rows for b in r["batches"]) > 100
    if d.startswith("2.2-lz4-"):
        kinds = {e[3] for e in r["events"] if e[0] == "damage"}
        assert kinds & {"torn_tail", "crc_mismatch", "compression"}, kinds


@pytest.mark.parametrize("d", DIRS)
def test_real_segments_strict(corpus, reader, d):
    check(reader, _files(corpus, d), schema_from_log=True, strict=True)


@pytest.mark.parametrize("d", ["3.0.29", "4.0.11"])
def test_start_stop(corpus, reader, d):
    path = _files(corpus, d)[0]
    entries = list(SegmentReader(path))
    for i in (0, 1, 50, len(entries) // 2, len(entries) - 1):
        p = entries[i].position
        check(reader, [path], schema_from_log=True, start=p)
        check(reader, [path], schema_from_log=True, stop=p)
        check(reader, [path], schema_from_log=True, start=entries[i // 2].position, stop=p)
    check(reader, [path], schema_from_log=True, stop=0)
    check(reader, [path], schema_from_log=True, start=10**9)


def test_all_corpus_files_in_one_read(corpus, reader):
    paths = [f for d in DIRS for f in _files(corpus, d)]
    r = check(reader, paths, schema_from_log=True, batch_rows=333)
    assert r["stats"]["records"] > 100 and r["stats"]["damaged"] > 0


def test_segment_bytes_paths_and_cut_files(corpus, reader, tmp_path):
    """A segment given as its bytes, as a bytes path, empty, cut inside its header, cut anywhere, renamed."""
    src = _files(corpus, "4.0.11")[0]
    raw = open(src, "rb").read()
    whole = check(reader, raw, schema_from_log=True)
    by_bytes_path = check(reader, [os.fsencode(src)], schema_from_log=True)     # a path, as open() takes it
    assert by_bytes_path["stats"] == whole["stats"] and whole["stats"]["records"] == 710
    empty = tmp_path / "CommitLog-7-1.log"
    empty.write_bytes(b"")
    check(reader, [empty], schema_from_log=True)
    short = tmp_path / "CommitLog-7-2.log"
    short.write_bytes(raw[:10])
    check(reader, [short], schema_from_log=True)
    check(reader, [short], schema_from_log=True, strict=True)
    renamed = tmp_path / "CommitLog-7-3.log"
    renamed.write_bytes(raw)
    check(reader, [renamed], schema_from_log=True)
    check(reader, [renamed], schema_from_log=True, strict=True)
    # cut inside a marker, inside entries, inside the last (empty) section's marker; at its end, in the zeros
    for cut, is_torn in ((25, True), (2000, True), (30_000, True), (75_010, True), (75_011, False),
                         (len(raw) - 3, False)):
        torn = tmp_path / os.path.basename(src)
        torn.write_bytes(raw[:cut])
        r = check(reader, [torn], schema_from_log=True)
        assert [e[3] for e in r["events"] if e[0] == "damage"] == (["torn_tail"] if is_torn else [])


@pytest.mark.parametrize("d", ["4.0.11", "2.2-lz4-bitrot"])
def test_segment_bytes_with_their_name_read_as_their_file(corpus, reader, d):
    """A segment read from an object store into memory (``SegmentBytes``, as the parse step does) gives what its
    file gives: the same records, naming the segment by its file name, and the same damage records."""
    damage = []
    for src in _files(corpus, d):
        from_file = check(reader, [src], schema_from_log=True)
        in_memory = check(reader, [SegmentBytes(os.path.basename(src), open(src, "rb").read())], schema_from_log=True)
        assert in_memory["events"] == from_file["events"] and in_memory["stats"] == from_file["stats"]
        assert [b.to_pylist() for b in in_memory["batches"]] == [b.to_pylist() for b in from_file["batches"]]
        for b in in_memory["batches"]:
            assert set(b.column("segment").to_pylist()) == {os.path.basename(src)}
        damage += [e for e in in_memory["events"] if e[0] == "damage"]
    # the damaged corpus segment's damage records name it as its file does
    assert bool(damage) == d.startswith("2.2-lz4-bitrot")
    assert all(e[1] in {os.path.basename(f) for f in _files(corpus, d)} for e in damage)


# ---------------------------------------------------------------------------------- generated segments

@pytest.fixture(scope="module")
def schema():
    return sample_schema()


@pytest.mark.parametrize("version,codec", [(v, c) for v in (6, 7, 8) for c in CODECS
                                           if (v, c) != (6, "ZstdCompressor")])   # 3.x has no Zstd compressor
def test_workload_every_version_and_codec(tmp_path, reader, schema, version, codec):
    cw = write_cluster_segments(tmp_path, schema, 1200, nodes=1, rf=1, seed=version * 10 + len(codec or ""),
                                version=version, compression=codec, segment_size=1 << 17)
    paths = cw.segments["node1"]
    assert len(paths) > 1
    r = check(reader, paths, schema=schema, batch_rows=777)
    kinds = set()
    for b in r["batches"]:
        kinds |= set(b.column("kind").to_pylist())
    assert kinds == {"cell", "cell_tombstone", "row_liveness", "row_deletion", "complex_deletion",
                     "partition_deletion", "range_tombstone"}
    check(reader, paths, schema=schema, batch_rows=1)
    entries = list(SegmentReader(paths[0]))
    mid = entries[len(entries) // 3].position                 # logical offsets, compressed or not
    check(reader, paths[:1], schema=schema, start=mid)
    check(reader, paths[:1], schema=schema, stop=mid)
    raw = open(paths[0], "rb").read()
    torn = tmp_path / "torn" / os.path.basename(paths[0])
    torn.parent.mkdir()
    torn.write_bytes(raw[:len(raw) * 2 // 3])
    r = check(reader, [torn], schema=schema)
    assert [e[3] for e in r["events"] if e[0] == "damage"] == ["torn_tail"]


def test_encrypted_segments(tmp_path, reader, schema):
    from cdc_lib.commitlog.encryption import EncryptionKeys
    from cdc_lib.commitlog.mutation import encode_mutation
    keys = EncryptionKeys.from_hex("testing:1=" + "00112233445566778899aabbccddeeff")
    wl = Workload(schema, seed=3)
    w = SegmentWriter(tmp_path, 9, version=7, keys=keys, key_alias="testing:1")
    for i in range(600):
        w.add(encode_mutation(wl.next_mutation(), schema))
        if i % 97 == 96:
            w.sync()
    w.close()
    r = check(reader, [w.path], schema=schema, keys=keys, batch_rows=500)
    assert sum(b.num_rows for b in r["batches"]) > 1000
    check(reader, [w.path], schema=schema)                              # no key: encryption damage per section
    check(reader, [w.path], schema=schema, keys=EncryptionKeys.from_hex("testing:1=" + "ff" * 16))
    check(reader, [w.path], schema=schema, strict=True)
    raw = open(w.path, "rb").read()
    torn = tmp_path / "torn" / os.path.basename(w.path)
    torn.parent.mkdir()
    torn.write_bytes(raw[:len(raw) // 2])
    check(reader, [torn], schema=schema, keys=keys)


def test_unknown_tables_and_empty_schema(tmp_path, reader, schema):
    cw = write_cluster_segments(tmp_path, schema, 300, nodes=1, rf=1, seed=5)
    paths = cw.segments["node1"]
    r = check(reader, paths)                                    # no schema: every entry is unknown_table damage
    assert {e[3] for e in r["events"] if e[0] == "damage"} == {"unknown_table"}
    part = schema.copy()
    del part.tables[next(iter(part.tables))]
    check(reader, paths, schema=part)
    check(reader, paths, schema=part, strict=True)


def test_many_segments_one_read(tmp_path, reader, schema):
    cw = write_cluster_segments(tmp_path, schema, 3000, nodes=3, rf=2, seed=1, segment_size=1 << 17)
    paths = [p for n in sorted(cw.segments) for p in cw.segments[n]]
    assert len(paths) > 6
    check(reader, paths, schema=schema, batch_rows=4096)


# ------------------------------------------------- entries on which a fast path once differed from the reference

NO_TS = -(1 << 63)
TS_EPOCH = 1442880000000000
GAPS = load_cql_schema("""
    CREATE TABLE ks.t (k int, c int, v int, s int static, l list<int>, PRIMARY KEY (k, c))
        WITH ID = 00000000-0000-1000-8000-0000000000a1;
    CREATE TABLE ks.wide (k int PRIMARY KEY, %s) WITH ID = 00000000-0000-1000-8000-0000000000a2;
    CREATE TABLE ks.tb (k int, c blob, v int, PRIMARY KEY (k, c)) WITH ID = 00000000-0000-1000-8000-0000000000a3;
""" % ", ".join(f"v{i:02d} int" for i in range(70)))
T = GAPS.by_name("ks", "t")
WIDE = GAPS.by_name("ks", "wide")
TB = GAPS.by_name("ks", "tb")
WIDE_COLUMNS = [f"v{i:02d}".encode() for i in range(70)]


def uv(v: int) -> bytes:
    return wire.encode_uvint(v)


def vb(b: bytes) -> bytes:
    return uv(len(b)) + b


def ts_delta(ts: int) -> bytes:            # stats min timestamp = the epoch: delta = ts - epoch (64-bit)
    return uv((ts - TS_EPOCH) & wire.MASK64)


def update(table, pflags: int, body: bytes, columns=(b"v",)) -> bytes:
    head = table.id.bytes + vb((7).to_bytes(4, "big")) + bytes([pflags]) + uv(0) + uv(0) + uv(0)
    return head + uv(len(columns)) + b"".join(vb(c) for c in columns) + body


def mutation(*updates: bytes) -> bytes:
    return uv(len(updates)) + b"".join(updates)


ROW_CL = uv(0) + (5).to_bytes(4, "big")          # clustering header (no null/empty) + int c = 5
CELL_V = bytes([0x08]) + (9).to_bytes(4, "big")  # cell: uses the row timestamp, int value 9
LIVE_ROW = bytes([0x24]) + ROW_CL + ts_delta(1_700_000_000_000_000) + CELL_V
DEL = ts_delta(1_700_000_000_000_000) + uv(100)


def _segment(tmp_path, *muts: bytes):
    w = SegmentWriter(tmp_path, 77, version=7, segment_size=1 << 20)
    for m in muts:
        w.add(m)
    w.close()
    return [w.path]


def _read(reader, tmp_path, *muts) -> dict:
    return check(reader, _segment(tmp_path, *muts), schema=GAPS)


def _damage(r) -> list:
    return [(e[3], e[4]) for e in r["events"] if e[0] == "damage"]


def _rows(r) -> list:
    return [row for b in r["batches"] for row in b.to_pylist()]


def test_valid_control_entry(reader, tmp_path):
    r = _read(reader, tmp_path, mutation(update(T, 0x10, uv(1) + LIVE_ROW + b"\x01")))
    assert [(x["kind"], x["column"]) for x in _rows(r)] == [("row_liveness", None), ("cell", "v")]


def test_reversed_partition_update_is_damage(reader, tmp_path):
    """IS_REVERSED (0x02) is never set in a mutation (Cassandra asserts it is not)."""
    r = _read(reader, tmp_path, mutation(update(T, 0x12, uv(1) + LIVE_ROW + b"\x01")))
    assert [k for k, _ in _damage(r)] == ["undecodable"] and _rows(r) == []


def test_deletions_at_long_min_value_delete_nothing(reader, tmp_path):
    """A row or partition deletion whose markedForDeleteAt is Long.MIN_VALUE is LIVE: no record."""
    row_del = bytes([0x30]) + ROW_CL + ts_delta(NO_TS) + uv(100) + b"\x01"
    part_del = ts_delta(NO_TS) + uv(100) + b"\x01"
    r = _read(reader, tmp_path, mutation(update(T, 0x00, row_del, columns=())),
              mutation(update(T, 0x04, part_del, columns=())))
    assert _rows(r) == [] and _damage(r) == []


def test_row_liveness_without_timestamp_is_no_record(reader, tmp_path):
    """HAS_TIMESTAMP with the NO_TIMESTAMP value; its cells may still take that timestamp."""
    bare = bytes([0x24]) + ROW_CL + ts_delta(NO_TS) + b"\x01"
    with_cell = bytes([0x24]) + ROW_CL + ts_delta(NO_TS) + CELL_V + b"\x01"
    r = _read(reader, tmp_path, mutation(update(T, 0x00, bare, columns=())), mutation(update(T, 0x00, with_cell)))
    assert [(x["kind"], x["timestamp"]) for x in _rows(r)] == [("cell", NO_TS)]


def test_row_liveness_with_zero_ttl_has_no_expiry(reader, tmp_path):
    """HAS_TTL with a TTL of 0 does not expire: local_deletion_time is NO_DELETION_TIME, as for every record
    without a TTL; a cell that takes the row's TTL (USE_ROW_TTL) does the same."""
    liveness = bytes([0x2C]) + ROW_CL + ts_delta(1_700_000_000_000_000) + uv(0) + uv(1234)
    cell = bytes([0x18]) + (9).to_bytes(4, "big")
    r = _read(reader, tmp_path, mutation(update(T, 0x00, liveness + b"\x01", columns=())),
              mutation(update(T, 0x00, liveness + cell + b"\x01")))
    assert [(x["kind"], x["ttl"], x["local_deletion_time"]) for x in _rows(r)] == [
        ("row_liveness", 0, (1 << 31) - 1), ("row_liveness", 0, (1 << 31) - 1), ("cell", 0, (1 << 31) - 1)]


def test_bound_with_more_values_than_clustering_columns_is_damage(reader, tmp_path):
    start = bytes([0x02, 1]) + (2).to_bytes(2, "big") + uv(0b1000) + (5).to_bytes(4, "big") + DEL  # c=5, null
    end = bytes([0x02, 6]) + (1).to_bytes(2, "big") + uv(0) + (6).to_bytes(4, "big") + DEL
    r = _read(reader, tmp_path, mutation(update(T, 0x00, start + end + b"\x01", columns=())))
    assert [k for k, _ in _damage(r)] == ["undecodable"] and _rows(r) == []


def _wide_row(subset: bytes, cells: int) -> bytes:
    return bytes([0x04]) + ts_delta(1_700_000_000_000_000) + subset + CELL_V * cells + b"\x01"


@pytest.mark.parametrize("subset,cells,why", [
    # the cells are as many as a reader taking the indexes as a set would read: it would accept the row
    (uv(71), 0, "misses 71 of 70"),                                     # more missing than there are columns
    (uv(68) + uv(5) + uv(70), 1, "not ascending"),                      # present list: an index past the header
    (uv(68) + uv(9) + uv(3), 2, "not ascending"),                       # present list out of order
    (uv(2) + uv(4) + uv(70), 69, "not ascending"),                      # absent list: an index past the header
    (uv(2) + uv(7) + uv(7), 69, "not ascending"),                       # absent list: a repeat
], ids=["too-many-missing", "present-past-header", "present-out-of-order", "absent-past-header", "absent-repeat"])
def test_impossible_column_subsets_of_wide_tables_are_damage(reader, tmp_path, subset, cells, why):
    """Tables with 64+ columns encode a row's columns as ascending indexes; anything else is damage, in the
    list of present columns and in the list of absent ones alike."""
    r = _read(reader, tmp_path, mutation(update(WIDE, 0x00, _wide_row(subset, cells), columns=WIDE_COLUMNS)))
    assert [k for k, _ in _damage(r)] == ["undecodable"] and why in _damage(r)[0][1] and _rows(r) == []


def test_large_subsets_both_ways(reader, tmp_path):
    present = _wide_row(uv(68) + uv(3) + uv(65), 2)          # 2 columns present: 3 and 65
    absent = _wide_row(uv(2) + uv(0) + uv(69), 68)           # all but 0 and 69
    r = _read(reader, tmp_path, mutation(update(WIDE, 0x00, present, columns=WIDE_COLUMNS)),
              mutation(update(WIDE, 0x00, absent, columns=WIDE_COLUMNS)))
    cols = [x["column"] for x in _rows(r) if x["kind"] == "cell"]
    assert cols == ["v03", "v65"] + [f"v{i:02d}" for i in range(1, 69)]


def test_unpaired_range_tombstones_are_damage_not_a_crash(reader, tmp_path):
    """Markers that open and never close, close what is not open, or close with another deletion: Cassandra
    fails on them, and read_cell_log reports them (it used to raise out of the read)."""
    start = bytes([0x02, 1]) + (1).to_bytes(2, "big") + uv(0) + (5).to_bytes(4, "big") + DEL
    end = bytes([0x02, 6]) + (1).to_bytes(2, "big") + uv(0) + (6).to_bytes(4, "big") + DEL
    other = bytes([0x02, 6]) + (1).to_bytes(2, "big") + uv(0) + (6).to_bytes(4, "big") \
        + ts_delta(1_700_000_000_000_001) + uv(100)
    muts = [mutation(update(T, 0x00, body + b"\x01", columns=())) for body in (start, end, start + start + end,
                                                                              start + other)]
    r = _read(reader, tmp_path, *muts, mutation(update(T, 0x00, start + end + b"\x01", columns=())))
    assert [k for k, _ in _damage(r)] == ["undecodable"] * 4
    assert [x["kind"] for x in _rows(r)] == ["range_tombstone"]


def test_clustering_value_over_64_kib_is_damage_not_a_crash(reader, tmp_path):
    """Cassandra refuses clustering values over 65,535 bytes (and the cell log cannot encode them)."""
    big = bytes([0x24]) + uv(0) + vb(b"x" * 70_000) + ts_delta(1_700_000_000_000_000) + CELL_V + b"\x01"
    ok = bytes([0x24]) + uv(0) + vb(b"x" * 65_535) + ts_delta(1_700_000_000_000_000) + CELL_V + b"\x01"
    r = _read(reader, tmp_path, mutation(update(TB, 0x00, big)), mutation(update(TB, 0x00, ok)))
    assert [k for k, _ in _damage(r)] == ["undecodable"] and "65535" in _damage(r)[0][1]
    assert len(_rows(r)) == 2


def test_negative_section_length_keeps_the_rest_of_the_file(reader, tmp_path, schema):
    """The positions after a compressed section depend on its length: when that field is damaged (negative),
    no later entry can be positioned, so the rest of the file is one damage record (it used to go on with
    every later position shifted)."""
    cw = write_cluster_segments(tmp_path, schema, 400, nodes=1, rf=1, seed=2, compression="LZ4Compressor",
                                segment_size=1 << 20)
    path = cw.segments["node1"][0]
    raw = bytearray(open(path, "rb").read())
    header = 18 + int.from_bytes(raw[12:14], "big")
    second = wire.be_i32(raw, header)                    # the first section's marker points to the second one
    raw[second + 8:second + 12] = (-5).to_bytes(4, "big", signed=True)
    bad = tmp_path / "bad" / os.path.basename(path)
    bad.parent.mkdir()
    bad.write_bytes(bytes(raw))
    r = check(reader, [bad], schema=schema)
    damage = [e for e in r["events"] if e[0] == "damage"]
    assert [d[3] for d in damage] == ["bad_entry"] and damage[0][5] == bytes(raw[second:])
    whole = run("reference", [path], schema=schema)
    good = [row for b in whole["batches"] for row in b.to_pylist() if row["position"] <= damage[0][2]]
    assert [row for b in r["batches"] for row in b.to_pylist()] == good


# ------------------------------------------------------------------------------------ which reader runs

@pytest.mark.parametrize("value,expected", [("0", False), ("1", True), ("auto", True), ("", True)])
def test_env_var_chooses_the_reader(monkeypatch, value, expected):
    if not native.native_available():
        pytest.skip("cdc_native is not installed")
    monkeypatch.setenv(native.ENV, value)
    assert native.use_native() is expected


def test_env_var_rejects_other_values(monkeypatch):
    monkeypatch.setenv(native.ENV, "maybe")
    with pytest.raises(ValueError, match="0, 1 or auto"):
        list(read_cell_log([], on_damage=print))


_WITHOUT_THE_MODULE = r"""
import os, sys
sys.modules["cdc_native"] = None            # as if the compiled module were not installed
from cdc_lib.celllog import native, read_cell_log
assert not native.native_available()
os.environ["CASSANDRA_CDC_NATIVE"] = "auto"
n = sum(b.num_rows for b in read_cell_log(%r, schema_from_log=True, on_damage=print))
assert n == 710, n
os.environ["CASSANDRA_CDC_NATIVE"] = "1"
try:
    list(read_cell_log(%r, schema_from_log=True, on_damage=print))
except ImportError as e:
    print("ImportError:", e)
"""


def test_without_the_compiled_module_the_package_is_pure_python(corpus):
    segs = _files(corpus, "4.0.11")
    r = subprocess.run([sys.executable, "-c", _WITHOUT_THE_MODULE % (segs, segs)], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert "ImportError: CASSANDRA_CDC_NATIVE=1 but the compiled module cdc_native is not installed" in r.stdout
