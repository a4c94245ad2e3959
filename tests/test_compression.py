"""Section codecs (format reference §5.3), checked against real compressed segments and the JDK.

The 2.2 LZ4 and Snappy segments in the shared corpus are the only real compressed commit logs: a small walker
here reads their container (descriptor 5 uses the 6/7/8 container) and every section must decompress to exactly
its stated length and hold entries with valid CRCs that fill it exactly. Deflate is compared byte for byte with
``java.util.zip.Deflater`` (JDK required). If Cassandra's own codec libraries are at hand (lz4-java, snappy-java
and zstd-jni ship in pyspark's jars), a Java program also checks that they read what we write and vice versa.
"""
from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_lib.commitlog.compression import (DeflateCompressor, LZ4Compressor, NoopCompressor, SnappyCompressor,
                                           ZstdCompressor, compressor_for)
from cdc_lib.errors import CompressionError, ConfigError

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "commitlog"
# Short-lived JVMs start (and compile the single-file programs) about twice as fast with these.
JVM_FAST_START = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
CODECS = ("LZ4Compressor", "SnappyCompressor", "DeflateCompressor", "ZstdCompressor", "NoopCompressor")


# ---------------------------------------------------------------------------------------------------------------
# A test-local walker over compressed segments (header §2.2, sections §5.1, entries §7).

@dataclass
class Section:
    position: int        # physical offset of the section header
    next_marker: int
    marker_crc_ok: bool
    uncompressed_length: int
    payload: bytes


def _crc_ints(*values: int, crc: int = 0) -> int:
    for v in values:
        crc = zlib.crc32(struct.pack(">I", v & 0xFFFFFFFF), crc)
    return crc


def read_compressed_segment(path: Path) -> tuple[dict, list[Section]]:
    raw = path.read_bytes()
    version, segment_id, params_length = struct.unpack_from(">iqH", raw, 0)
    params_bytes = raw[14:14 + params_length]
    (header_crc,) = struct.unpack_from(">I", raw, 14 + params_length)
    expected = zlib.crc32(params_bytes, _crc_ints(version, segment_id, segment_id >> 32, params_length))
    assert header_crc == expected, f"{path}: header CRC"
    assert path.name == f"CommitLog-{version}-{segment_id}.log"
    params = json.loads(params_bytes)
    sections = []
    pos = 18 + params_length
    while pos <= len(raw) - 12:
        next_marker, crc, length = struct.unpack_from(">iIi", raw, pos)
        sections.append(Section(pos, next_marker, crc == _crc_ints(segment_id, segment_id >> 32, pos), length,
                                raw[pos + 12:next_marker]))
        if not sections[-1].marker_crc_ok or not pos < next_marker <= len(raw):
            break
        pos = next_marker
    return params, sections


def entries_of(data: bytes) -> list[bytes]:
    """Entries (i32 size, u32 crc(size), bytes, u32 crc(size+bytes)) that must fill ``data`` exactly."""
    entries, pos = [], 0
    while pos < len(data):
        size, size_crc = struct.unpack_from(">iI", data, pos)
        assert size >= 10 and size_crc == zlib.crc32(struct.pack(">i", size)), f"entry size CRC at {pos}"
        body = data[pos + 8:pos + 8 + size]
        (body_crc,) = struct.unpack_from(">I", data, pos + 8 + size)
        assert body_crc == zlib.crc32(body, size_crc), f"entry CRC at {pos}"
        entries.append(body)
        pos += size + 12
    assert pos == len(data)
    return entries


REAL_SEGMENTS = {
    "lz4": sorted((CORPUS / "2.2-lz4").glob("CommitLog-*.log")),
    "snappy": sorted((CORPUS / "2.2-snappy").glob("CommitLog-*.log")),
}


