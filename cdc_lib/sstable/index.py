"""Partition start offsets from the primary index, to resume a scan after damaged bytes.

A full scan does not need the index: Data.db is read from start to end. But a partition has no length field, so
after a chunk that fails its CRC (or bytes that do not decode) the only way to find where the next partition
starts is the index: ``Index.db`` of the BIG format lists every partition's key and offset in D, in Data.db order
(format reference §7.1). BTI SSTables index partitions in a trie (``Partitions.db``, §7.4), which is not read
here: a scan of a damaged BTI SSTable reports everything after the damage instead of resuming.
"""
from __future__ import annotations

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


class PartitionIndex:
    """``next_start(offset)``: the first partition start at or after ``offset`` (queries must not go back)."""

    def __init__(self, desc: Descriptor):
        self._positions = _index_positions(desc)
        self._last = -1

    def next_start(self, offset: int) -> Optional[int]:
        if self._last >= offset:
            return self._last
        for position in self._positions:
            if position < self._last:
                return None                          # out of order: the index is damaged, do not trust it
            self._last = position
            if position >= offset:
                return position
        return None
