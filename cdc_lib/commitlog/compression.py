"""Section codecs of compressed commit-log segments (format reference §5.3).

Each compressed section payload is exactly what one Cassandra ``ICompressor.compress`` call writes for the
section's entry bytes, and the section header carries the uncompressed length U. A ``Compressor`` here turns
those bytes back into exactly U bytes, and writes payloads in the same framing:

* ``LZ4Compressor``: u32 *little-endian* uncompressed length, then one raw LZ4 block (lz4-java fast or high).
* ``SnappyCompressor``: one raw Snappy block (no framing format).
* ``DeflateCompressor``: a zlib stream from ``java.util.zip.Deflater`` defaults; empty input gives *no* bytes,
  because Cassandra returns early when the Deflater has no input.
* ``ZstdCompressor`` (4.0+): one Zstandard frame with content size and content checksum (zstd-jni
  ``Zstd.compress(dst, src, level, checksum=true)``).
* ``NoopCompressor`` (4.0+): the bytes unchanged.

Deflate and Zstd output is byte-identical to java.util.zip.Deflater and zstd-jni (same zlib/libzstd versions).
LZ4 and Snappy output is valid for Cassandra's decompressors but, as between Java library versions, not always
the same bytes: lz4-java's pure-Java fast compressor reproduces every section of the real 2.2 segments, python-lz4
(liblz4 1.9.4) only the small ones.

Decoding never trusts the payload: any library failure, length disagreement or trailing garbage becomes a
``CompressionError`` whose position is relative to the start of the payload (the segment reader relocates it).

``decompress_prefix`` serves the torn last section of a segment (a file cut inside its last section): it returns
the leading bytes of the section that the cut payload still determines. Every codec here decodes in order, each
step using only bytes already decoded, so a cut stream decodes to an exact prefix of the section: LZ4 and Snappy
sequence by sequence (pure-Python decoders below; the libraries only take whole blocks), Deflate and Zstd through
their streaming decompressors (Zstd up to the last whole block). Nothing in that prefix is trusted on its own:
the segment reader keeps only the entries whose two CRCs check.
"""
from __future__ import annotations

import zlib
from typing import Mapping, Protocol

import cramjam
import lz4.block
import zstandard

from cdc_lib.errors import CompressionError, ConfigError

CASSANDRA_COMPRESS_PACKAGE = "org.apache.cassandra.io.compress."

# A section is at most a segment (< 2 GiB, Java int offsets); refusing larger claims keeps a damaged length
# field from turning into a huge allocation.
MAX_SECTION_LENGTH = (1 << 31) - 1


class Compressor(Protocol):
    """What the segment reader and writer need from a section codec."""

    name: str
    parameters: dict[str, str]

    def compress(self, data: bytes) -> bytes:
        """A section payload for ``data`` in Cassandra's framing, which Cassandra's decompressor reads."""
        ...

    def decompress(self, payload: bytes, uncompressed_length: int) -> bytes:
        """Exactly ``uncompressed_length`` bytes, or ``CompressionError``."""
        ...

    def decompress_prefix(self, payload: bytes, uncompressed_length: int) -> bytes:
        """The leading bytes (at most ``uncompressed_length``) that a payload cut short still decodes to; empty
        when nothing can be decoded. Never raises for a cut or damaged payload."""
        ...


def _check_length(uncompressed_length: int, codec: str) -> None:
    if not 0 <= uncompressed_length <= MAX_SECTION_LENGTH:
        raise CompressionError(f"{codec}: impossible uncompressed length {uncompressed_length}", position=0)


def _exact(out: bytes, uncompressed_length: int, codec: str) -> bytes:
    if len(out) != uncompressed_length:
        raise CompressionError(
            f"{codec}: payload decompressed to {len(out)} bytes, section header says {uncompressed_length}",
            position=0)
    return out


def _int_parameter(parameters: Mapping[str, object], key: str, default: int, low: int, high: int,
                   codec: str) -> int:
    raw = parameters.get(key)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"{codec}: parameter {key}={raw!r} is not an integer") from None
    if not low <= value <= high:
        raise ConfigError(f"{codec}: parameter {key}={value} is outside {low}..{high}")
    return value