@pytest.mark.parametrize("kind", ["lz4", "snappy"])
def test_real_22_segments_decompress_to_entries_with_valid_crcs(kind):
    paths = REAL_SEGMENTS[kind]
    assert len(paths) == 2, f"corpus not found under {CORPUS}"
    total_entries = 0
    for path in paths:
        params, sections = read_compressed_segment(path)
        assert params["compressionParameters"] is None  # 2.2 writes JSON null
        codec = compressor_for(params["compressionClass"], params["compressionParameters"])
        assert codec.name == {"lz4": "LZ4Compressor", "snappy": "SnappyCompressor"}[kind]
        assert all(s.marker_crc_ok for s in sections)
        assert sections[-1].next_marker == path.stat().st_size  # the file ends right after the last section
        for section in sections:
            data = codec.decompress(section.payload, section.uncompressed_length)
            assert len(data) == section.uncompressed_length
            total_entries += len(entries_of(data))
        # A segment closes with an empty section: the compressor's output for no input.
        assert sections[-1].uncompressed_length == 0
        assert sections[-1].payload == codec.compress(b"")
    assert total_entries > 6000  # hash.txt: about 6050 data cells, one per mutation, plus system mutations


def test_real_lz4_sections_round_trip_through_our_compressor():
    """Our LZ4 output is not lz4-java's byte for byte (see module notes), but it decodes to the same entries."""
    codec = LZ4Compressor()
    _, sections = read_compressed_segment(REAL_SEGMENTS["lz4"][0])
    for section in sections:
        data = codec.decompress(section.payload, section.uncompressed_length)
        ours = codec.compress(data)
        assert ours[:4] == section.payload[:4]  # the little-endian length prefix is identical
        assert codec.decompress(ours, len(data)) == data


def _sections_by_position(path: Path) -> dict[int, Section]:
    return {s.position: s for s in read_compressed_segment(path)[1]}


@pytest.mark.parametrize("copy", ["2.2-lz4-bitrot", "2.2-lz4-bitrot2"])
def test_damaged_real_sections_never_pass_silently(copy):
    """Every section whose bytes differ from the original either fails to decompress (CompressionError) or
    yields entries whose CRCs fail; no other exception escapes and undamaged sections still decode."""
    codec = LZ4Compressor()
    original = _sections_by_position(REAL_SEGMENTS["lz4"][0])
    damaged = _sections_by_position(CORPUS / copy / REAL_SEGMENTS["lz4"][0].name)
    caught = 0
    for pos, section in damaged.items():
        if pos not in original or (section.payload, section.uncompressed_length) == (
                original[pos].payload, original[pos].uncompressed_length):
            if section.marker_crc_ok and pos in original:
                entries_of(codec.decompress(section.payload, section.uncompressed_length))
            continue
        try:
            data = codec.decompress(section.payload, section.uncompressed_length)
        except CompressionError:
            caught += 1
            continue
        with pytest.raises(AssertionError, match="CRC"):
            entries_of(data)
        caught += 1
    assert caught >= 1


def test_truncated_real_section_is_a_compression_error():
    path = CORPUS / "2.2-lz4-truncated" / REAL_SEGMENTS["lz4"][0].name
    sections = read_compressed_segment(path)[1]
    last = sections[-1]
    assert last.marker_crc_ok and last.next_marker > path.stat().st_size  # "bad position but valid CRC"
    with pytest.raises(CompressionError):
        LZ4Compressor().decompress(last.payload, last.uncompressed_length)


# ---------------------------------------------------------------------------------------------------------------
# Framing and parameters.

def _sample(n: int, seed: int = 0) -> bytes:
    rnd = random.Random(seed)
    out = bytearray()
    while len(out) < n:
        out += rnd.randbytes(rnd.randrange(1, 40)) + b"name0" * rnd.randrange(0, 30)
    return bytes(out[:n])


def test_framing_of_each_codec():
    data = _sample(5000)
    lz4 = compressor_for("LZ4Compressor").compress(data)
    assert lz4[:4] == (5000).to_bytes(4, "little")
    snappy = compressor_for("SnappyCompressor").compress(data)
    assert snappy[:2] == bytes([0x88, 0x27])  # LEB128 5000, raw snappy block
    deflate = compressor_for("DeflateCompressor").compress(data)
    assert zlib.decompress(deflate) == data and deflate[:2] == b"\x78\x9c"  # zlib header, default level
    zstd = compressor_for("ZstdCompressor").compress(data)
    assert zstd[:4] == bytes.fromhex("28b52ffd")
    assert zstd[4] & 0x04  # content checksum flag
    assert zstd[4] & 0xC0 or zstd[4] & 0x20  # content size written (FCS field or single-segment)
    assert compressor_for("NoopCompressor").compress(data) == data


