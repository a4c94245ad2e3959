"""Partition start offsets from the primary index, to resume a scan after damaged bytes.

A full scan does not need the index: Data.db is read from start to end. But a partition has no length field, so
after a chunk that fails its CRC (or bytes that do not decode) the only way to find where the next partition
starts is the index. ``Index.db`` of the BIG format lists every partition's key and offset in D, in Data.db order
(format reference §7.1). BTI SSTables index partitions in a trie (``Partitions.db``, §7.4, and Cassandra's
``BtiFormat.md``): its leaves, walked in transition order, give the partitions in Data.db order, each as an
offset in D or as the position of a ``Rows.db`` entry that starts with the partition's key and D offset (§7.5).
Both are read lazily and only after damage; an index that cannot be read stops the resumption, not the scan.
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import Iterator, Optional

from cdc_lib import wire
from cdc_lib.errors import FormatError

from .descriptor import Descriptor

READ_BLOCK = 1 << 20


def _index_positions(desc: Descriptor) -> Iterator[int]:
    """D offsets of the partitions listed in Index.db, in order; stops at the first entry it cannot read."""
    path = desc.path("Index.db")
    if desc.version.format != "big" or not path.exists():
        return
    with open(path, "rb") as f:
        buf = b""
        eof = False
        p = 0
        while True:
            if not eof and len(buf) - p < READ_BLOCK:
                more = f.read(READ_BLOCK)
                eof = not more
                buf = buf[p:] + more
                p = 0
            if p >= len(buf):
                return
            try:
                klen = (buf[p] << 8) | buf[p + 1]
                q = p + 2 + klen
                position, q = wire.read_uvint(buf, q)
                promoted, q = wire.read_uvint(buf, q)
            except (IndexError, FormatError):
                if eof:
                    return
                buf = buf[p:] + f.read(READ_BLOCK)     # an entry longer than what is buffered
                p = 0
                continue
            if q + promoted > len(buf):
                if eof:
                    return
                need = q + promoted - len(buf)
                buf = buf[p:] + f.read(max(need, READ_BLOCK))
                p = 0
                continue
            yield position
            p = q + promoted


# Partitions.db node types (the high nibble of a node's first byte): pointer width in bits, or a special layout.
_PAYLOAD_ONLY, _SINGLE_NOPAYLOAD_4, _SINGLE_8, _SINGLE_NOPAYLOAD_12, _SINGLE_16 = range(5)
_SPARSE_BITS = {5: 8, 6: 12, 7: 16, 8: 24, 9: 40}
_DENSE_BITS = {10: 12, 11: 16, 12: 24, 13: 32, 14: 40, 15: 64}


def _bits(buf, pos: int, index: int, width: int) -> int:
    """The ``index``-th ``width``-bit big-endian value packed from byte ``pos`` on."""
    start = index * width
    first, last = pos + start // 8, pos + (start + width + 7) // 8
    v = int.from_bytes(buf[first:last], "big")
    return (v >> ((last - pos) * 8 - start - width)) & ((1 << width) - 1)


def _trie_node(buf, npos: int) -> tuple:
    """(payload position or None, [child positions in transition order]) of the trie node at ``npos``."""
    h = buf[npos]
    kind, pb = h >> 4, h & 0x0F
    if kind == _PAYLOAD_ONLY:
        return (npos + 1 if pb else None), []
    if kind == _SINGLE_NOPAYLOAD_4:
        return None, [npos - pb]
    if kind == _SINGLE_NOPAYLOAD_12:
        return None, [npos - ((pb << 8) | buf[npos + 1])]
    if kind == _SINGLE_8:
        return (npos + 3 if pb else None), [npos - buf[npos + 2]]
    if kind == _SINGLE_16:
        return (npos + 4 if pb else None), [npos - ((buf[npos + 2] << 8) | buf[npos + 3])]
    if kind in _SPARSE_BITS:
        width = _SPARSE_BITS[kind]
        count = buf[npos + 1]
        ptrs = npos + 2 + count
        children = [npos - _bits(buf, ptrs, i, width) for i in range(count)]
        return (ptrs + (count * width + 7) // 8 if pb else None), children
    width = _DENSE_BITS[kind]
    length = buf[npos + 2] + 1
    ptrs = npos + 3
    children = [npos - d for d in (_bits(buf, ptrs, i, width) for i in range(length)) if d]
    return (ptrs + (length * width + 7) // 8 if pb else None), children


def _partitions_positions(desc: Descriptor) -> Iterator[int]:
    """D offsets of the partitions listed in a BTI Partitions.db, in order (depth-first over the trie)."""
    path = desc.path("Partitions.db")
    if not path.exists() or path.stat().st_size < 24:
        return
    with open(path, "rb") as f, open(desc.path("Rows.db"), "rb") as rows_file:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        rows = mmap.mmap(rows_file.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(rows_file.fileno()).st_size \
            else b""
        root = struct.unpack_from(">q", buf, len(buf) - 8)[0]
        stack = [root]
        while stack:
            npos = stack.pop()
            payload, children = _trie_node(buf, npos)
            if payload is not None:
                pb = buf[npos] & 0x0F
                size = pb - 7 if pb >= 8 else pb
                at = payload + (1 if pb >= 8 else 0)        # Cassandra 5 writes a hash byte first
                x = int.from_bytes(buf[at:at + size], "big", signed=True)
                if x < 0:
                    yield ~x
                else:                                       # a Rows.db entry: key, then the D offset
                    klen = struct.unpack_from(">H", rows, x)[0]
                    yield wire.read_uvint(rows, x + 2 + klen)[0]
            stack.extend(reversed(children))


class PartitionIndex:
    """``next_start(offset)``: the first partition start at or after ``offset`` (queries must not go back)."""

    def __init__(self, desc: Descriptor):
        self._positions = _index_positions(desc) if desc.version.format == "big" else _partitions_positions(desc)
        self._last = -1

    def next_start(self, offset: int) -> Optional[int]:
        if self._last >= offset:
            return self._last
        try:
            for position in self._positions:
                if position < self._last:
                    return None                      # out of order: the index is damaged, do not trust it
                self._last = position
                if position >= offset:
                    return position
        except (IndexError, KeyError, ValueError, OSError, struct.error, FormatError):
            return None                              # a damaged index: resume no further
        return None