class LZ4Compressor:
    """Cassandra's LZ4Compressor: LE u32 length + raw LZ4 block."""

    name = "LZ4Compressor"
    FAST = "fast"
    HIGH = "high"
    # liblz4 clamps HC levels above its maximum (12); lz4-java accepts 1..17 and passes them through, and
    # Cassandra validates 1..17. Clamping here keeps the same output for 13..17.
    _LIBLZ4_HC_MAX = 12

    def __init__(self, compressor_type: str = FAST, high_level: int = 9):
        if compressor_type not in (self.FAST, self.HIGH):
            raise ConfigError(f"LZ4Compressor: lz4_compressor_type {compressor_type!r} is not 'fast' or 'high'")
        if not 1 <= high_level <= 17:
            raise ConfigError(f"LZ4Compressor: lz4_high_compressor_level {high_level} is outside 1..17")
        self.compressor_type = compressor_type
        self.high_level = high_level
        self.parameters = {} if compressor_type == self.FAST else {
            "lz4_compressor_type": compressor_type, "lz4_high_compressor_level": str(high_level)}

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, object]) -> "LZ4Compressor":
        kind = parameters.get("lz4_compressor_type")
        level = _int_parameter(parameters, "lz4_high_compressor_level", 9, 1, 17, cls.name)
        return cls(cls.FAST if kind is None else str(kind), level)

    def compress(self, data: bytes) -> bytes:
        if self.compressor_type == self.HIGH:
            return lz4.block.compress(bytes(data), mode="high_compression",
                                      compression=min(self.high_level, self._LIBLZ4_HC_MAX), store_size=True)
        return lz4.block.compress(bytes(data), mode="default", store_size=True)

    def decompress(self, payload: bytes, uncompressed_length: int) -> bytes:
        _check_length(uncompressed_length, self.name)
        if len(payload) < 5:  # 4-byte length + at least the one-byte token of an empty block
            raise CompressionError(f"{self.name}: payload of {len(payload)} bytes is too short", position=0)
        stated = int.from_bytes(payload[:4], "little")
        if stated != uncompressed_length:
            raise CompressionError(
                f"{self.name}: payload states {stated} uncompressed bytes, section header says "
                f"{uncompressed_length}", position=0)
        try:
            out = lz4.block.decompress(bytes(payload[4:]), uncompressed_size=uncompressed_length)
        except Exception as exc:  # lz4.block.LZ4BlockError and friends: damaged block
            raise CompressionError(f"{self.name}: damaged LZ4 block ({exc})", position=0) from None
        # python-lz4 accepts a block that decodes to fewer bytes than the capacity it was given.
        return _exact(out, uncompressed_length, self.name)

    def decompress_prefix(self, payload: bytes, uncompressed_length: int) -> bytes:
        return lz4_block_prefix(bytes(payload[4:]), uncompressed_length) if len(payload) > 4 else b""


def _copy_match(out: bytearray, offset: int, length: int) -> bool:
    """Append ``length`` bytes starting ``offset`` back (overlapping copies repeat); False if impossible."""
    if offset <= 0 or offset > len(out):
        return False
    start = len(out) - offset
    if offset >= length:
        out += out[start:start + length]
    else:
        for k in range(length):
            out.append(out[start + k])
    return True


def lz4_block_prefix(block: bytes, limit: int) -> bytes:
    """What a raw LZ4 block cut short decodes to (at most ``limit`` bytes).

    A block is a run of sequences: token, literal length, literals, 2-byte offset, match length. Each whole
    sequence, and the literals of a cut one, are exact output; decoding stops at the cut or at a match that points
    before the start (damage).
    """
    out = bytearray()
    i, n = 0, len(block)

    def extended(length: int) -> int | None:
        nonlocal i
        if length != 15:
            return length
        while i < n:
            b = block[i]
            i += 1
            length += b
            if b != 255:
                return length
        return None                                   # cut inside the length bytes

    while i < n and len(out) < limit:
        token = block[i]
        i += 1
        literals = extended(token >> 4)
        if literals is None:
            break
        out += block[i:i + literals]
        i += literals
        if i + 2 > n:
            break                                     # the end of the block, or cut before the offset
        offset = block[i] | block[i + 1] << 8
        i += 2
        match = extended(token & 15)
        if match is None or not _copy_match(out, offset, match + 4):
            break
    return bytes(out[:limit])


def snappy_raw_prefix(payload: bytes, limit: int) -> bytes:
    """What a raw Snappy block cut short decodes to (at most ``limit`` bytes): after the length preamble, each
    element is a literal run or a copy of earlier output; whole elements and the bytes of a cut literal are
    exact."""
    i = 0
    while i < min(len(payload), 5) and payload[i] & 0x80:
        i += 1
    i += 1                                            # past the preamble's last byte
    out = bytearray()
    n = len(payload)
    while i < n and len(out) < limit:
        tag = payload[i]
        i += 1
        kind = tag & 3
        if kind == 0:                                 # literal
            length = tag >> 2
            if length >= 60:
                extra = length - 59
                if i + extra > n:
                    break
                length = int.from_bytes(payload[i:i + extra], "little")
                i += extra
            length += 1
            out += payload[i:i + length]
            i += length
            continue
        extra = (0, 1, 2, 4)[kind]
        if i + extra > n:
            break
        if kind == 1:
            length, offset = ((tag >> 2) & 7) + 4, (tag >> 5) << 8 | payload[i]
        else:
            length, offset = (tag >> 2) + 1, int.from_bytes(payload[i:i + extra], "little")
        i += extra
        if not _copy_match(out, offset, length):
            break
    return bytes(out[:limit])


