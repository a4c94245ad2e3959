"""Property and fuzz tests of ``read_cell_log``'s fast paths (``celllog.fast``, the compiled ``cdc_native``)
against the reference decoder.

* random schemas and random valid mutations (``celllog_gen``) decode on the fast path, never left to the
  reference, into exactly the reference's records;
* the same mutations written to segments (every descriptor version, compressed or not) read identically;
* fuzzed mutation bytes: whenever a fast path accepts an entry, the reference accepts it too and gives the same
  records (a fast path may leave anything to the reference, never decide differently);
* fuzzed segments (bit flips, overwritten bytes, truncation; entry CRCs re-sealed so that damaged mutations
  reach the decoders): identical records, damage records and exceptions.

``CELLLOG_FUZZ_SCALE=20`` runs 20 times as many examples.
"""
import random
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celllog_diff import check, examples, reader, require  # noqa: F401 - reader is a fixture
from celllog_gen import MutationGen, random_schema
from cdc_lib import wire
from cdc_lib.celllog import mutation_records, records_to_batch
from cdc_lib.celllog.fast import FastCellLog
from cdc_lib.commitlog.mutation import decode_mutation, encode_mutation
from cdc_lib.commitlog.segment import LogEntry, SegmentReader
from cdc_lib.commitlog.writer import SegmentWriter
from cdc_lib.errors import CdcError

SEG = "CommitLog-7-42.log"
SLOW = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


def _cells(reader: str):
    if reader == "native":
        from cdc_lib.celllog.native import NativeCellLog
        return NativeCellLog()
    return FastCellLog()


def _reference_records(data: bytes, schema, mv: int, position: int, entry_index: int):
    """The reference's records for one entry, or None when it cannot decode it (typed error)."""
    try:
        m = decode_mutation(data, schema, mv)
    except CdcError:
        return None, 0
    m.segment, m.segment_id, m.position = SEG, 42, position
    from cdc_lib.commitlog.model import mutation_id
    m.mutation_id = mutation_id(data)
    return mutation_records(m, entry_index), len(m.updates)


def _compare(cells, records: list):
    got, ref = cells.to_batch(), records_to_batch(records)
    assert got.num_rows == ref.num_rows
    for name in ref.schema.names:
        a, b = got.column(name).to_pylist(), ref.column(name).to_pylist()
        assert a == b, (name, next((i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y))
    assert got.equals(ref)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=SLOW)
@given(seed=st.integers(0, 2**32 - 1), mv=st.sampled_from([11, 12, 13]))
def test_random_mutations_decode_on_the_fast_path_as_the_reference(reader, seed, mv):
    rnd = random.Random(seed)
    schema = random_schema(rnd)
    gen = MutationGen(rnd, schema, mv)
    cells = _cells(reader)
    records, ei = [], 0
    for i in range(25):
        data = encode_mutation(gen.mutation(), schema, mv)
        recs, n = _reference_records(data, schema, mv, 1000 + i, ei)
        assert recs is not None, "the generator makes valid mutations"
        got = cells.add_entry(data, schema, mv, SEG, 42, 1000 + i, ei)   # raises if it left it to the reference
        assert got == n
        records += recs
        ei += n
    _compare(cells, records)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=SLOW)
@given(seed=st.integers(0, 2**32 - 1), version=st.sampled_from([6, 7, 8]),
       codec=st.sampled_from([None, None, "LZ4Compressor", "DeflateCompressor"]),
       batch_rows=st.sampled_from([1, 7, 100, 65536]))
def test_random_mutations_in_segments(tmp_path_factory, reader, seed, version, codec, batch_rows):
    rnd = random.Random(seed)
    schema = random_schema(rnd)
    mv = {6: 11, 7: 12, 8: 13}[version]
    gen = MutationGen(rnd, schema, mv)
    d = tmp_path_factory.mktemp("seg")
    paths = []
    for s in range(2):
        w = SegmentWriter(d, 100 + s, version=version, compression=codec, segment_size=1 << 24)
        for _ in range(rnd.randint(1, 60)):
            w.add(encode_mutation(gen.mutation(), schema, mv))
            if rnd.random() < 0.2:
                w.sync()
        w.close()
        paths.append(w.path)
    check(reader, paths, schema=schema, batch_rows=batch_rows)


