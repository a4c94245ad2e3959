"""The segment container on real Cassandra files: header, sections, CRCs, compression, damage, positions."""
import glob
import os

import pytest

from cdc_lib import wire
from cdc_lib.commitlog.segment import Damage, LogEntry, SegmentReader, parse_segment_name, read_header
from cdc_lib.commitlog.writer import SegmentWriter, encode_entry, encode_header
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
        assert r.damaged                          # a torn tail loses entries too: damage, like the others
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


def _entries_and_damage(source, **kwargs):
    recs = list(SegmentReader(source, **kwargs))
    return [x for x in recs if isinstance(x, LogEntry)], [x for x in recs if isinstance(x, Damage)]


def test_torn_tail_of_plain_segment_keeps_every_whole_entry(tmp_path, corpus):
    """A 4.0.11 segment cut at 37,500 (inside its 73 KB third section): every entry that ends before the cut is
    read, as the intact file has it; the rest is one torn_tail damage at the first lost entry."""
    path = _one(corpus, "4.0.11")
    raw = open(path, "rb").read()
    intact = list(SegmentReader(path))
    cut = tmp_path / os.path.basename(path)
    cut.write_bytes(raw[:37500])
    r = SegmentReader(cut)
    recs = list(r)
    entries = [x for x in recs if isinstance(x, LogEntry)]
    damage = [x for x in recs if isinstance(x, Damage)]
    kept = [e for e in intact if e.position <= 37500]
    assert len(kept) == 175 and len(intact) == 358
    assert [(e.position, e.data) for e in entries] == [(e.position, e.data) for e in kept]
    first_lost = intact[len(kept)]
    assert [(d.kind, d.position) for d in damage] == [("torn_tail", first_lost.start)]
    assert damage[0].data == raw[first_lost.start:37500]        # what the file still holds of the lost entries
    assert "1576" in damage[0].reason and "75003" in damage[0].reason and "37500" in damage[0].reason
    assert r.damaged
    with pytest.raises(SegmentError, match="torn_tail"):
        list(SegmentReader(cut, strict=True))


def test_every_cut_of_a_real_segment_reads_the_intact_entries_before_it(tmp_path, corpus):
    path = _one(corpus, "4.0.11")
    raw = open(path, "rb").read()
    intact = list(SegmentReader(path))
    boundaries = {20, 467, 1576, 75003, 75011}               # section boundaries (markers) of this file
    p = tmp_path / os.path.basename(path)
    for n in list(range(28, 75030, 331)) + [75003, 75005, 75011, 75015]:
        p.write_bytes(raw[:n])
        entries, damage = _entries_and_damage(p)
        assert [e.data for e in entries] == [e.data for e in intact if e.position <= n], n
        if n in boundaries or n >= 75011:
            assert damage == [], n                           # cut where a section ends, or in the zero tail
        elif 75003 < n < 75011:
            assert [d.kind for d in damage] == ["torn_tail"] and "sync marker" in damage[0].reason, n
        else:
            lost = next(e for e in intact if e.position > n)
            assert [(d.kind, d.position) for d in damage] == [("torn_tail", lost.start)], n


def test_torn_real_lz4_section_keeps_the_entries_its_intact_prefix_decodes_to(corpus):
    """2.2-lz4-truncated is 2.2-lz4 without its last 50 bytes. Cassandra drops the whole cut section (hash.txt:
    6037 of 6052 cells); LZ4 decodes in order, so every entry of that section but the cut one is recovered, each
    equal to the intact file's and checked by its CRCs."""
    intact = list(SegmentReader(_one(corpus, "2.2-lz4")))
    path = _one(corpus, "2.2-lz4-truncated")
    entries, damage = _entries_and_damage(path)
    assert len(entries) == len(intact) - 1
    assert [(e.position, e.data) for e in entries] == [(e.position, e.data) for e in intact[:-1]]
    assert [(d.kind, d.position, d.physical_position) for d in damage] == [("torn_tail", intact[-1].start, 837068)]
    raw = open(path, "rb").read()
    assert damage[0].data == raw[837068:]                      # the cut section's file bytes, for quarantine


@pytest.mark.parametrize("codec", ["LZ4Compressor", "SnappyCompressor", "DeflateCompressor", "ZstdCompressor",
                                   "NoopCompressor", "encrypted"])
def test_torn_compressed_or_encrypted_section_keeps_a_prefix_of_its_entries(tmp_path, codec):
    from cdc_lib.commitlog.encryption import EncryptionKeys
    keys = EncryptionKeys.from_hex("testing:1=" + "00112233445566778899aabbccddeeff")
    kwargs = ({"keys": keys, "key_alias": "testing:1"} if codec == "encrypted" else {"compression": codec})
    w = SegmentWriter(tmp_path, 1234, version=7, **kwargs)
    muts = [bytes([i % 251]) * 20 + os.urandom(30 + i % 90) for i in range(400)]
    for i, m in enumerate(muts):
        w.add(m)
        if i in (99, 199):
            w.sync()
    last_section_start = w._physical
    w.close()
    raw = open(w.path, "rb").read()
    read_keys = keys if codec == "encrypted" else None
    intact = list(SegmentReader(w.path, keys=read_keys))
    assert [e.data for e in intact] == muts
    p = tmp_path / "cut" / os.path.basename(w.path)
    p.parent.mkdir()
    recovered = []
    for frac in (0.0, 0.3, 0.6, 0.9, 0.999):
        n = last_section_start + 12 + int((len(raw) - 8 - last_section_start - 12) * frac)   # 8: final empty section
        p.write_bytes(raw[:n])
        entries, damage = _entries_and_damage(p, keys=read_keys)
        got = [e.data for e in entries]
        assert got == muts[:len(got)] and len(got) >= 200, (codec, frac)
        assert [d.kind for d in damage] == ["torn_tail"] and damage[0].physical_position == last_section_start
        assert damage[0].position == intact[len(got)].start          # the first lost entry
        recovered.append(len(got) - 200)
    assert recovered == sorted(recovered)
    if codec != "ZstdCompressor":                  # zstd decodes whole blocks only (this section is one block)
        assert recovered[-2] > 100, recovered


@pytest.mark.parametrize("compression", [None, "LZ4Compressor"])
def test_live_segment_read_up_to_its_idx_offset_is_not_torn(tmp_path, compression):
    """What the agent ships of a live 4.0+ segment ends at its _cdc.idx offset, which is always the end of a
    section: reading the live file with stop=offset, or only the bytes before it, is clean."""
    from cdc_lib.agent.cdc_raw import synced_file_end
    w = SegmentWriter(tmp_path, 99, version=7, compression=compression, segment_size=1 << 20)
    synced = []
    for section in range(3):
        batch = [os.urandom(40 + 7 * i + section) for i in range(30)]
        for m in batch:
            w.add(m)
        offset = w.sync()
        synced += batch
        w._f.flush()
        live = open(w.path, "rb").read()
        if compression is None:
            # a memory-mapped file already shows mutations allocated after the sync, behind the zero marker
            live = live[:offset + 8] + encode_entry(os.urandom(50)) + live[offset + 8:]
            with open(w.path, "r+b") as f:
                f.write(live)
        end = synced_file_end(w.path, offset)
        for source, stop in ((w.path, offset), (live[:end], None)):
            entries, damage = _entries_and_damage(source, name=w.name, stop=stop)
            assert damage == [] and [e.data for e in entries] == synced, (section, stop)
    w.close()


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