def _read_leb128(payload: bytes) -> int | None:
    value = shift = 0
    for i in range(min(len(payload), 5)):
        b = payload[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
        shift += 7
    return None


class SnappyCompressor:
    """Cassandra's SnappyCompressor: one raw Snappy block (varint length preamble + elements)."""

    name = "SnappyCompressor"

    def __init__(self):
        self.parameters: dict[str, str] = {}

    def compress(self, data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))

    def decompress(self, payload: bytes, uncompressed_length: int) -> bytes:
        _check_length(uncompressed_length, self.name)
        stated = _read_leb128(payload)
        if stated is None:
            raise CompressionError(f"{self.name}: payload has no valid length preamble", position=0)
        if stated != uncompressed_length:
            raise CompressionError(
                f"{self.name}: payload states {stated} uncompressed bytes, section header says "
                f"{uncompressed_length}", position=0)
        try:
            out = bytes(cramjam.snappy.decompress_raw(bytes(payload)))
        except Exception as exc:  # cramjam.DecompressionError: damaged block
            raise CompressionError(f"{self.name}: damaged Snappy block ({exc})", position=0) from None
        return _exact(out, uncompressed_length, self.name)

    def decompress_prefix(self, payload: bytes, uncompressed_length: int) -> bytes:
        return snappy_raw_prefix(bytes(payload), uncompressed_length)


class DeflateCompressor:
    """Cassandra's DeflateCompressor: a zlib stream (java.util.zip.Deflater, default level = zlib level 6)."""

    name = "DeflateCompressor"
    JAVA_DEFAULT_LEVEL = -1  # Deflater.DEFAULT_COMPRESSION, which zlib maps to level 6

    def __init__(self, level: int = JAVA_DEFAULT_LEVEL):
        if level != self.JAVA_DEFAULT_LEVEL and not 0 <= level <= 9:
            raise ConfigError(f"DeflateCompressor: compression_level {level} must be -1 or 0..9")
        self.level = level
        self.parameters = {} if level == self.JAVA_DEFAULT_LEVEL else {"compression_level": str(level)}

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, object]) -> "DeflateCompressor":
        # Only recent Cassandra (trunk) reads compression_level for Deflate; older ones ignore all options.
        return cls(_int_parameter(parameters, "compression_level", cls.JAVA_DEFAULT_LEVEL, -1, 9, cls.name))

    def compress(self, data: bytes) -> bytes:
        if not data:
            # Cassandra's compressArray returns 0 bytes when the Deflater "needs input" after finish().
            return b""
        return zlib.compress(bytes(data), 6 if self.level == self.JAVA_DEFAULT_LEVEL else self.level)

    def decompress(self, payload: bytes, uncompressed_length: int) -> bytes:
        _check_length(uncompressed_length, self.name)
        if not payload:
            # What Cassandra writes for an empty section (see compress); it inflates to nothing.
            return _exact(b"", uncompressed_length, self.name)
        inflater = zlib.decompressobj()
        try:
            # One byte more than expected, so that a stream that is too long is noticed rather than cut.
            out = inflater.decompress(bytes(payload), uncompressed_length + 1)
        except zlib.error as exc:
            raise CompressionError(f"{self.name}: damaged zlib stream ({exc})", position=0) from None
        out = _exact(out, uncompressed_length, self.name)
        if not inflater.eof:
            raise CompressionError(f"{self.name}: zlib stream is incomplete (no end/Adler-32 seen)", position=0)
        if inflater.unused_data:
            raise CompressionError(
                f"{self.name}: {len(inflater.unused_data)} bytes after the end of the zlib stream", position=0)
        return out

    def decompress_prefix(self, payload: bytes, uncompressed_length: int) -> bytes:
        inflater = zlib.decompressobj()
        try:
            return inflater.decompress(bytes(payload), max(uncompressed_length, 1))[:uncompressed_length]
        except zlib.error:
            return b""                                # damaged before the cut: nothing is provably intact


