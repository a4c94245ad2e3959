"""Mutation decoding on real segments and generated workloads: ground-truth hashes, byte-exact round trips,
the fast path agreeing with the reference, random schemas, and fuzzed bytes raising only our own errors."""
import glob
import random
import string
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_lib.celllog.fast import FastCellLog
from cdc_lib.celllog.records import mutation_records, records_to_batch
from cdc_lib.commitlog.model import DeletionTime, Mutation
from cdc_lib.commitlog.mutation import decode_mutation, encode_mutation
from cdc_lib.commitlog.reader import decode_entry, read_mutations
from cdc_lib.commitlog.segment import Damage, SegmentReader
from cdc_lib.cql import types as cqltypes
from cdc_lib.cql.schema import CLUSTERING, PARTITION_KEY, REGULAR, STATIC, ColumnMetadata, Schema, TableMetadata
from cdc_lib.cql.tokens import token, token_reference
from cdc_lib.demo.workload import Workload, sample_schema, write_cluster_segments
from cdc_lib.errors import CdcError, UnknownTableError


def _hash_cells(mutations):
    """The corpus README's rule: cells of rows whose first clustering value starts with 'name'."""
    cells = h = 0
    for m in mutations:
        for u in m.updates:
            for row in u.rows:
                if row.clustering and row.clustering[0].startswith(b"name"):
                    for c in row.cells:
                        cells += 1
                        shift = 0
                        for b in c.value:
                            h = (h + (b << shift)) & 0xFFFFFFFF
                            shift = (shift + 8) & 31
    return cells, h - (1 << 32) if h >= 1 << 31 else h


def _truth(corpus, d):
    kv = dict(line.split("=", 1) for line in open(corpus / "commitlog" / d / "hash.txt").read().split()
              if "=" in line)
    return int(kv["cells"]), int(kv["hash"]), uuid.UUID(kv["cfid"])


@pytest.mark.parametrize("d", ["4.0.11", "3.0.29"])
def test_schema_from_log_reproduces_ground_truth(corpus, d):
    segs = sorted(glob.glob(str(corpus / "commitlog" / d / "*.log")))
    recs = list(read_mutations(segs, schema_from_log=True))
    muts = [r for r in recs if isinstance(r, Mutation)]
    damage = [r for r in recs if isinstance(r, Damage)]
    assert all(r.kind == "unknown_table" for r in damage)        # system tables we do not type; never CRC damage
    cells, h, cfid = _truth(corpus, d)
    assert _hash_cells(muts) == (cells, h)
    assert any(u.table_id == cfid for m in muts for u in m.updates)


@pytest.mark.parametrize("d", ["4.0.11", "3.0.29"])
def test_every_real_entry_reencodes_byte_for_byte(corpus, d):
    path = sorted(glob.glob(str(corpus / "commitlog" / d / "*.log")))[0]
    from cdc_lib.commitlog.reader import LogSchema
    src = LogSchema()
    checked = 0
    for e in SegmentReader(path):
        try:
            m = decode_mutation(e.data, src.current(), e.messaging_version)
        except UnknownTableError:
            continue
        assert encode_mutation(m, src.current()) == e.data
        src.observe(m)
        checked += 1
    assert checked > 100


def _fast_vs_reference(entries, schema_for):
    """The fast path and the reference path (``decode_entry`` + ``mutation_records``) agree on every column."""
    recs, ei = [], 0
    fast, fei = FastCellLog(), 0
    for e, _ in entries:
        m = decode_entry(e, schema_for(e))
        recs += mutation_records(m, ei)
        ei += len(m.updates)
        fei += fast.add_entry(e.data, schema_for(e), e.messaging_version, e.segment, e.segment_id, e.position, fei)
    ref, got = records_to_batch(recs), fast.to_batch()
    assert got.num_rows == ref.num_rows > 0
    for name in ref.schema.names:
        assert got.column(name).to_pylist() == ref.column(name).to_pylist(), name