def test_empty_sections():
    expected = {
        "LZ4Compressor": bytes(5),                      # LE length 0 + empty LZ4 block (one zero token)
        "SnappyCompressor": b"\x00",
        "DeflateCompressor": b"",                       # Cassandra returns early: the Deflater needs input
        "ZstdCompressor": bytes.fromhex("28b52ffd240001000099e9d851"),  # what zstd-jni Zstd.compress writes
        "NoopCompressor": b"",
    }
    for name, payload in expected.items():
        codec = compressor_for(name)
        assert codec.compress(b"") == payload, name
        assert codec.decompress(payload, 0) == b"", name
    # A full empty zlib stream (a Deflater on another code path) is read as empty too.
    assert DeflateCompressor().decompress(zlib.compress(b""), 0) == b""


def test_compressor_for_names_and_errors():
    for name in CODECS:
        assert compressor_for(name).name == name
        assert compressor_for("org.apache.cassandra.io.compress." + name).name == name
        assert compressor_for(name, None).parameters == {}
    with pytest.raises(ConfigError, match="com.example.FancyCompressor"):
        compressor_for("com.example.FancyCompressor")
    with pytest.raises(ConfigError, match="BrotliCompressor"):
        compressor_for("BrotliCompressor", {})
    for name, params in [("ZstdCompressor", {"compression_level": "99"}),
                         ("ZstdCompressor", {"compression_level": "three"}),
                         ("LZ4Compressor", {"lz4_compressor_type": "turbo"}),
                         ("LZ4Compressor", {"lz4_compressor_type": "high", "lz4_high_compressor_level": "18"}),
                         ("DeflateCompressor", {"compression_level": "10"})]:
        with pytest.raises(ConfigError):
            compressor_for(name, params)


def test_parameters_change_the_output_as_in_cassandra():
    data = _sample(100000, 3)
    fast = compressor_for("LZ4Compressor", {})
    high = compressor_for("LZ4Compressor", {"lz4_compressor_type": "high", "lz4_high_compressor_level": "9"})
    assert high.parameters == {"lz4_compressor_type": "high", "lz4_high_compressor_level": "9"}
    assert len(high.compress(data)) < len(fast.compress(data))
    assert fast.decompress(high.compress(data), len(data)) == data  # one decompressor for both
    # Cassandra ignores lz4_high_compressor_level unless the type is high.
    assert compressor_for("LZ4Compressor", {"lz4_high_compressor_level": "17"}).compress(data) == fast.compress(data)
    zstd3, zstd19 = compressor_for("ZstdCompressor", {}), compressor_for("ZstdCompressor", {"compression_level": "19"})
    assert zstd3.compress(data) == compressor_for("ZstdCompressor", {"compression_level": "3"}).compress(data)
    assert zstd19.compress(data) != zstd3.compress(data)
    assert zstd3.decompress(zstd19.compress(data), len(data)) == data
    assert compressor_for("DeflateCompressor", {"compression_level": "1"}).compress(data) == zlib.compress(data, 1)
    assert compressor_for("DeflateCompressor", {}).compress(data) == zlib.compress(data, 6)


# ---------------------------------------------------------------------------------------------------------------
# Properties: round trip, and damage always becomes CompressionError.

data_strategy = st.one_of(st.binary(max_size=3000),
                          st.builds(_sample, st.integers(0, 20000), st.integers(0, 1000)))


@settings(max_examples=60, deadline=None)
@given(data=data_strategy, name=st.sampled_from(CODECS))
def test_round_trip(data, name):
    codec = compressor_for(name)
    assert codec.decompress(codec.compress(data), len(data)) == data


@settings(max_examples=60, deadline=None)
@given(data=data_strategy, name=st.sampled_from(CODECS), delta=st.sampled_from([-1, 1, 1000]))
def test_wrong_uncompressed_length_is_a_compression_error(data, name, delta):
    codec = compressor_for(name)
    if len(data) + delta < 0:
        return
    with pytest.raises(CompressionError):
        codec.decompress(codec.compress(data), len(data) + delta)