class ZstdCompressor:
    """Cassandra's ZstdCompressor: one Zstandard frame with content size and content checksum."""

    name = "ZstdCompressor"
    DEFAULT_LEVEL = 3
    MIN_LEVEL = -(1 << 17)  # zstd-jni Zstd.minCompressionLevel()
    MAX_LEVEL = 22

    def __init__(self, level: int = DEFAULT_LEVEL):
        if not self.MIN_LEVEL <= level <= self.MAX_LEVEL:
            raise ConfigError(f"ZstdCompressor: compression_level {level} is outside "
                              f"{self.MIN_LEVEL}..{self.MAX_LEVEL}")
        self.level = level
        self.parameters = {} if level == self.DEFAULT_LEVEL else {"compression_level": str(level)}
        # zstd-jni's Zstd.compress uses ZSTD_compress2, which writes the content size into the frame header;
        # python-zstandard with the same settings writes the same frame (checked against zstd-jni 1.5.7).
        self._cctx = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, object]) -> "ZstdCompressor":
        return cls(_int_parameter(parameters, "compression_level", cls.DEFAULT_LEVEL, cls.MIN_LEVEL,
                                  cls.MAX_LEVEL, cls.name))

    def compress(self, data: bytes) -> bytes:
        return self._cctx.compress(bytes(data))

    def decompress(self, payload: bytes, uncompressed_length: int) -> bytes:
        _check_length(uncompressed_length, self.name)
        payload = bytes(payload)
        try:
            frame = zstandard.get_frame_parameters(payload)
        except zstandard.ZstdError as exc:
            raise CompressionError(f"{self.name}: no valid Zstandard frame header ({exc})", position=0) from None
        if frame.content_size not in (zstandard.CONTENTSIZE_UNKNOWN, uncompressed_length):
            raise CompressionError(
                f"{self.name}: frame states {frame.content_size} uncompressed bytes, section header says "
                f"{uncompressed_length}", position=0)
        dctx = zstandard.ZstdDecompressor()
        try:
            if frame.content_size == uncompressed_length or uncompressed_length > 0:
                # With a content size the output buffer is exactly that size; without one (not what zstd-jni
                # writes) max_output_size bounds it. allow_extra_data=False rejects bytes after the frame;
                # the content checksum is verified by libzstd.
                out = dctx.decompress(payload, max_output_size=uncompressed_length, allow_extra_data=False)
            else:
                # No content size and U == 0 (max_output_size=0 would mean "unbounded"): the frame must end
                # without producing a byte.
                dobj = dctx.decompressobj()
                out = dobj.decompress(payload)
                if not dobj.eof or dobj.unused_data:
                    raise CompressionError(f"{self.name}: frame is incomplete or followed by extra bytes",
                                           position=0)
        except zstandard.ZstdError as exc:
            raise CompressionError(f"{self.name}: damaged Zstandard frame ({exc})", position=0) from None
        return _exact(out, uncompressed_length, self.name)

    def decompress_prefix(self, payload: bytes, uncompressed_length: int) -> bytes:
        try:
            return zstandard.ZstdDecompressor().decompressobj().decompress(bytes(payload))[:uncompressed_length]
        except zstandard.ZstdError:
            return b""                                # damaged before the cut: nothing is provably intact


class NoopCompressor:
    """Cassandra's NoopCompressor (4.0+): the payload is the entry bytes themselves."""

    name = "NoopCompressor"

    def __init__(self):
        self.parameters: dict[str, str] = {}

    def compress(self, data: bytes) -> bytes:
        return bytes(data)

    def decompress(self, payload: bytes, uncompressed_length: int) -> bytes:
        _check_length(uncompressed_length, self.name)
        return _exact(bytes(payload), uncompressed_length, self.name)

    def decompress_prefix(self, payload: bytes, uncompressed_length: int) -> bytes:
        return bytes(payload[:uncompressed_length])


KNOWN_COMPRESSORS = ("LZ4Compressor", "SnappyCompressor", "DeflateCompressor", "ZstdCompressor", "NoopCompressor")


def compressor_for(compression_class: str, parameters: Mapping[str, object] | None = None) -> Compressor:
    """The codec for a segment header's ``compressionClass`` and ``compressionParameters``.

    ``parameters`` may be None: Cassandra 2.2 writes ``"compressionParameters":null``. Options a codec does not
    use are ignored, as Cassandra's compressors ignore them.
    """
    name = compression_class.strip() if isinstance(compression_class, str) else compression_class
    if isinstance(name, str) and name.startswith(CASSANDRA_COMPRESS_PACKAGE):
        name = name[len(CASSANDRA_COMPRESS_PACKAGE):]
    params: Mapping[str, object] = parameters or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"compressionParameters must be a JSON object, not {type(params).__name__}")
    if name == "LZ4Compressor":
        return LZ4Compressor.from_parameters(params)
    if name == "SnappyCompressor":
        return SnappyCompressor()
    if name == "DeflateCompressor":
        return DeflateCompressor.from_parameters(params)
    if name == "ZstdCompressor":
        return ZstdCompressor.from_parameters(params)
    if name == "NoopCompressor":
        return NoopCompressor()
    raise ConfigError(f"unknown commit-log compression class {compression_class!r}; known: "
                      f"{', '.join(KNOWN_COMPRESSORS)} (optionally prefixed by {CASSANDRA_COMPRESS_PACKAGE})")