def test_fast_path_equals_reference_on_real_segment(corpus):
    from cdc_lib.commitlog.reader import LogSchema
    path = sorted(glob.glob(str(corpus / "commitlog" / "4.0.11" / "*.log")))[0]
    src = LogSchema()
    pairs = []
    for e in SegmentReader(path):
        try:
            m = decode_mutation(e.data, src.current(), e.messaging_version)
        except UnknownTableError:
            continue
        src.observe(m)
        if m.updates[0].table.keyspace == "Keyspace1":
            pairs.append((e, m))
    schema = src.current()
    _fast_vs_reference(pairs, lambda e: schema)


@pytest.mark.parametrize("d,cells,system", [("3.0.29", 196, 78), ("4.0.11", 710, 3)])
def test_cell_log_of_real_segments_leaves_cassandras_own_tables_out(corpus, d, cells, system):
    """system.local, system.compaction_history, system.sstable_activity... are in every real commit log and in no
    user schema: they are Cassandra's (name-based ids), counted as system entries, not quarantined as unknown."""
    from cdc_lib.celllog.reader import read_cell_log
    from cdc_lib.cql.system_schema import is_system_table_id, system_table_id
    assert is_system_table_id(system_table_id("system", "local"))
    assert not is_system_table_id(uuid.UUID("657e5210-7cbb-11ee-9858-c9aa1eb53e69"))    # Standard1, time-based
    damage, stats = [], {}
    paths = sorted(glob.glob(str(corpus / "commitlog" / d / "*.log")))
    rows = sum(b.num_rows for b in read_cell_log(paths, schema_from_log=True, on_damage=damage.append, stats=stats))
    assert damage == [] and (rows, stats["system_entries"]) == (cells, system)


@pytest.mark.parametrize("version", [6, 7, 8])
def test_generated_workload_round_trip_and_fast_path(tmp_path, version):
    schema = sample_schema()
    cw = write_cluster_segments(tmp_path, schema, 1500, nodes=1, rf=1, seed=version, version=version)
    pairs = []
    for path in cw.segments["node1"]:
        for e in SegmentReader(path):
            m = decode_mutation(e.data, schema, e.messaging_version)
            assert encode_mutation(m, schema, e.messaging_version) == e.data
            pairs.append((e, m))
    assert len(pairs) == 1500
    # every generated mutation arrives exactly once (in the node's own arrival order)
    assert sorted(encode_mutation(m, schema) for _, m in pairs) == sorted(encode_mutation(m, schema)
                                                                        for m in cw.mutations)
    kinds = {r["kind"] for e, m in pairs for r in mutation_records(m)}
    assert kinds == {"cell", "cell_tombstone", "row_liveness", "row_deletion", "complex_deletion",
                     "partition_deletion", "range_tombstone"}
    _fast_vs_reference(pairs, lambda e: schema)


def test_mutation_id_is_shared_by_replica_copies_and_distinct_per_mutation(tmp_path):
    """Every replica logs the same bytes for a mutation, so every copy's records carry one id, on both paths."""
    from cdc_lib.celllog.reader import read_cell_log
    schema = sample_schema()
    cw = write_cluster_segments(tmp_path, schema, 150, seed=3)          # 3 nodes, RF 3
    nodes_by_id: dict = {}
    for node, paths in cw.segments.items():
        for path in paths:
            for e in SegmentReader(path):
                m = decode_entry(e, schema)
                assert {r["mutation_id"] for r in mutation_records(m)} == {m.mutation_id}
                nodes_by_id.setdefault(m.mutation_id, set()).add(node)
    assert set(nodes_by_id) == {m.mutation_id for m in cw.mutations}   # the generator's ids are the bytes' ids
    assert len(nodes_by_id) == len(cw.mutations)
    assert all(nodes == set(cw.segments) for nodes in nodes_by_id.values())
    fast_ids = {r["mutation_id"] for b in read_cell_log([p for ps in cw.segments.values() for p in ps], schema,
                                                        on_damage=pytest.fail) for r in b.to_pylist()}
    assert fast_ids == set(nodes_by_id) and all(len(i) == 16 for i in fast_ids)