@settings(max_examples=60, deadline=None)
@given(data=st.builds(_sample, st.integers(1, 5000), st.integers(0, 1000)),
       name=st.sampled_from(CODECS[:4]), cut=st.floats(0, 1, exclude_max=True))
def test_truncated_payload_is_a_compression_error(data, name, cut):
    codec = compressor_for(name)
    payload = codec.compress(data)
    with pytest.raises(CompressionError):
        codec.decompress(payload[:int(len(payload) * cut)], len(data))


@settings(max_examples=100, deadline=None)
@given(data=st.builds(_sample, st.integers(0, 20000), st.integers(0, 1000)),
       name=st.sampled_from(CODECS), cut=st.floats(0, 1))
def test_a_cut_payload_decodes_to_an_exact_prefix(data, name, cut):
    """What a torn last section still holds (``decompress_prefix``): always a prefix of the section's bytes, the
    whole of them for the whole payload, and, for the sequential codecs, more the more of the payload is kept."""
    codec = compressor_for(name)
    payload = codec.compress(data)
    assert codec.decompress_prefix(payload, len(data)) == data
    n = int(len(payload) * cut)
    head = codec.decompress_prefix(payload[:n], len(data))
    assert data.startswith(head)
    if name != "ZstdCompressor" and n < len(payload):
        assert len(codec.decompress_prefix(payload[:n + 1], len(data))) >= len(head)


def test_cut_real_lz4_and_snappy_sections_decode_to_prefixes_of_the_sections():
    for kind in ("lz4", "snappy"):
        for section in read_compressed_segment(REAL_SEGMENTS[kind][0])[1][:3]:
            codec = LZ4Compressor() if kind == "lz4" else SnappyCompressor()
            whole = codec.decompress(section.payload, section.uncompressed_length)
            for frac in (0.1, 0.5, 0.9):
                head = codec.decompress_prefix(section.payload[:int(len(section.payload) * frac)],
                                               section.uncompressed_length)
                assert whole.startswith(head) and len(head) > len(whole) * frac / 4, (kind, frac)


