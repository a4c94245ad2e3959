"""The SSTable reader (``cdc_lib.sstable``): real 3.11 SSTables, and SSTables of every version, codec and
deletion kind made by the test writer (``sstable_writer``, written from the format reference), damaged on purpose
where the test says so.

The truth for the synthetic files is the partition updates they were written from: the reader must give back
exactly the cell-log records the commit-log path gives for the same updates (``celllog.update_records``), from
the fast path and from the reference decoder alike. Checks against real Cassandra 5.0 SSTables and ``SELECT``
use ``sstable_check`` (they need a running cluster; see the README).
"""
from __future__ import annotations

import collections
import json
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sstable_writer import data_bytes, table_dir, write_sstable

from cdc_lib.celllog.records import update_records
from cdc_lib.commitlog.model import (BoundKind, Cell, DeletionTime, LivenessInfo, Mutation,
                                     PartitionUpdate, RangeTombstoneMarker, Row)
from cdc_lib.commitlog.mutation import decode_mutation, encode_mutation, finish_update
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.demo.workload import Workload, sample_schema
from cdc_lib.errors import SSTableError
from cdc_lib.sstable import SSTable, find_data_files, read_sstable_cell_log, read_sstable_mutations
from cdc_lib.sstable.descriptor import TableDirectory, parse_data_path, table_directory, uuid_id_micros
from cdc_lib.sstable.statistics import HeaderColumn, column_order_key

SOURCE = ("segment", "segment_id", "position", "entry_index", "seq")
REPO = Path(__file__).resolve().parents[1]


def _identity(r: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in r.items() if k not in SOURCE))


def _records(updates) -> collections.Counter:
    return collections.Counter(_identity(r) for u in updates for r in update_records(u, "", 0, 0, 0))


def _fast(paths, schema=None, **kw) -> list:
    damage = []
    out = [r for b in read_sstable_cell_log(paths, schema, on_damage=damage.append, **kw) for r in b.to_pylist()]
    assert not damage, damage[:2]
    return out


def _reference(paths, schema=None) -> tuple:
    """(records of the reference decoder's partitions, damage records)."""
    recs, damage = [], []
    for m in read_sstable_mutations(paths, schema):
        if isinstance(m, Mutation):
            for u in m.updates:
                recs += update_records(u, m.segment, m.segment_id, m.position, 0)
        else:
            damage.append(m)
    return recs, damage


@pytest.fixture(scope="module")
def workload_updates():
    """{table id: [partition updates]} of a generated workload over the sample schema: every CQL type,
    statics, collections, TTLs, counters and every deletion kind."""
    schema = sample_schema()
    wl = Workload(schema, seed=11, partitions=25)
    by_table = collections.defaultdict(list)
    for _ in range(500):
        for u in wl.next_mutation().updates:
            by_table[u.table_id].append(u)
    return schema, by_table


# ---- real SSTables: the 3.11 corpus ------------------------------------------------------------------------------

def _corpus_dirs(corpus) -> list:
    return sorted(d for d in (corpus / "sstables" / "3.11-types" / "data").iterdir() if d.is_dir())


def test_corpus_fast_path_equals_reference_decoder(corpus):
    dirs = _corpus_dirs(corpus)
    assert len(dirs) == 24
    for d in dirs:
        fast = _fast([d])
        ref, damage = _reference([d])
        assert not damage
        assert collections.Counter(_identity(r) for r in fast) == collections.Counter(_identity(r) for r in ref), d
        for r in fast:      # one partition at offset 0 of md-1-big-Data.db, records numbered from 0
            assert (r["segment"], r["segment_id"], r["position"], r["entry_index"]) == ("md-1-big-Data.db", 1, 0, 0)
        assert [r["seq"] for r in fast] == list(range(len(fast)))
        assert {r["table_id"] for r in fast} == {str(uuid.UUID(hex=d.name.rsplit("-", 1)[1]))}