def test_messaging_13_unsigned_local_deletion_times():
    """5.0's descriptor 8: local deletion times past 2038 read back as unsigned 32-bit values."""
    schema = sample_schema()
    t = schema.by_name("shop", "sessions")
    from cdc_lib.commitlog.model import Cell, PartitionUpdate, Row
    from cdc_lib.commitlog.mutation import finish_update
    late = 3_000_000_000                     # 2065: beyond a signed 32-bit int
    key = cqltypes.composite_encode([c.type for c in t.partition_key], [7, "phone"])
    cell = Cell("ip", b"\x7f\x00\x00\x01", 1_900_000_000_000_000, ttl=86400, local_deletion_time=late)
    u = finish_update(PartitionUpdate(t.id, key, t, unfiltereds=[Row((), cells=[cell])]))
    u.partition_deletion = DeletionTime(1_900_000_000_000_000, late)
    u = finish_update(u)
    m = Mutation([u], messaging_version=13)
    data = encode_mutation(m, schema, 13)
    back = decode_mutation(data, schema, 13)
    assert back.updates[0].rows[0].cells[0].local_deletion_time == late
    assert back.updates[0].partition_deletion.local_deletion_time == late
    # read as 4.x would (messaging 12), the same bytes give the wrapped, negative (overflowed) value
    assert decode_mutation(data, schema, 12).updates[0].rows[0].cells[0].local_deletion_time == late - (1 << 32)


# ---- random schemas ---------------------------------------------------------------------------------------

SIMPLE = ["ascii", "bigint", "blob", "boolean", "date", "decimal", "double", "duration", "float", "inet", "int",
          "smallint", "text", "time", "timestamp", "timeuuid", "tinyint", "uuid", "varint"]
KEYABLE = [t for t in SIMPLE if t != "duration"]


def _random_table(rnd: random.Random, i: int) -> TableMetadata:
    def ident():
        return "c_" + "".join(rnd.choice(string.ascii_lowercase) for _ in range(6))

    def col_type(depth=0):
        r = rnd.random()
        if depth < 2 and r < 0.15:
            return f"frozen<list<{col_type(depth + 1)}>>"
        if depth < 2 and r < 0.25:
            return f"frozen<map<{rnd.choice(KEYABLE)}, {col_type(depth + 1)}>>"
        if depth < 2 and r < 0.3:
            return f"tuple<{rnd.choice(KEYABLE)}, {col_type(depth + 1)}>"
        return rnd.choice(SIMPLE)

    names = set()

    def fresh():
        n = ident()
        while n in names:
            n = ident()
        names.add(n)
        return n

    cols = {}
    pk = [ColumnMetadata(fresh(), cqltypes.parse_type(rnd.choice(KEYABLE)), PARTITION_KEY, j)
          for j in range(rnd.randint(1, 2))]
    ck = [ColumnMetadata(fresh(), cqltypes.parse_type(rnd.choice(KEYABLE)), CLUSTERING, j, rnd.random() < 0.4)
          for j in range(rnd.randint(0, 2))]
    for c in pk + ck:
        cols[c.name] = c
    for _ in range(rnd.randint(1, 6)):
        r = rnd.random()
        if r < 0.2:
            typ = f"{rnd.choice(['list', 'set'])}<{rnd.choice(KEYABLE)}>"
        elif r < 0.3:
            typ = f"map<{rnd.choice(KEYABLE)}, {rnd.choice(SIMPLE)}>"
        else:
            typ = col_type()
        kind = STATIC if ck and rnd.random() < 0.15 else REGULAR
        c = ColumnMetadata(fresh(), cqltypes.parse_type(typ), kind)
        cols[c.name] = c
    return TableMetadata("ks", f"t{i}", uuid.UUID(int=rnd.getrandbits(128)), pk, ck, cols)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), mv=st.sampled_from([11, 12, 13]))
