"""Murmur3Partitioner tokens, bit for bit as Cassandra computes them.

Cassandra's MurmurHash3_x64_128 port sign-extends the *tail* bytes (the last ``len % 16``) before shifting
them into place (format reference §18.2), so for tail bytes >= 0x80 its tokens differ from the reference
hash and from most libraries. We reproduce Cassandra, not the reference.
"""
from __future__ import annotations

M64 = (1 << 64) - 1
_C1 = 0x87C37B91114253D5
_C2 = 0x4CF5AD432745937F
MIN_TOKEN = -(1 << 63)
MAX_TOKEN = (1 << 63) - 1


def _rotl(v: int, r: int) -> int:
    return ((v << r) | (v >> (64 - r))) & M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


def _tail_word(tail: bytes) -> int:
    """Little-endian word of up to 8 tail bytes, each sign-extended to 64 bits as Java's ``(long) byte`` does."""
    k = 0
    for j in range(len(tail) - 1, -1, -1):
        b = tail[j]
        v = (b - 256) if b >= 128 else b
        k ^= (v << (8 * j)) & M64
    return k


def token_reference(key: bytes) -> int:
    """The Murmur3 token of a serialized partition key (pure Python, the reference)."""
    n = len(key)
    if n == 0:
        return MIN_TOKEN
    h1 = h2 = 0
    nblocks = n >> 4
    from_bytes = int.from_bytes
    for i in range(0, nblocks * 16, 16):
        k1 = from_bytes(key[i:i + 8], "little")
        k2 = from_bytes(key[i + 8:i + 16], "little")
        k1 = (_rotl((k1 * _C1) & M64, 31) * _C2) & M64
        h1 ^= k1
        h1 = (_rotl(h1, 27) + h2) & M64
        h1 = (h1 * 5 + 0x52DCE729) & M64
        k2 = (_rotl((k2 * _C2) & M64, 33) * _C1) & M64
        h2 ^= k2
        h2 = (_rotl(h2, 31) + h1) & M64
        h2 = (h2 * 5 + 0x38495AB5) & M64
    tail = key[nblocks * 16:]
    r = len(tail)
    if r > 8:
        k2 = _tail_word(tail[8:])
        h2 ^= (_rotl((k2 * _C2) & M64, 33) * _C1) & M64
    if r > 0:
        k1 = _tail_word(tail[:8])
        h1 ^= (_rotl((k1 * _C1) & M64, 31) * _C2) & M64
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & M64
    h2 = (h2 + h1) & M64
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 = (h1 + h2) & M64
    t = h1 - (1 << 64) if h1 >= 1 << 63 else h1
    return MAX_TOKEN if t == MIN_TOKEN else t


try:  # cassandra-driver ships a C implementation of Cassandra's (sign-extending) variant; tests check agreement
    from cassandra.cmurmur3 import murmur3 as _c_murmur3
except ImportError:  # pragma: no cover - the driver is a dependency, but the library works without it
    _c_murmur3 = None


def token(key: bytes) -> int:
    """The Murmur3 token of a serialized partition key."""
    if _c_murmur3 is None or not key:
        return token_reference(key)
    return _c_murmur3(key)