def test_corpus_tables_without_schema_and_with_one(corpus):
    d = [d for d in _corpus_dirs(corpus) if d.name.startswith("map-")][0]
    (data,) = find_data_files(d)
    bare = SSTable(data)                          # names of key columns are not in the file: Cassandra's defaults
    assert (bare.table.keyspace, bare.table.name) == ("data", "map")
    assert [c.name for c in bare.table.partition_key] == ["key"]
    assert bare.table.id == uuid.UUID("c1170700-dce7-11eb-b28f-9116fc548b6b")
    schema = load_cql_schema(corpus / "sstables" / "3.11-types" / "schema.cql", allow_missing_ids=True)
    named = SSTable(data, schema)                 # matched by its (unique) table name; the id stays the directory's
    assert (named.table.keyspace, named.table.name) == ("testtypes1", "map")
    assert [c.name for c in named.table.partition_key] == ["id"]
    assert named.table.id == bare.table.id
    assert named.table.columns["mapintintval"].type.cql == "map<int, int>"


def _inspect(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cdc_lib.cli", "inspect", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO)


def test_inspect_prints_sstables_as_json_lines(corpus):
    base = corpus / "sstables" / "3.11-types"
    r = _inspect("--schema", base / "schema.cql", *_corpus_dirs(corpus))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""                         # no warnings about schema ids (SSTable directories carry them)
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(recs) == 24
    assert {(x["keyspace"], x["kind"], json.dumps(x["partition_key"])) for x in recs} == \
        {("testtypes1", "row", '{"id": 1}')}
    by_table = {x["table"]: x for x in recs}
    assert by_table["text"]["cells"][0]["value"] == "this is a text string"
    assert by_table["map"]["complex_deletions"]["mapintintval"]["marked_for_delete_at"] == 1625417350112759
    assert [c["path"] for c in by_table["map"]["cells"]] == [42]
    assert by_table["decimal"]["cells"][0]["value"] == "2.71828"
    assert all(x["segment"] == "md-1-big-Data.db" and x["position"] == 0 for x in recs)
    one = _inspect(next(find_data_files(_corpus_dirs(corpus)[0]).__iter__()))
    assert one.returncode == 0 and len(one.stdout.splitlines()) == 1


# ---- every version, codec and deletion kind -----------------------------------------------------------------------

VARIANTS = [("ma", "big", None), ("mc", "big", "LZ4Compressor"), ("me", "big", "SnappyCompressor"),
            ("na", "big", "DeflateCompressor"), ("nb", "big", "LZ4Compressor"), ("oa", "big", "ZstdCompressor"),
            ("oa", "big", None), ("da", "bti", "LZ4Compressor"), ("da", "bti", "NoopCompressor")]


@pytest.mark.parametrize("version,fmt,codec", VARIANTS)
def test_every_version_and_codec_gives_the_commit_log_records(tmp_path, workload_updates, version, fmt, codec):
    schema, by_table = workload_updates
    kinds = set()
    for tid, updates in by_table.items():
        t = schema.table(tid)
        w = write_sstable(tmp_path, t, updates, version=version, fmt=fmt, compressor=codec, chunk_length=1024)
        expected = _records(updates)
        fast = _fast([w.data], schema)
        ref, damage = _reference([w.data], schema)
        assert not damage
        assert collections.Counter(_identity(r) for r in fast) == expected, t.name
        assert collections.Counter(_identity(r) for r in ref) == expected, t.name
        assert sorted({r["position"] for r in fast}) == sorted(set(w.partition_offsets))
        kinds |= {r["kind"] for r in fast}
    assert kinds == {"cell", "cell_tombstone", "row_liveness", "row_deletion", "complex_deletion",
                     "partition_deletion", "range_tombstone"}


def test_json_form_is_the_same_as_for_commit_logs(tmp_path, workload_updates):
    """``inspect`` prints an SSTable's partitions exactly as it prints the same partition updates read from a
    commit-log segment, but for where they were read (``segment``, ``position``)."""
    from cdc_lib.commitlog.writer import SegmentWriter
    schema, by_table = workload_updates
    tid, updates = max(by_table.items(), key=lambda kv: len(kv[1]))
    updates = updates[:60]
    t = schema.table(tid)
    w = write_sstable(tmp_path / "data", t, updates, version="oa")
    seg = SegmentWriter(tmp_path, 1_700_000_000_001, version=8)
    for u in updates:
        seg.add(encode_mutation(Mutation([u], messaging_version=13), schema, 13))
    seg.close()
    cql = tmp_path / "schema.cql"
    cql.write_text(_ddl(t))
    from_log = _inspect("--schema", cql, seg.path)
    from_sstable = _inspect("--schema", cql, w.data)
    assert from_log.returncode == 0 and from_sstable.returncode == 0, (from_log.stderr, from_sstable.stderr)

    def strip(out):
        return [{k: v for k, v in json.loads(line).items() if k not in ("segment", "position")}
                for line in out.splitlines()]
    assert strip(from_sstable.stdout) == strip(from_log.stdout)
    assert len(from_log.stdout.splitlines()) > 60


def _ddl(t) -> str:
    from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL
    return SAMPLE_SCHEMA_CQL


def test_large_partitions_across_windows_and_batches(tmp_path, workload_updates, monkeypatch, caplog):
    """Tiny windows and batches: every structure straddles a window edge somewhere, partitions straddle
    batches. Records stay the same, ``seq`` runs on within a partition, the fast path never disagrees."""
    import cdc_lib.sstable.chunks as chunks
    import cdc_lib.sstable.fast as fast
    import cdc_lib.sstable.reader as reader
    monkeypatch.setattr(chunks, "FILL", 97)
    monkeypatch.setattr(fast, "MIN_RUN", 61)
    monkeypatch.setattr(reader, "LOOKAHEAD", 33)
    schema, by_table = workload_updates
    for tid, updates in by_table.items():
        t = schema.table(tid)
        w = write_sstable(tmp_path, t, updates, version="nb", compressor="LZ4Compressor", chunk_length=64)
        got = _fast([w.data], schema, batch_rows=40)
        assert collections.Counter(_identity(r) for r in got) == _records(updates)
        seqs = collections.defaultdict(list)
        for r in got:
            seqs[r["position"]].append(r["seq"])
        assert all(v == list(range(len(v))) for v in seqs.values())
        frags = [m for m in SSTable(w.data, schema).mutations(rows_per_update=2)]
        assert all(len(m.updates[0].unfiltereds) <= 2 for m in frags)
    assert "disagree" not in caplog.text


# ---- SSTable-specific encodings ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_schema():
    return load_cql_schema("""
        CREATE TABLE ks.t (pk int, ck int, v text, n int, m map<int, text>, s text static, PRIMARY KEY (pk, ck))
            WITH ID = 5a1e0000-0000-4000-8000-000000000001;
    """)


def _update(table, pk: int, unfiltereds=(), deletion=None, static=None) -> PartitionUpdate:
    return finish_update(PartitionUpdate(table.id, struct.pack(">i", pk), table, deletion, static,
                                         list(unfiltereds)))


def _row(ck, ts, **cells) -> Row:
    return Row((struct.pack(">i", ck),), LivenessInfo(ts), None, False,
               [Cell(k, v, ts) for k, v in cells.items()])


def test_partition_deletion_forms(tmp_path, small_schema):
    """``ma``-``nb`` always write 12 bytes; ``oa``/``da`` write 0x80 when live, else 8 + 4 bytes (§6.2)."""
    t = small_schema.by_name("ks", "t")
    dead = _update(t, 1, deletion=DeletionTime(1_700_000_000_000_000, 1_700_000_000))
    live = _update(t, 2, [_row(1, 1_700_000_000_000_001, v=b"x")])
    for version, fmt, live_len in (("nb", "big", 12), ("oa", "big", 1), ("da", "bti", 1)):
        data, offsets, _ = data_bytes(t, [dead, live], version, fmt)
        assert data[offsets[1] + 6:offsets[1] + 6 + live_len] == (b"\x80" if live_len == 1 else
                                                                    b"\x7f\xff\xff\xff\x80" + bytes(7))
        w = write_sstable(tmp_path / version, t, [dead, live], version=version, fmt=fmt)
        recs = _fast([w.data], small_schema)
        pdel = [r for r in recs if r["kind"] == "partition_deletion"]
        assert [(r["timestamp"], r["local_deletion_time"], r["position"]) for r in pdel] == \
            [(1_700_000_000_000_000, 1_700_000_000, 0)]
        assert collections.Counter(map(_identity, recs)) == _records([dead, live])


def test_expiry_past_2038_reads_as_cassandra_reads_it(tmp_path, small_schema):
    """An expiry time past 2038 (TTL'd writes near 2038, or 3.x writes before CASSANDRA-14092's overflow policy)
    does not fit a signed int. ``ma``-``nb`` read it back negative, as Cassandra 3.x/4.x do (the cell counts as
    expired) and exactly as the commit-log decoder does at messaging 12, so both sources give the same record;
    ``oa``/``da`` read it as an unsigned 32-bit time (5.0, valid to 2106)."""
    t = small_schema.by_name("ks", "t")
    late = 2_200_000_000                          # 2039-09
    row = Row((struct.pack(">i", 1),), LivenessInfo(1_700_000_000_000_000, 500_000_000, late), None, False,
              [Cell("v", b"x", 1_700_000_000_000_000, 500_000_000, late)])
    u = _update(t, 1, [row])
    for version, expected_ldt in (("mc", late - (1 << 32)), ("nb", late - (1 << 32)), ("oa", late)):
        w = write_sstable(tmp_path / version, t, [u], version=version)
        recs = _fast([w.data], small_schema)
        got = {r["kind"]: (r["ttl"], r["local_deletion_time"]) for r in recs}
        assert got == {"row_liveness": (500_000_000, expected_ldt), "cell": (500_000_000, expected_ldt)}
        mv = 13 if version == "oa" else 12
        from_log = decode_mutation(encode_mutation(Mutation([u], messaging_version=mv), small_schema, mv),
                                   small_schema, mv)
        assert collections.Counter(map(_identity, recs)) == _records(from_log.updates)


def test_markers_boundaries_shadowable_and_expired_liveness(tmp_path, small_schema):
    t = small_schema.by_name("ks", "t")
    ck = [struct.pack(">i", i) for i in range(10)]
    d1, d2 = DeletionTime(100, 1_700_000_000), DeletionTime(200, 1_700_000_001)
    unfiltereds = [
        RangeTombstoneMarker(BoundKind.INCL_START_BOUND, (ck[1],), d1),
        _row(2, 50, v=b"shadowed"),
        RangeTombstoneMarker(BoundKind.EXCL_END_INCL_START_BOUNDARY, (ck[3],), None, d1, d2),
        RangeTombstoneMarker(BoundKind.INCL_END_EXCL_START_BOUNDARY, (ck[5],), None, d2, d1),
        RangeTombstoneMarker(BoundKind.EXCL_END_BOUND, (ck[7],), d1),
        Row((ck[8],), LivenessInfo(300, (1 << 31) - 1, 1_700_000_000), DeletionTime(250, 1_700_000_000), True),
        RangeTombstoneMarker(BoundKind.EXCL_START_BOUND, (ck[8],), d2),
        RangeTombstoneMarker(BoundKind.INCL_END_BOUND, (), d2),
    ]
    static = Row((), None, None, False, [Cell("s", b"", 10, 0, 1_700_000_000, None, True)], is_static=True)
    u = _update(t, 7, unfiltereds, static=static)
    for version in ("mc", "oa"):
        w = write_sstable(tmp_path / version, t, [u], version=version, compressor="LZ4Compressor", chunk_length=16)
        recs = _fast([w.data], small_schema)
        assert collections.Counter(map(_identity, recs)) == _records([u])
        rts = [(r["clustering"], r["start_inclusive"], r["clustering_end"], r["end_inclusive"], r["timestamp"])
               for r in recs if r["kind"] == "range_tombstone"]
        enc = lambda i: len(ck[i]).to_bytes(2, "big") + ck[i] + b"\x00"   # noqa: E731
        assert rts == [(enc(1), True, enc(3), False, 100), (enc(3), True, enc(5), True, 200),
                       (enc(5), False, enc(7), False, 100), (enc(8), False, b"", True, 200)]
        kinds = collections.Counter(r["kind"] for r in recs)
        assert kinds["row_deletion_shadowable"] == 1 and kinds["cell_tombstone"] == 1
        assert [(r["ttl"], r["timestamp"]) for r in recs if r["kind"] == "row_liveness"][-1] == ((1 << 31) - 1, 300)


def test_raw_and_trailing_empty_chunks(tmp_path, workload_updates):
    """From ``na`` on, a chunk that does not compress below ``max_compressed_length`` is stored raw; a writer's
    last flush may add an empty chunk (§5.2)."""
    schema, by_table = workload_updates
    tid, updates = next(iter(by_table.items()))
    t = schema.table(tid)
    w = write_sstable(tmp_path, t, updates, version="nb", compressor="LZ4Compressor", chunk_length=256,
                      max_compressed_length=200, trailing_empty_chunk=True)
    assert collections.Counter(map(_identity, _fast([w.data], schema))) == _records(updates)


def test_header_column_order():
    """Simple columns before complex ones; names by ColumnIdentifier order (a first byte >= 0x80 sorts first)."""
    from cdc_lib.cql.types import parse_type
    cols = [HeaderColumn(n, "", parse_type(ty)) for n, ty in
            (("b", "int"), ("a", "list<int>"), ("é", "int"), ("aa", "int"), ("z", "int"))]
    assert [c.name for c in sorted(cols, key=column_order_key)] == ["é", "aa", "b", "z", "a"]


def test_file_names_and_table_directories(tmp_path):
    d = parse_data_path("/x/ks/t-00112233445566778899aabbccddeeff/nb-12-big-Data.db")
    assert (d.version.version, d.version.format, d.generation, d.generation_number) == ("nb", "big", "12", 12)
    assert d.version.messaging_version == 12 and not d.version.uint_deletion_time
    assert parse_data_path("/x/da-3-bti-Data.db").version.uint_deletion_time
    u = parse_data_path("/x/oa-3gkq_09vk_0qglc16y2u66tgyfyt-big-Data.db")
    assert u.generation_number == uuid_id_micros("3gkq_09vk_0qglc16y2u66tgyfyt") > 1_600_000_000_000_000
    for bad, why in (("jb-1-big-Data.db", "not supported"), ("nc-1-big-Data.db", "not supported"),
                     ("ks-t-jb-1-Data.db", "not an SSTable"), ("nb-1-big-Index.db", "not an SSTable")):
        with pytest.raises(SSTableError, match=why):
            parse_data_path(tmp_path / bad)
    tid = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    for sub in ("", "snapshots/tag1", "backups"):
        assert table_directory(Path("/data/ks1/tbl-00112233445566778899aabbccddeeff") / sub) == \
            TableDirectory("ks1", "tbl", tid)
    assert table_directory(Path("/tmp/somewhere")) == TableDirectory(None, None, None)


def test_snapshot_schema_names_the_key_columns(tmp_path, small_schema):
    t = small_schema.by_name("ks", "t")
    w = write_sstable(tmp_path, t, [_update(t, 1, [_row(1, 5, v=b"a")])], version="oa")
    snap = w.directory / "snapshots" / "tag"
    snap.mkdir(parents=True)
    for f in w.directory.iterdir():
        if f.is_file():
            (snap / f.name).write_bytes(f.read_bytes())
    assert [c.name for c in SSTable(w.data).table.partition_key] == ["key"]
    (snap / "schema.cql").write_text("CREATE TABLE IF NOT EXISTS ks.t (pk int, ck int, v text, n int, "
                                     "m map<int, text>, s text static, PRIMARY KEY (pk, ck));")
    sst = SSTable(snap / w.data.name)
    assert [c.name for c in sst.table.partition_key] == ["pk"] and sst.table.id == t.id
    assert [c.name for c in sst.table.clustering] == ["ck"]


def test_dropped_columns_are_decoded_but_not_shown(tmp_path):
    """The header still lists a dropped column that has data; with a schema that knows the drop, its cells are
    decoded with the header's type and the table shows no such column (Cassandra hides them on read)."""
    before = load_cql_schema("CREATE TABLE ks.d (pk int PRIMARY KEY, v text, gone int) "
                             "WITH ID = 5a1e0000-0000-4000-8000-000000000002;")
    after = load_cql_schema("CREATE TABLE ks.d (pk int PRIMARY KEY, v text, gone int) "
                            "WITH ID = 5a1e0000-0000-4000-8000-000000000002; "
                            "ALTER TABLE ks.d DROP gone USING TIMESTAMP 2000;")
    t = before.by_name("ks", "d")
    row = Row((), LivenessInfo(1000), None, False, [Cell("gone", struct.pack(">i", 7), 1000), Cell("v", b"x", 1000)])
    u = finish_update(PartitionUpdate(t.id, struct.pack(">i", 1), t, unfiltereds=[row]))
    w = write_sstable(tmp_path, t, [u], version="nb")
    sst = SSTable(w.data, after)
    assert "gone" not in sst.table.columns and sst.table.dropped["gone"].dropped_time == 2000
    assert sst.table.column_for_data("gone").type.cql == "int"
    assert collections.Counter(map(_identity, _fast([w.data], after))) == _records([u])
    assert "gone" in SSTable(w.data).table.columns         # without the schema nothing says it was dropped


def test_udt_columns_written_by_cassandra_3_0(tmp_path):
    """3.0 prints a frozen UDT column's type without FrozenType, so the header claims a non-frozen column; the
    schema (frozen) wins for 3.x SSTables, and the value reads as one cell."""
    schema = load_cql_schema("CREATE TYPE ks.addr (street text, zip int); "
                             "CREATE TABLE ks.u (pk int PRIMARY KEY, a frozen<addr>) "
                             "WITH ID = 5a1e0000-0000-4000-8000-000000000003;")
    t = schema.by_name("ks", "u")
    value = t.columns["a"].type.encode({"street": "Main", "zip": 5})
    row = Row((), LivenessInfo(1000), None, False, [Cell("a", value, 1000)])
    u = finish_update(PartitionUpdate(t.id, struct.pack(">i", 1), t, unfiltereds=[row]))
    bare = t.columns["a"].type.marshal.replace("org.apache.cassandra.db.marshal.FrozenType(", "", 1)[:-1]
    assert "FrozenType" not in bare
    w = write_sstable(tmp_path, t, [u], version="mc", type_strings={"a": bare})
    assert SSTable(w.data).header.regular_columns[0].type.multicell          # what the header claims
    assert not SSTable(w.data, schema).table.columns["a"].type.multicell
    assert collections.Counter(map(_identity, _fast([w.data], schema))) == _records([u])
    (m,) = SSTable(w.data, schema).mutations()
    assert m.updates[0].rows[0].cells[0].value == value


def test_compact_storage_tables(tmp_path):
    """COMPACT STORAGE (3.x, still readable in 4.x/5.0): a static compact table keeps its CQL columns as static
    columns of partitions without rows; a dense one has rows without a row marker (format reference §6.8)."""
    schema = load_cql_schema("""
        CREATE TABLE ks.sc (k int PRIMARY KEY, a int, b text) WITH COMPACT STORAGE
            AND ID = 5a1e0000-0000-4000-8000-000000000004;
        CREATE TABLE ks.dc (k int, c int, v text, PRIMARY KEY (k, c)) WITH COMPACT STORAGE
            AND ID = 5a1e0000-0000-4000-8000-000000000005;""")
    sc, dc = schema.by_name("ks", "sc"), schema.by_name("ks", "dc")
    assert [c.name for c in sc.static_columns] == ["a", "b"] and [c.name for c in sc.clustering] == ["column1"]
    static = Row((), None, None, False, [Cell("a", struct.pack(">i", 3), 10), Cell("b", b"x", 11)], is_static=True)
    sc_updates = [_update(sc, k, static=static) for k in range(3)]
    dc_updates = [_update(dc, k, [Row((struct.pack(">i", c),), None, None, False, [Cell("v", b"v%d" % c, 20 + c)])
                                  for c in range(4)]) for k in range(3)]
    for version in ("ma", "md", "nb"):
        for t, updates in ((sc, sc_updates), (dc, dc_updates)):
            w = write_sstable(tmp_path / version, t, updates, version=version, compressor="LZ4Compressor")
            recs = _fast([w.data], schema)
            assert collections.Counter(map(_identity, recs)) == _records(updates)
            assert "row_liveness" not in {r["kind"] for r in recs}
            first = SSTable(w.data, schema).mutations().__next__().updates[0]
            assert (first.static_row is not None) == (t is sc) and (len(first.rows) == 4) == (t is dc)


# ---- damage ----------------------------------------------------------------------------------------------------------

def _flip(path: Path, offset: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset] ^= 0xFF
    path.write_bytes(bytes(b))


def _partitions(schema, n=40):
    t = schema.by_name("ks", "t")
    return t, [_update(t, pk, [_row(ck, 1000 + ck, v=b"value %d/%d" % (pk, ck)) for ck in range(8)])
               for pk in range(n)]


def test_damaged_chunk_is_reported_and_the_scan_resumes_at_the_next_partition(tmp_path, small_schema):
    t, updates = _partitions(small_schema)
    w = write_sstable(tmp_path, t, updates, version="nb", compressor="LZ4Compressor", chunk_length=512)
    info = SSTable(w.data).stream.compression
    chunk = 3
    _flip(w.data, info.offset(chunk) + 5)
    damage = []
    recs = [r for b in read_sstable_cell_log([w.data], small_schema, on_damage=damage.append) for r in b.to_pylist()]
    assert damage[0].kind == "crc_mismatch" and damage[0].position == chunk * 512
    assert damage[0].segment == w.data.name and damage[0].physical_position == info.offset(chunk)
    assert "CRC32" in damage[0].reason and len(damage[0].data) > 0
    lost = [i for i, off in enumerate(w.partition_offsets)
            if off < (chunk + 1) * 512 and (i + 1 == len(updates) or w.partition_offsets[i + 1] > chunk * 512)]
    got = collections.Counter(map(_identity, recs))
    for i, u in enumerate(updates):
        if i not in lost:
            assert all(got[k] > 0 for k in _records([u])), i        # every partition outside the damage is read
    assert len({r["position"] for r in recs}) >= len(updates) - len(lost)
    assert all("resumes" in d.reason or d.kind == "crc_mismatch" or "cut by the damaged chunk" in d.reason
               for d in damage)
    # the reference decoder reports the same damage
    _, ref_damage = _reference([w.data], small_schema)
    assert [(d.kind, d.position) for d in ref_damage] == [(d.kind, d.position) for d in damage]


def test_damage_in_bti_sstables_resumes_from_partitions_db(tmp_path, small_schema):
    t, updates = _partitions(small_schema)
    w = write_sstable(tmp_path, t, updates, version="da", fmt="bti", compressor="LZ4Compressor", chunk_length=512)
    _flip(w.data, SSTable(w.data).stream.compression.offset(2) + 3)
    damage = []
    recs = _fast_with_damage(w.data, small_schema, damage)
    assert damage[0].kind == "crc_mismatch" and damage[0].position == 1024
    resume = min(off for off in w.partition_offsets if off >= 1536)
    assert any(f"resumes at the next partition (offset {resume})" in d.reason for d in damage)
    assert {off for off in w.partition_offsets if off >= resume} <= {r["position"] for r in recs}
    (w.directory / "da-1-bti-Partitions.db").unlink()              # no index: report the rest, stop
    damage = []
    recs = _fast_with_damage(w.data, small_schema, damage)
    assert any("the rest of Data.db is not read: Partitions.db lists no later partition" in d.reason
               for d in damage)
    assert recs and max(r["position"] for r in recs) < 1024 + 512


def test_partitions_db_trie_walk(tmp_path):
    """Every node layout of BtiFormat.md that a partition index uses, by hand: leaves with D offsets and with
    a Rows.db entry, a DENSE_12 node with a hole, a SPARSE_8 node and a SINGLE_NOPAYLOAD_4 chain."""
    from cdc_lib.sstable.index import _partitions_positions
    trie = bytearray()
    trie += bytes((0x09, 0xAA)) + struct.pack(">h", ~0)             # 0: leaf, D offset 0 (pb 9: hash + 2 bytes)
    trie += bytes((0x09, 0xBB)) + struct.pack(">h", ~100)           # 4: leaf, D offset 100
    trie += bytes((0x0A, 0xCC)) + (0).to_bytes(3, "big")           # 8: leaf, Rows.db entry at 0 (pb 10: 3 bytes)
    dense = len(trie)                                               # 13: DENSE_12, transitions 0x30..0x32, 0x31 empty
    trie += bytes((0xA0, 0x30, 2)) + ((((13 - 0) << 24) | (0 << 12) | (13 - 4)) << 4).to_bytes(5, "big")
    sparse = len(trie)                                              # 21: SPARSE_8: 0x10 -> dense, 0x20 -> leaf 8
    trie += bytes((0x50, 2, 0x10, 0x20, sparse - dense, sparse - 8))
    root = len(trie)                                                # 27: SINGLE_NOPAYLOAD_4 -> sparse
    trie += bytes((0x10 | (root - sparse), 0x40))
    trie += struct.pack(">qqq", 0, 3, root)
    d = tmp_path / "ks" / "t-00000000000000000000000000000001"
    d.mkdir(parents=True)
    (d / "da-1-bti-Partitions.db").write_bytes(bytes(trie))
    (d / "da-1-bti-Rows.db").write_bytes(struct.pack(">H", 2) + b"k1" + bytes((0x80, 200)) + b"rest")
    assert list(_partitions_positions(parse_data_path(d / "da-1-bti-Data.db"))) == [0, 100, 200]


def test_bytes_that_do_not_decode_are_reported_with_their_offset(tmp_path, small_schema):
    """Good CRCs, bad content (here: a row's size field one too small): the row's partition is reported from
    that row on, and the scan goes on with the next partition from Index.db."""
    t, updates = _partitions(small_schema, 5)
    data, offsets, _ = data_bytes(t, updates, "me", "big")
    bad_row = offsets[2] + 2 + 4 + 12                # partition 2: key (2 + 4), deletion (12), its first row

    def corrupt(d: bytes) -> bytes:
        b = bytearray(d)
        at = bad_row + 1 + 1 + 4                     # flags, clustering header, ck int: then row_size
        b[at] -= 1
        return bytes(b)
    w = write_sstable(tmp_path, t, updates, version="me", mutate_data=corrupt)
    damage = []
    recs = [r for b in read_sstable_cell_log([w.data], small_schema, on_damage=damage.append) for r in b.to_pylist()]
    assert [(d.kind, d.position) for d in damage] == [("undecodable", bad_row)]
    assert f"the scan resumes at the next partition (offset {offsets[3]})" in damage[0].reason
    assert {r["position"] for r in recs} == {offsets[0], offsets[1], offsets[3], offsets[4]}
    with pytest.raises(SSTableError) as e:
        list(read_sstable_cell_log([w.data], small_schema, strict=True))
    assert e.value.source == w.data.name and e.value.position == bad_row
    r = _inspect(w.data)
    assert r.returncode == 2
    assert json.loads(r.stdout.splitlines()[-1])["kind"] != "error"       # later partitions are printed too
    assert any(json.loads(line)["kind"] == "error" for line in r.stdout.splitlines())


def test_cut_files_and_crc_db(tmp_path, small_schema):
    t, updates = _partitions(small_schema, 6)
    w = write_sstable(tmp_path / "cut", t, updates, version="mc")
    w.data.write_bytes(w.data.read_bytes()[:-30])                       # cut inside the last partition
    (w.directory / "mc-1-big-CRC.db").unlink()
    damage = []
    recs = _fast_with_damage(w.data, small_schema, damage)
    assert [d.kind for d in damage] == ["undecodable"] and damage[0].position > w.partition_offsets[-1]
    assert {r["position"] for r in recs} == set(w.partition_offsets)
    w2 = write_sstable(tmp_path / "crc", t, updates, version="mc")
    _flip(w2.data, 100)
    damage = []
    _fast_with_damage(w2.data, small_schema, damage)
    assert damage[0].kind == "crc_mismatch" and damage[0].position == 0 and "CRC.db" in damage[0].reason


def _fast_with_damage(path, schema, damage) -> list:
    return [r for b in read_sstable_cell_log([path], schema, on_damage=damage.append) for r in b.to_pylist()]


def test_unreadable_statistics_is_damage_of_that_sstable_only(tmp_path, small_schema):
    t, updates = _partitions(small_schema, 3)
    bad = write_sstable(tmp_path, t, updates[:1], version="nb", generation="1")
    good = write_sstable(tmp_path, t, updates[1:], version="nb", generation="2")
    stats = bad.directory / "nb-1-big-Statistics.db"
    _flip(stats, len(stats.read_bytes()) - 10)
    damage = []
    recs = _fast_with_damage(table_dir(tmp_path, t), small_schema, damage)
    assert [(d.kind, d.segment) for d in damage] == [("header", "nb-1-big-Data.db")]
    assert "CRC mismatch in metadata component 3" in damage[0].reason and "Statistics.db" in damage[0].reason
    assert {r["segment"] for r in recs} == {good.data.name}


def test_unknown_compressor_is_damage_of_that_sstable(tmp_path, small_schema):
    t, updates = _partitions(small_schema, 2)
    w = write_sstable(tmp_path, t, updates, version="nb", compressor="LZ4Compressor")
    info = w.directory / "nb-1-big-CompressionInfo.db"
    info.write_bytes(info.read_bytes().replace(b"LZ4Compressor", b"LZXCompressor"))
    damage = []
    assert _fast_with_damage(w.data, small_schema, damage) == []
    assert [d.kind for d in damage] == ["header"] and "LZXCompressor" in damage[0].reason