def test_random_schemas_writer_reader_identity(tmp_path_factory, seed, mv):
    rnd = random.Random(seed)
    schema = Schema()
    for i in range(rnd.randint(1, 3)):
        schema.add(_random_table(rnd, i))
    wl = Workload(schema, seed=seed, partitions=5)
    version = {11: 6, 12: 7, 13: 8}[mv]
    d = tmp_path_factory.mktemp("seg")
    cw = write_cluster_segments(d, schema, 60, nodes=1, rf=1, seed=seed, version=version, workload=wl,
                                segment_size=1 << 16)
    got = [r for r in read_mutations(cw.segments["node1"], schema, strict=True)]
    assert len(got) == 60
    assert sorted(encode_mutation(m, schema, mv) for m in got) == sorted(encode_mutation(m, schema, mv)
                                                                       for m in cw.mutations)


# ---- tokens -------------------------------------------------------------------------------------------------

@given(st.binary(min_size=0, max_size=70))
def test_token_fast_equals_reference(key):
    assert token(key) == token_reference(key)


def test_token_known_values():
    assert token((1).to_bytes(4, "big")) == -4069959284402364209
    assert token((2).to_bytes(4, "big")) == -3248873570005575792
    assert token(b"") == -(1 << 63)


# ---- fuzzing ------------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_segments_raise_only_our_errors(corpus, tmp_path_factory, data):
    import tracemalloc
    src = sorted(glob.glob(str(corpus / "commitlog" / data.draw(st.sampled_from(["4.0.11", "3.0.29"])) / "*.log")))[0]
    raw = bytearray(open(src, "rb").read()[:90000])
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    p = tmp_path_factory.mktemp("fuzz") / src.rsplit("/", 1)[1]
    p.write_bytes(bytes(raw[:cut]))
    tracemalloc.start()
    try:
        for rec in read_mutations([p], schema_from_log=True):
            assert isinstance(rec, (Mutation, Damage))
        try:
            list(read_mutations([p], schema_from_log=True, strict=True))
        except CdcError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=400))
def test_random_mutation_bytes_raise_only_our_errors(data):
    schema = sample_schema()
    try:
        decode_mutation(data, schema, 12)
    except CdcError:
        pass


def test_compact_storage_tables_round_trip(tmp_path):
    """COMPACT STORAGE: dense tables (clustering + one value) and static compact tables (Thrift-style rows,
    whose user columns are static cells beside a hidden clustering column) decode and re-encode exactly."""
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    schema = load_cql_schema("""
        CREATE TABLE ks.dense (k text, c int, v blob, PRIMARY KEY (k, c)) WITH COMPACT STORAGE
            AND ID = 00000000-0000-0000-0000-0000000000d1;
        CREATE TABLE ks.thrift (k bigint PRIMARY KEY, a text, b int) WITH COMPACT STORAGE
            AND ID = 00000000-0000-0000-0000-0000000000d2;
    """)
    dense, thrift = schema.by_name("ks", "dense"), schema.by_name("ks", "thrift")
    assert "dense" in dense.flags and [c.name for c in thrift.static_columns] == ["a", "b"]
    cw = write_cluster_segments(tmp_path, schema, 300, nodes=1, rf=1, seed=11)
    got = list(read_mutations(cw.segments["node1"], schema, strict=True))
    assert len(got) == 300
    assert sorted(encode_mutation(m, schema) for m in got) == sorted(encode_mutation(m, schema) for m in cw.mutations)
    statics = [u.static_row for m in got for u in m.updates if u.table is thrift and u.static_row is not None]
    assert statics and all(c.column in ("a", "b") for r in statics for c in r.cells)