def _fuzz(rnd: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        r = rnd.random()
        if r < 0.45 and b:
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        elif r < 0.6 and b:
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
        elif r < 0.7:
            del b[rnd.randint(0, len(b)):]
        elif r < 0.8:
            i = rnd.randint(0, len(b))
            b[i:i] = rnd.randbytes(rnd.randint(1, 3))
        elif r < 0.9 and b:
            i = rnd.randrange(len(b))
            del b[i:i + rnd.randint(1, 3)]
        else:                                   # a long vint where a short one was
            i = rnd.randint(0, len(b))
            b[i:i] = rnd.choice([b"\xff" * 9, b"\xff\x00\x00\x00\x01\x00\x00\x00\x05", b"\x80\x00", b"\xf0"])
    return bytes(b)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=SLOW)
@given(seed=st.integers(0, 2**32 - 1), mv=st.sampled_from([11, 12, 13]))
def test_fuzzed_mutations_are_never_decided_differently(reader, seed, mv):
    rnd = random.Random(seed)
    schema = random_schema(rnd)
    gen = MutationGen(rnd, schema, mv)
    cells = _cells(reader)
    records, ei = [], 0
    for _ in range(40):
        data = _fuzz(rnd, encode_mutation(gen.mutation(), schema, mv))
        if not data:
            continue
        recs, n = _reference_records(data, schema, mv, 7, ei)
        try:
            got = cells.add_entry(data, schema, mv, SEG, 42, 7, ei)
        except Exception:  # noqa: BLE001 - left to the reference: always allowed
            continue
        assert recs is not None, f"the {reader} fast path accepted what the reference rejects: {data.hex()}"
        assert got == n
        records += recs
        ei += n
    if records:
        _compare(cells, records)
    else:
        assert len(cells) == 0


@settings(max_examples=examples(200), deadline=None, suppress_health_check=SLOW)
@given(data=st.binary(min_size=1, max_size=300), mv=st.sampled_from([12, 13]))
def test_random_bytes_are_never_decided_differently(reader, sample_schema, data, mv):
    # a real table id after the update count, so that decoding gets past the table lookup
    tid = next(iter(sample_schema.tables)).bytes
    data = data[:1] + tid + data[1:] if data[0] < 0x80 else data
    recs, n = _reference_records(data, sample_schema, mv, 7, 0)
    cells = _cells(reader)
    try:
        got = cells.add_entry(data, sample_schema, mv, SEG, 42, 7, 0)
    except Exception:  # noqa: BLE001 - left to the reference
        return
    assert recs is not None
    assert got == n
    _compare(cells, recs)


@pytest.fixture(scope="module")
def sample_schema():
    from cdc_lib.demo.workload import sample_schema
    return sample_schema()


def test_native_token_crc_and_mutation_id_match_python():
    require("native")
    import cdc_native

    from cdc_lib.commitlog.model import mutation_id
    from cdc_lib.cql.tokens import token_reference
    rnd = random.Random(1)
    for n in list(range(0, 70)) + [127, 128, 129, 255, 256, 1000, 4097]:
        for _ in range(5):
            key = rnd.randbytes(n)
            assert cdc_native.token(key) == token_reference(key)
            assert cdc_native.crc32(key, 12345) == zlib.crc32(key, 12345)
            assert cdc_native.mutation_id(key) == mutation_id(key)


# ------------------------------------------------------------------------------------------ fuzzed segments

_GENERATED: dict = {}
CORPUS_FILES = {
    "4.0.11": "commitlog/4.0.11/CommitLog-7-1699285478684.log",
    "3.0.29": "commitlog/3.0.29/CommitLog-6-1699279786262.log",
    "2.2-lz4": "commitlog/2.2-lz4/CommitLog-5-1438186885380.log",
}


