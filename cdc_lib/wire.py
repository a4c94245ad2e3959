"""Cassandra's primitive encodings: unsigned/signed vints, fixed-width integers, CRC32 of ints.

Cassandra's vint is NOT LEB128: the count of leading 1-bits of the first byte is the number of extra bytes,
and the value is big-endian. Java ints written through the unsigned-vint writer are sign-extended to 64 bits
first, so a negative int always takes 9 bytes (format reference §1).
"""
from __future__ import annotations

import struct
import zlib

from .errors import TruncatedError

MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1

# Number of extra bytes that follow a first byte, indexed by the first byte (count of its leading 1-bits).
EXTRA_BYTES = bytes(min(8, 8 - (b ^ 0xFF).bit_length()) if b != 0xFF else 8 for b in range(256))

_BE_I32 = struct.Struct(">i")
_BE_U32 = struct.Struct(">I")


def s64(v: int) -> int:
    """The signed 64-bit reading of ``v`` (Java long)."""
    v &= MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def s32(v: int) -> int:
    """The signed 32-bit reading of ``v`` (Java int)."""
    v &= MASK32
    return v - (1 << 32) if v >= 1 << 31 else v


def read_uvint(buf, pos: int) -> tuple[int, int]:
    """Decode an unsigned vint at ``pos``; returns (unsigned 64-bit value, next position)."""
    try:
        b0 = buf[pos]
    except IndexError:
        raise TruncatedError("vint past end of buffer", position=pos) from None
    if b0 < 0x80:
        return b0, pos + 1
    extra = EXTRA_BYTES[b0]
    end = pos + 1 + extra
    if end > len(buf):
        raise TruncatedError("vint past end of buffer", position=pos)
    v = b0 & (0xFF >> extra)
    for b in buf[pos + 1:end]:
        v = (v << 8) | b
    return v, end


def encode_uvint(v: int) -> bytes:
    """Encode ``v`` (taken as unsigned 64-bit; negative ints are sign-extended, as Java does) as a vint."""
    v &= MASK64
    if v < 0x80:
        return bytes((v,))
    # n = total bytes; Java's formula 9 - (nlz(v|1) - 1) / 7 with truncating division.
    nlz = 64 - (v | 1).bit_length()
    n = 9 - (nlz - 1) // 7 if nlz >= 1 else 9
    extra = n - 1
    if n == 9:
        return b"\xff" + v.to_bytes(8, "big")
    body = v.to_bytes(n, "big")
    first = body[0] | (0xFF << (8 - extra)) & 0xFF
    return bytes((first,)) + body[1:]


def read_vint(buf, pos: int) -> tuple[int, int]:
    """Decode a signed (zig-zag) vint; returns (signed 64-bit value, next position)."""
    u, pos = read_uvint(buf, pos)
    return (u >> 1) ^ -(u & 1), pos


def encode_vint(n: int) -> bytes:
    """Encode a signed 64-bit value as a zig-zag vint."""
    return encode_uvint(((n << 1) ^ (n >> 63)) & MASK64)


def crc32_ints(*ints: int, crc: int = 0) -> int:
    """CRC32 of ints fed as 4 big-endian bytes each (Cassandra's ``updateChecksumInt``)."""
    for i in ints:
        crc = zlib.crc32(_BE_U32.pack(i & MASK32), crc)
    return crc


def be_i32(buf, pos: int) -> int:
    return _BE_I32.unpack_from(buf, pos)[0]


def be_u32(buf, pos: int) -> int:
    return _BE_U32.unpack_from(buf, pos)[0]
