"""A segment writer that lays out bytes exactly as Cassandra's commit log does (descriptor 6, 7 and 8).

Used by the tests, the demo and the benchmarks to produce realistic segments: plain (memory-mapped layout,
zero-filled to the segment size), compressed (LZ4, Snappy, Deflate, Zstd) and encrypted. Each ``sync()``
closes a section the way ``CommitLogSegment.sync`` does; ``cdc_index()`` gives the ``_cdc.idx`` text Cassandra
4.0+ would write at that point.
"""
from __future__ import annotations

import json
import os
import zlib

from cdc_lib import wire
from cdc_lib.errors import ConfigError, SegmentError

DEFAULT_SEGMENT_SIZE = 32 * 1024 * 1024


class SegmentFull(SegmentError):
    """The entry does not fit in what is left of the segment; start a new one."""


def segment_file_name(version: int, segment_id: int) -> str:
    return f"CommitLog-{version}-{segment_id}.log"


def encode_header(version: int, segment_id: int, params: dict) -> bytes:
    """The descriptor header with its CRC (§2.2). Parameter keys are sorted, as Cassandra's TreeMap does."""
    raw = json.dumps(params, sort_keys=True, separators=(",", ":")).encode("utf-8") if params else b"{}"
    crc = wire.crc32_ints(version, segment_id & wire.MASK32, (segment_id >> 32) & wire.MASK32, len(raw))
    crc = zlib.crc32(raw, crc)
    return (version.to_bytes(4, "big") + (segment_id & wire.MASK64).to_bytes(8, "big") + len(raw).to_bytes(2, "big")
            + raw + crc.to_bytes(4, "big"))


def encode_entry(mutation: bytes) -> bytes:
    """size, CRC(size), mutation, CRC(size + mutation) (§7)."""
    size = len(mutation).to_bytes(4, "big")
    c1 = zlib.crc32(size)
    return size + c1.to_bytes(4, "big") + mutation + zlib.crc32(mutation, c1).to_bytes(4, "big")


class SegmentWriter:
    """Write one segment file. ``add()`` returns the entry's logical end position (its CommitLogPosition)."""

    def __init__(self, directory, segment_id: int, *, version: int = 7, compression: str | None = None,
                 compression_params: dict | None = None, keys=None, key_alias: str | None = None,
                 segment_size: int = DEFAULT_SEGMENT_SIZE, preallocate: bool = True):
        if version not in (6, 7, 8):
            raise ConfigError(f"descriptor version {version} cannot be written (6, 7 or 8)")
        if compression and key_alias:
            raise ConfigError("a segment is either compressed or encrypted, not both")
        self.version = version
        self.segment_id = segment_id
        self.segment_size = segment_size
        self.name = segment_file_name(version, segment_id)
        self.path = os.path.join(os.fspath(directory), self.name)
        params: dict = {}
        self._codec = None
        self._keys = None
        if compression:
            from .compression import compressor_for
            self._codec = compressor_for(compression, compression_params)
            params = {"compressionClass": compression, "compressionParameters": compression_params or {}}
        elif key_alias:
            from .encryption import new_encryption_params
            if keys is None:
                raise ConfigError("encryption needs keys")
            self._keys = keys
            params = new_encryption_params(key_alias)
        self.params = params
        self.header = encode_header(version, segment_id, params)
        self._plain = self._codec is None and self._keys is None
        self._f = open(self.path, "wb")
        self._f.write(self.header)
        self._physical = len(self.header)       # file offset of the pending marker slot
        self._logical = len(self.header)        # logical offset of the pending marker slot
        self._pending = bytearray()             # entry bytes of the open section
        self._synced = len(self.header)         # logical offset covered by the last sync
        self._preallocate = preallocate and self._plain
        self.closed = False
        if self._plain:
            self._f.write(b"\x00" * 8)          # first marker slot stays zero until the first sync

    @property
    def position(self) -> int:
        """Logical offset where the next entry would start."""
        return self._logical + 8 + len(self._pending)

    def add(self, mutation: bytes) -> int:
        entry = encode_entry(mutation)
        # Room for this entry plus the next marker slot, as Cassandra's allocate() requires.
        if self.position + len(entry) + 8 > self.segment_size:
            raise SegmentFull(f"entry of {len(mutation)} bytes does not fit", self.name, self.position)
        self._pending += entry
        return self.position

    def sync(self, force: bool = False) -> int:
        """Close the open section and return the synced logical offset.

        Without ``force`` an empty section is not written. Cassandra 4.0+ closes a segment with a forced sync,
        which writes an empty final section when nothing was added since the last sync (seen in the real 4.0.11
        segment); 3.0 does not.
        """
        if not self._pending and not force:
            return self._synced
        data = bytes(self._pending)
        self._pending.clear()
        marker_pos = self._physical
        if self._plain:
            nxt = marker_pos + 8 + len(data)
            self._f.seek(marker_pos)
            self._f.write(nxt.to_bytes(4, "big") + self._marker_crc(marker_pos).to_bytes(4, "big"))
            self._f.write(data)
            self._f.write(b"\x00" * 8)          # the next marker slot is zero until it is synced
            self._physical = nxt
            self._logical = nxt
        else:
            if self._codec is not None:
                payload = self._codec.compress(data)
            else:
                from .encryption import encrypt_section
                payload = encrypt_section(data, self.params, self._keys)
            nxt = marker_pos + 12 + len(payload)
            self._f.seek(marker_pos)
            self._f.write(nxt.to_bytes(4, "big") + self._marker_crc(marker_pos).to_bytes(4, "big")
                          + len(data).to_bytes(4, "big") + payload)
            self._physical = nxt
            self._logical += 8 + len(data)
        self._synced = self._logical
        return self._synced

    def _marker_crc(self, pos: int) -> int:
        sid = self.segment_id
        return wire.crc32_ints(sid & wire.MASK32, (sid >> 32) & wire.MASK32, pos)

    def cdc_index(self, completed: bool | None = None) -> str:
        """The ``_cdc.idx`` content Cassandra 4.0+ writes: the synced offset, then COMPLETED once closed."""
        done = self.closed if completed is None else completed
        return f"{self._synced}\nCOMPLETED" if done else f"{self._synced}"

    def write_cdc_index(self, directory=None, completed: bool | None = None) -> str:
        d = os.fspath(directory) if directory is not None else os.path.dirname(self.path)
        p = os.path.join(d, self.name[:-4] + "_cdc.idx")
        with open(p, "w") as f:
            f.write(self.cdc_index(completed))
        return p

    def close(self) -> str:
        if self.closed:
            return self.path
        self.sync(force=self.version >= 7)
        if self._preallocate:
            self._f.seek(0, os.SEEK_END)
            size = self._f.tell()
            if size < self.segment_size:
                self._f.truncate(self.segment_size)     # zero tail, as a memory-mapped segment has
        # (without preallocation a plain file ends with the zero marker slot after its last section)
        self._f.close()
        self.closed = True
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_segment(directory, segment_id: int, mutations, **kwargs) -> str:
    """Write ``mutations`` (serialized bytes) to one segment, syncing every ``sync_every`` entries."""
    sync_every = kwargs.pop("sync_every", 64)
    with SegmentWriter(directory, segment_id, **kwargs) as w:
        for i, m in enumerate(mutations, 1):
            w.add(m)
            if i % sync_every == 0:
                w.sync()
    return w.path