def _generated_segments(tmp_path_factory):
    """Generated segments: plain v7, LZ4 v7, Snappy v6, Zstd v8, encrypted v7 (the sample schema)."""
    if _GENERATED:
        return _GENERATED
    from cdc_lib.commitlog.encryption import EncryptionKeys
    from cdc_lib.demo.workload import Workload, sample_schema
    schema = sample_schema()
    keys = EncryptionKeys.from_hex("k=" + "11" * 16)
    d = tmp_path_factory.mktemp("gen")
    for i, (version, codec, enc) in enumerate([(7, None, False), (7, "LZ4Compressor", False),
                                               (6, "SnappyCompressor", False), (8, "ZstdCompressor", False),
                                               (7, None, True)]):
        wl = Workload(schema, seed=i)
        w = SegmentWriter(d, 500 + i, version=version, compression=codec, keys=keys if enc else None,
                          key_alias="k" if enc else None, segment_size=1 << 20)
        for j in range(300):
            w.add(encode_mutation(wl.next_mutation(), schema, {6: 11, 7: 12, 8: 13}[version]))
            if j % 40 == 39:
                w.sync()
        w.close()
        _GENERATED[f"gen-v{version}-{codec or ('enc' if enc else 'plain')}"] = (w.path, schema, keys if enc else None)
    return _GENERATED


def _reseal(raw: bytearray, header_size: int) -> None:
    """Recompute both CRCs of every entry of a plain segment (sizes as they are), so that changed mutation
    bytes pass the container and reach the decoder."""
    pos = header_size
    n = len(raw)
    while pos <= n - 8:
        nxt = wire.be_i32(raw, pos)
        if nxt <= pos or nxt > n:
            return
        p = pos + 8
        while p + 8 <= nxt:
            size = wire.be_i32(raw, p)
            if size < 10 or p + 12 + size > nxt:
                break
            c1 = zlib.crc32(raw[p:p + 4])
            raw[p + 4:p + 8] = c1.to_bytes(4, "big")
            raw[p + 8 + size:p + 12 + size] = zlib.crc32(raw[p + 8:p + 8 + size], c1).to_bytes(4, "big")
            p += 12 + size
        pos = nxt


@settings(max_examples=examples(120), deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_fuzzed_segments(corpus, tmp_path_factory, reader, data):
    gen = _generated_segments(tmp_path_factory)
    name = data.draw(st.sampled_from(sorted(CORPUS_FILES) + sorted(gen)))
    if name in CORPUS_FILES:
        src, kw = str(corpus / CORPUS_FILES[name]), {"schema_from_log": True}
    else:
        src, schema, keys = gen[name]
        kw = {"schema": schema, "keys": keys}
    raw = bytearray(open(src, "rb").read()[:data.draw(st.sampled_from([20_000, 90_000, 300_000]))])
    header_size = 18 + int.from_bytes(raw[12:14], "big")
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        if data.draw(st.booleans()):
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        else:
            raw[i] = data.draw(st.integers(0, 255))
    if name in ("4.0.11", "3.0.29", "gen-v7-plain") and data.draw(st.booleans()):
        _reseal(raw, header_size)
    cut = data.draw(st.integers(0, len(raw)))
    out = tmp_path_factory.mktemp("fuzz") / src.rsplit("/", 1)[1]
    out.write_bytes(bytes(raw[:cut]))
    check(reader, [out], batch_rows=data.draw(st.sampled_from([1, 50, 65536])),
          strict=data.draw(st.sampled_from([False, False, False, True])), **kw)


@pytest.mark.parametrize("seed", range(12))
def test_resealed_mutation_garbage(corpus, tmp_path, reader, seed):
    """Entries whose mutation bytes are changed and whose CRCs are recomputed: every one reaches a decoder."""
    rnd = random.Random(seed)
    src = str(corpus / CORPUS_FILES["4.0.11" if seed % 2 else "3.0.29"])
    raw = bytearray(open(src, "rb").read())
    entries = [e for e in SegmentReader(src) if isinstance(e, LogEntry)]
    for e in rnd.sample(entries, 25):
        base = e.start + 8
        for _ in range(rnd.randint(1, 3)):
            i = base + rnd.randrange(len(e.data))
            raw[i] = rnd.randrange(256) if rnd.random() < 0.5 else raw[i] ^ (1 << rnd.randrange(8))
    _reseal(raw, 20)
    out = tmp_path / src.rsplit("/", 1)[1]
    out.write_bytes(bytes(raw))
    check(reader, [out], schema_from_log=True, batch_rows=rnd.choice([1, 64, 65536]))
