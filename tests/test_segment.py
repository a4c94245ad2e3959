"""The segment container on real Cassandra files: header, sections, CRCs, compression, damage, positions."""
import glob
import os

import pytest

from cdc_lib import wire
from cdc_lib.commitlog.segment import Damage, LogEntry, SegmentReader, parse_segment_name, read_header
from cdc_lib.commitlog.writer import SegmentWriter, encode_header
from cdc_lib.errors import SegmentError


def _one(corpus, d):
    return sorted(glob.glob(str(corpus / "commitlog" / d / "*.log")))[0]


def _section_ends(raw: bytes, header_size: int) -> set:
    """Logical ends of the sections of an uncompressed segment, from its sync markers."""
    ends, pos = set(), header_size
    while pos <= len(raw) - 8:
        nxt = wire.be_i32(raw, pos)
        if nxt == 0:
            break
        ends.add(nxt)
        pos = nxt
    return ends


@pytest.mark.parametrize("d,version,entries,last", [("4.0.11", 7, 358, 75003), ("3.0.29", 6, 176, 66716)])
def test_real_segments_every_entry_crc_valid(corpus, d, version, entries, last):
    r = SegmentReader(_one(corpus, d))
    recs = list(r)
    assert not r.damaged
    assert all(isinstance(x, LogEntry) for x in recs)
    assert r.header.version == version and r.header.params == {} and r.header.size == 20
    assert len(recs) == entries
    assert recs[-1].position == last
    # positions are entry ends; each entry starts where the previous ended or after a marker
    for a, b in zip(recs, recs[1:]):
        assert b.start in (a.position, a.position + 8)
        assert b.position == b.start + 12 + len(b.data)


def test_header_id_matches_file_name(corpus):
    path = _one(corpus, "4.0.11")
    version, seg_id = parse_segment_name(path)
    with open(path, "rb") as f:
        h = read_header(f.read(64), path)
    assert (h.version, h.id) == (version, seg_id) == (7, 1699285478684)


def test_header_crc_damage_is_reported_not_raised(corpus, tmp_path):
    raw = bytearray(open(_one(corpus, "4.0.11"), "rb").read())
    raw[5] ^= 0xFF
    p = tmp_path / "CommitLog-7-1699285478684.log"
    p.write_bytes(bytes(raw))
    recs = list(SegmentReader(p))
    assert len(recs) == 1 and isinstance(recs[0], Damage) and recs[0].kind == "header"
    assert "CRC" in recs[0].reason and len(recs[0].data) == len(raw)   # the whole file kept for quarantine
    with pytest.raises(SegmentError) as e:
        list(SegmentReader(p, strict=True))
    assert "CommitLog-7-1699285478684.log" in str(e.value)


@pytest.mark.parametrize("d", ["2.2-lz4", "2.2-snappy"])
def test_real_compressed_22_container(corpus, d):
    """Descriptor 5 (2.2): same container; every section decompresses and every entry CRC is valid."""
    files = sorted(glob.glob(str(corpus / "commitlog" / d / "*.log")))
    total = 0
    for f in files:
        r = SegmentReader(f)
        recs = list(r)
        assert not any(isinstance(x, Damage) for x in recs)
        assert r.header.version == 5 and r.header.compression_class.endswith("Compressor")
        total += len(recs)
        # logical positions strictly increase and are uncompressed offsets (beyond the compressed file size)
        positions = [x.position for x in recs]
        assert positions == sorted(positions)
    # hash.txt counts 6052 / 6051 data cells; the segments hold them plus a few system mutations
    assert total in (6134, 6133)


def test_damaged_22_sets_stop_cleanly_with_a_report(corpus):
    good = [e.data for e in SegmentReader(_one(corpus, "2.2-lz4"))]
    cases = {"2.2-lz4-truncated": "torn_tail", "2.2-lz4-bitrot": "crc_mismatch", "2.2-lz4-bitrot2": "compression"}
    for d, kind in cases.items():
        r = SegmentReader(_one(corpus, d))
        recs = list(r)
        damage = [x for x in recs if isinstance(x, Damage)]
        entries = [x.data for x in recs if isinstance(x, LogEntry)]
        assert [x.kind for x in damage] == [kind], d
        assert damage[0].data, "damaged bytes are kept for quarantine"
        # everything before the damage was read, and is what the intact file holds
        assert entries == [g for g in good if g in set(entries)]
        assert entries[:100] == good[:100]
        assert len(entries) >= len(good) - 15
        assert r.damaged == (kind != "torn_tail")
        with pytest.raises(SegmentError):
            list(SegmentReader(_one(corpus, d), strict=True))


def test_writer_reproduces_real_segments_byte_for_byte(corpus, tmp_path):
    for d in ("4.0.11", "3.0.29"):
        path = _one(corpus, d)
        raw = open(path, "rb").read()
        r = SegmentReader(path)
        entries = list(r)
        ends = _section_ends(raw, r.header.size)
        w = SegmentWriter(tmp_path, r.header.id, version=r.header.version, segment_size=len(raw))
        for e in entries:
            assert w.add(e.data) == e.position
            if e.position in ends:
                w.sync()
        w.close()
        assert open(w.path, "rb").read() == raw, d