@settings(max_examples=100, deadline=None)
@given(data=st.builds(_sample, st.integers(1, 5000), st.integers(0, 1000)),
       name=st.sampled_from(CODECS[:4]), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_flipped_bit_never_escapes_as_a_library_error(data, name, where, bit):
    """Zstd (content checksum) and Deflate (Adler-32) never return wrong bytes; a flip they accept only changed
    the encoding, not the content (e.g. a one-byte raw zstd block turned into an RLE block of the same byte).
    LZ4 and Snappy have no checksum: a flipped literal may decode to other bytes of the right length (the entry
    CRCs catch those). Whatever happens, no library exception escapes."""
    codec = compressor_for(name)
    payload = bytearray(codec.compress(data))
    payload[int(len(payload) * where)] ^= 1 << bit
    try:
        out = codec.decompress(bytes(payload), len(data))
    except CompressionError:
        return
    if name in ("ZstdCompressor", "DeflateCompressor"):
        assert out == data
    else:
        assert len(out) == len(data)


@pytest.mark.parametrize("name", CODECS[:4])
def test_garbage_and_trailing_bytes(name):
    codec = compressor_for(name)
    data = _sample(3000, 9)
    for garbage in (b"\xff" * 64, bytes(range(256))):
        with pytest.raises(CompressionError):
            codec.decompress(garbage, len(data))
    if name in ("DeflateCompressor", "ZstdCompressor"):  # self-delimiting streams: bytes after them are damage
        with pytest.raises(CompressionError, match="after|unused"):
            codec.decompress(codec.compress(data) + b"\x00", len(data))
    with pytest.raises(CompressionError):
        codec.decompress(codec.compress(data), -1)


def test_noop_only_checks_the_length():
    assert NoopCompressor().decompress(b"abc", 3) == b"abc"
    with pytest.raises(CompressionError):
        NoopCompressor().decompress(b"abc", 4)


def test_compression_error_position_is_payload_relative():
    with pytest.raises(CompressionError) as info:
        SnappyCompressor().decompress(b"\x05abc", 5)
    assert info.value.position == 0
    relocated = info.value.located("CommitLog-7-1.log", 1234)
    assert relocated.position == 1234 and "CommitLog-7-1.log @ 1234" in str(relocated)


# ---------------------------------------------------------------------------------------------------------------
# Against Java: the JDK's Deflater (always), Cassandra's codec libraries (when their jars are installed).

JAVA_DEFLATE = r"""
import java.nio.file.*;
import java.util.zip.*;

public class DeflateCheck {
    // What Cassandra's DeflateCompressor.compressArray does: new Deflater(), reset, setInput, finish, one deflate.
    public static void main(String[] a) throws Exception {
        Deflater def = new Deflater();
        Inflater inf = new Inflater();
        for (int i = 0; i + 2 < a.length; i += 3) {
            byte[] in = Files.readAllBytes(Paths.get(a[i]));
            def.reset();
            def.setInput(in, 0, in.length);
            def.finish();
            byte[] out = new byte[in.length + (in.length >> 12) + (in.length >> 14) + (in.length >> 25) + 13];
            int len = def.needsInput() ? 0 : def.deflate(out, 0, out.length);
            Files.write(Paths.get(a[i + 1]), java.util.Arrays.copyOf(out, len));
            // and inflate what Python wrote, as DeflateCompressor.uncompress does
            byte[] ours = Files.readAllBytes(Paths.get(a[i + 2]));
            inf.reset();
            inf.setInput(ours, 0, ours.length);
            byte[] back = new byte[in.length];
            int n = inf.needsInput() ? 0 : inf.inflate(back, 0, back.length);
            if (n != in.length || !java.util.Arrays.equals(back, in) || (in.length > 0 && !inf.finished()))
                throw new IllegalStateException("Inflater could not read Python's stream " + a[i + 2]);
        }
    }
}
"""


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        pytest.fail("java (JDK) is not on PATH; the project's tests need a JDK (OpenJDK 17)")
    return java


def test_deflate_is_byte_identical_to_java_util_zip(tmp_path):
    (tmp_path / "DeflateCheck.java").write_text(JAVA_DEFLATE)
    codec = DeflateCompressor()
    samples = [b"", b"x", _sample(1000, 1), _sample(70000, 2), random.Random(5).randbytes(20000)]
    args = []
    for i, data in enumerate(samples):
        (tmp_path / f"raw{i}").write_bytes(data)
        (tmp_path / f"py{i}").write_bytes(codec.compress(data))
        args += [str(tmp_path / f"raw{i}"), str(tmp_path / f"java{i}"), str(tmp_path / f"py{i}")]
    done = subprocess.run([_java(), *JVM_FAST_START, str(tmp_path / "DeflateCheck.java"), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for i, data in enumerate(samples):
        java_payload = (tmp_path / f"java{i}").read_bytes()
        assert codec.compress(data) == java_payload, f"sample {i}"
        assert codec.decompress(java_payload, len(data)) == data


JAVA_CODECS = r"""
import java.nio.ByteBuffer;
import java.nio.file.*;
import java.util.Arrays;
import net.jpountz.lz4.*;

public class CodecCheck {
    static byte[] read(String p) throws Exception { return Files.readAllBytes(Paths.get(p)); }

    public static void main(String[] a) throws Exception {
        LZ4SafeDecompressor lz4d = LZ4Factory.fastestInstance().safeDecompressor();
        LZ4Compressor lz4c = LZ4Factory.fastestInstance().fastCompressor();
        for (int i = 1; i + 1 < a.length; i += 2) {
            byte[] raw = read(a[i]);
            String base = a[i + 1];
            // Decode Python's payloads the way Cassandra's compressors do.
            byte[] lz4 = read(base + ".lz4");
            int n = (lz4[0] & 0xFF) | (lz4[1] & 0xFF) << 8 | (lz4[2] & 0xFF) << 16 | (lz4[3] & 0xFF) << 24;
            byte[] out = new byte[n];
            if (lz4d.decompress(lz4, 4, lz4.length - 4, out, 0, n) != n || !Arrays.equals(out, raw))
                throw new IllegalStateException("lz4-java cannot read " + base);
            byte[] snappy = read(base + ".snappy");
            if (!Arrays.equals(org.xerial.snappy.Snappy.uncompress(snappy), raw))
                throw new IllegalStateException("snappy-java cannot read " + base);
            byte[] zstd = read(base + ".zstd");
            byte[] zout = new byte[raw.length];
            long zn = com.github.luben.zstd.Zstd.decompressByteArray(zout, 0, zout.length, zstd, 0, zstd.length);
            if (com.github.luben.zstd.Zstd.isError(zn) || zn != raw.length || !Arrays.equals(zout, raw))
                throw new IllegalStateException("zstd-jni cannot read " + base);
            // Write what Cassandra's compressors would write.
            byte[] block = lz4c.compress(raw);
            byte[] framed = new byte[block.length + 4];
            framed[0] = (byte) raw.length; framed[1] = (byte) (raw.length >>> 8);
            framed[2] = (byte) (raw.length >>> 16); framed[3] = (byte) (raw.length >>> 24);
            System.arraycopy(block, 0, framed, 4, block.length);
            Files.write(Paths.get(base + ".java.lz4"), framed);
            Files.write(Paths.get(base + ".java.snappy"), org.xerial.snappy.Snappy.compress(raw));
            ByteBuffer src = ByteBuffer.allocateDirect(Math.max(raw.length, 1));
            src.put(raw).flip();
            ByteBuffer dst = ByteBuffer.allocateDirect((int) com.github.luben.zstd.Zstd.compressBound(raw.length));
            com.github.luben.zstd.Zstd.compress(dst, src, 3, true);  // ZstdCompressor.compress, default level
            dst.flip();
            byte[] z = new byte[dst.remaining()];
            dst.get(z);
            Files.write(Paths.get(base + ".java.zstd"), z);
        }
        System.out.println(com.github.luben.zstd.util.ZstdVersion.VERSION);
    }
}
"""


def _codec_jars() -> list[Path]:
    """Cassandra's codec libraries, as pyspark (a required package) ships them; missing ones fail the test."""
    import pyspark
    jars = Path(pyspark.__file__).parent / "jars"
    found = {pattern: sorted(jars.glob(pattern)) for pattern in ("lz4-java-*.jar", "snappy-java-*.jar",
                                                                  "zstd-jni-*.jar")}
    missing = [pattern for pattern, paths in found.items() if not paths]
    assert not missing, f"{jars} lacks {missing}: is pyspark installed whole (scripts/setup.sh)?"
    return [paths[0] for paths in found.values()]


def test_cassandras_codec_libraries_read_our_payloads_and_we_read_theirs(tmp_path):
    jars = _codec_jars()
    (tmp_path / "CodecCheck.java").write_text(JAVA_CODECS)
    samples = [b"", b"a", _sample(3000, 1), _sample(65536, 2), random.Random(3).randbytes(100000)]
    args = []
    lz4, snappy, zstd = LZ4Compressor(), SnappyCompressor(), ZstdCompressor()
    for i, data in enumerate(samples):
        base = tmp_path / f"s{i}"
        (tmp_path / f"raw{i}").write_bytes(data)
        Path(f"{base}.lz4").write_bytes(lz4.compress(data))
        Path(f"{base}.snappy").write_bytes(snappy.compress(data))
        Path(f"{base}.zstd").write_bytes(zstd.compress(data))
        args += [str(tmp_path / f"raw{i}"), str(base)]
    classpath = ":".join(str(j) for j in jars)
    done = subprocess.run([_java(), *JVM_FAST_START, "-cp", classpath, str(tmp_path / "CodecCheck.java"), "-",
                           *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    zstd_jni_version = done.stdout.split()[-1]
    for i, data in enumerate(samples):
        base = tmp_path / f"s{i}"
        assert lz4.decompress(Path(f"{base}.java.lz4").read_bytes(), len(data)) == data
        assert snappy.decompress(Path(f"{base}.java.snappy").read_bytes(), len(data)) == data
        java_zstd = Path(f"{base}.java.zstd").read_bytes()
        assert zstd.decompress(java_zstd, len(data)) == data
        # zstd-jni's version is libzstd's plus a build suffix; with the same libzstd the frames are identical.
        if zstd_jni_version.split("-")[0] == ".".join(map(str, zstandard.ZSTD_VERSION)):
            assert zstd.compress(data) == java_zstd, f"sample {i}"