def test_start_and_stop_positions(corpus):
    path = _one(corpus, "4.0.11")
    all_ = list(SegmentReader(path))
    mid = all_[100].position
    after = list(SegmentReader(path, start=mid))
    assert [e.position for e in after] == [e.position for e in all_[101:]]
    before = list(SegmentReader(path, stop=mid))
    assert [e.position for e in before] == [e.position for e in all_[:101]]


def test_live_segment_prefix_and_cdc_idx(tmp_path):
    """A live 4.0 segment: entries past the last sync have no marker yet; the idx offset bounds the read."""
    w = SegmentWriter(tmp_path, 1700000000001, version=7, segment_size=1 << 16)
    ends = [w.add(bytes([1]) * 20 + bytes([i])) for i in range(10)]
    w.sync()
    idx = w.cdc_index()
    assert idx == str(ends[-1])
    for i in range(5):
        w.add(bytes([2]) * 20 + bytes([i]))
    w._f.flush()
    # not yet synced: a reader sees exactly the synced prefix (the next marker slot is zero)
    got = [e.position for e in SegmentReader(w.path)]
    assert got == ends
    assert [e.position for e in SegmentReader(w.path, stop=int(idx))] == ends
    w.close()
    assert w.cdc_index().endswith("\nCOMPLETED")
    assert len(list(SegmentReader(w.path))) == 15


# Cassandra 3.x (descriptor 6) has no Zstd commit-log compressor, so that pair is not generated.
@pytest.mark.parametrize("version,codec", [(v, c) for v in (6, 7, 8)
                                           for c in (None, "LZ4Compressor", "SnappyCompressor", "DeflateCompressor",
                                                     "ZstdCompressor") if not (v == 6 and c == "ZstdCompressor")])
def test_compressed_positions_are_logical(tmp_path, codec, version):
    """Compressed segments report the same logical positions as the uncompressed layout (what _cdc.idx uses)."""
    muts = [os.urandom(10 + i * 7) for i in range(200)]
    (tmp_path / "p").mkdir()
    (tmp_path / "c").mkdir()
    plain = SegmentWriter(tmp_path / "p", 5, version=version, segment_size=1 << 20)
    comp = SegmentWriter(tmp_path / "c", 5, version=version, compression=codec, segment_size=1 << 20)
    # logical offsets count from each file's own header, whose size depends on its parameters
    hp, hc = len(plain.header), len(comp.header)
    for i, m in enumerate(muts):
        assert plain.add(m) - hp == comp.add(m) - hc
        if i % 37 == 36:
            assert plain.sync() - hp == comp.sync() - hc
    plain.close()
    comp.close()
    a = list(SegmentReader(plain.path))
    b = list(SegmentReader(comp.path))
    assert [(e.start - hp, e.position - hp, e.data) for e in a] == [(e.start - hc, e.position - hc, e.data) for e in b]
    assert [e.data for e in b] == muts
    if codec:
        assert os.path.getsize(comp.path) < os.path.getsize(plain.path)


def test_encrypted_segment_round_trip(tmp_path):
    from cdc_lib.commitlog.encryption import EncryptionKeys
    keys = EncryptionKeys.from_hex("testing:1=" + "00112233445566778899aabbccddeeff")
    muts = [os.urandom(50 + i) for i in range(300)]
    w = SegmentWriter(tmp_path, 9, version=7, keys=keys, key_alias="testing:1")
    for i, m in enumerate(muts):
        w.add(m)
        if i % 100 == 99:
            w.sync()
    w.close()
    assert [e.data for e in SegmentReader(w.path, keys=keys)] == muts
    no_key = list(SegmentReader(w.path))
    assert no_key and all(isinstance(x, Damage) and x.kind == "encryption" for x in no_key)
    wrong = EncryptionKeys.from_hex("testing:1=" + "ff" * 16)
    assert all(isinstance(x, Damage) for x in SegmentReader(w.path, keys=wrong))


def test_torn_tail_of_plain_segment(tmp_path, corpus):
    raw = open(_one(corpus, "4.0.11"), "rb").read()
    cut = tmp_path / "CommitLog-7-1699285478684.log"
    cut.write_bytes(raw[:60000])
    recs = list(SegmentReader(cut))
    entries = [x for x in recs if isinstance(x, LogEntry)]
    damage = [x for x in recs if isinstance(x, Damage)]
    assert entries and all(e.position <= 60000 for e in entries)
    assert len(damage) == 1 and damage[0].kind == "torn_tail"


def test_entry_crc_flip_skips_one_entry_only(tmp_path, corpus):
    path = _one(corpus, "4.0.11")
    good = list(SegmentReader(path))
    raw = bytearray(open(path, "rb").read())
    victim = good[50]
    raw[victim.start + 8 + 3] ^= 0x40            # inside the mutation bytes
    p = tmp_path / os.path.basename(path)
    p.write_bytes(bytes(raw))
    recs = list(SegmentReader(p))
    damage = [x for x in recs if isinstance(x, Damage)]
    assert [(d.kind, d.position) for d in damage] == [("crc_mismatch", victim.start)]
    assert [e.position for e in recs if isinstance(e, LogEntry)] == [e.position for e in good if e is not victim]


def test_header_encoding_matches_real_header(corpus):
    raw = open(_one(corpus, "3.0.29"), "rb").read()
    assert encode_header(6, 1699279786262, {}) == raw[:20]
