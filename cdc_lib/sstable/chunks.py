"""From Data.db on disk to D, the uncompressed partition stream, one checked chunk at a time.

A compressed Data.db is a run of chunks located by CompressionInfo.db (format reference §5.2): chunk i holds
``D[i*L : (i+1)*L]``, compressed by the codec CompressionInfo.db names (the commit log's codecs: the payload
framing is the same, §5.3) or stored raw when compression did not pay (``na`` and later), and followed by the
CRC32 of its stored bytes. An uncompressed Data.db *is* D; CRC.db holds a CRC32 per 64 KiB (§5.1).

``DataStream`` yields D as ``(offset, bytes)`` pieces; a chunk whose CRC fails or that does not decompress is a
``Damage`` record instead (its stored bytes kept), and the stream goes on with the next chunk. ``Window`` keeps
a sliding piece of D for the decoders, so memory stays at a few chunks plus the largest row, never the file.
"""
from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Iterator, Optional, Union

from cdc_lib.commitlog.compression import compressor_for
from cdc_lib.commitlog.segment import Damage
from cdc_lib.errors import CdcError, ConfigError, SSTableError

from .descriptor import Descriptor

READ_BLOCK = 1 << 20            # uncompressed files are read (and their CRCs checked) this much at a time
FILL = 1 << 20                  # a window refill reads ahead to this many bytes


@dataclass(frozen=True)
class CompressionInfo:
    compressor: str
    options: dict
    chunk_length: int
    max_compressed_length: int   # payloads at least this long are stored raw (2^31-1 before ``na``: never)
    data_length: int             # len(D)
    chunk_count: int
    offsets: bytes               # chunk_count big-endian i64 file offsets, unpacked on demand

    def offset(self, i: int) -> int:
        return struct.unpack_from(">q", self.offsets, 8 * i)[0]

    @property
    def data_chunks(self) -> int:
        """Chunks that hold data; a writer's final flush may add empty ones after them (§5.2)."""
        return -(-self.data_length // self.chunk_length)


def read_compression_info(desc: Descriptor) -> Optional[CompressionInfo]:
    """CompressionInfo.db of ``desc``, or None when the SSTable is not compressed."""
    path = desc.path("CompressionInfo.db")
    if not path.exists():
        return None
    source = str(path)
    data = path.read_bytes()
    try:
        pos = 0

        def take(n):
            nonlocal pos
            if pos + n > len(data):
                raise SSTableError("file ends inside its fields", source, pos)
            pos += n
            return data[pos - n:pos]

        def utf():
            return take(struct.unpack(">H", take(2))[0]).decode("utf-8")

        compressor = utf()
        n_options = struct.unpack(">i", take(4))[0]
        if not 0 <= n_options <= 1024:
            raise SSTableError(f"implausible option count {n_options}", source, pos - 4)
        options = dict((utf(), utf()) for _ in range(n_options))
        chunk_length = struct.unpack(">i", take(4))[0]
        max_compressed = struct.unpack(">i", take(4))[0] if desc.version.max_compressed_length else (1 << 31) - 1
        data_length = struct.unpack(">q", take(8))[0]
        chunk_count = struct.unpack(">i", take(4))[0]
        offsets = take(8 * chunk_count) if chunk_count >= 0 else b""
    except UnicodeDecodeError:
        raise SSTableError("compressor name or option is not UTF-8", source) from None
    if chunk_length <= 0 or chunk_length & (chunk_length - 1):
        raise SSTableError(f"chunk length {chunk_length} is not a power of two", source)
    info = CompressionInfo(compressor, options, chunk_length, max_compressed, data_length, chunk_count, offsets)
    if data_length < 0 or chunk_count < info.data_chunks:
        raise SSTableError(f"{chunk_count} chunks cannot hold {data_length} bytes of {chunk_length}", source)
    return info


def read_crc_db(desc: Descriptor) -> Optional[tuple]:
    """(chunk size, CRC32 per chunk) from CRC.db, or None when there is none."""
    path = desc.path("CRC.db")
    if not path.exists():
        return None
    data = path.read_bytes()
    if len(data) < 4 or len(data) % 4:
        raise SSTableError(f"CRC.db of {len(data)} bytes is not a chunk size plus CRCs", str(path))
    size = struct.unpack_from(">i", data, 0)[0]
    if size <= 0:
        raise SSTableError(f"chunk size {size} in CRC.db", str(path), 0)
    return size, struct.unpack(f">{len(data) // 4 - 1}I", data[4:])


class DataStream:
    """D of one SSTable as ``(offset, bytes)`` pieces in order, and a ``Damage`` for each chunk that fails its
    check. ``pieces(start)`` begins at the piece holding D offset ``start`` (for resuming after damage)."""

    def __init__(self, desc: Descriptor):
        self.desc = desc
        self.name = desc.data_name
        self.path = desc.path("Data.db")
        self.compression = read_compression_info(desc)
        self.crcs = None if self.compression is not None else read_crc_db(desc)
        try:
            self.file_size = os.path.getsize(self.path)
        except OSError as e:
            raise SSTableError(f"cannot read: {e}", str(self.path)) from None
        if self.compression is not None:
            self.length = self.compression.data_length
            try:
                self.codec = compressor_for(self.compression.compressor, self.compression.options)
            except ConfigError as e:
                raise SSTableError(f"CompressionInfo.db names a compressor this reader lacks: {e}",
                                   str(desc.path("CompressionInfo.db"))) from None
        else:
            self.length = self.file_size

    def pieces(self, start: int = 0) -> Iterator[Union[tuple, Damage]]:
        if self.length == 0:
            return
        with open(self.path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                if self.compression is not None:
                    yield from self._chunks(mm, start)
                else:
                    yield from self._blocks(mm, start)
            finally:
                mm.close()

    def _damage(self, position: int, kind: str, reason: str, data, physical: int) -> Damage:
        return Damage(self.name, position, kind, reason, bytes(data), physical)

    def _chunks(self, mm, start: int):
        ci = self.compression
        L = ci.chunk_length
        n = ci.data_chunks
        codec = self.codec
        for i in range(start // L, n):
            begin = ci.offset(i)
            end = ci.offset(i + 1) if i + 1 < ci.chunk_count else self.file_size
            logical = i * L
            expect = min(L, ci.data_length - logical)
            if not begin + 4 <= end <= self.file_size:
                if end > self.file_size:
                    reason = (f"chunk {i} ends at file offset {end}, past the end of Data.db "
                              f"({self.file_size} bytes): the file is cut short")
                else:
                    reason = f"chunk {i} at file offset {begin} is {end - begin} bytes, too short for its CRC"
                yield self._damage(logical, "crc_mismatch", reason, mm[begin:min(end, self.file_size)], begin)
                continue
            payload = mm[begin:end - 4]
            stored = struct.unpack_from(">I", mm, end - 4)[0]
            if zlib.crc32(payload) != stored:
                yield self._damage(logical, "crc_mismatch", f"chunk {i} (file offset {begin}, {end - begin} "
                                   f"bytes) fails its CRC32", mm[begin:end], begin)
                continue
            if len(payload) >= ci.max_compressed_length:       # stored raw (§5.2)
                data = payload[:expect]
                if len(data) != expect:
                    yield self._damage(logical, "compression", f"raw chunk {i} holds {len(data)} bytes, "
                                       f"{expect} expected", mm[begin:end], begin)
                    continue
            else:
                try:
                    data = codec.decompress(payload, expect)
                except CdcError as e:
                    yield self._damage(logical, "compression", f"chunk {i} (file offset {begin}): "
                                       f"{getattr(e, 'reason', e)}", mm[begin:end], begin)
                    continue
            yield logical, data

    def _blocks(self, mm, start: int):
        size = self.length
        chunk, table = self.crcs if self.crcs is not None else (READ_BLOCK, ())
        per_read = max(1, READ_BLOCK // chunk)
        first = start // chunk
        for i0 in range(first, -(-size // chunk), per_read):
            i1 = min(i0 + per_read, -(-size // chunk))
            block = mm[i0 * chunk:min(i1 * chunk, size)]
            good_end = 0
            for i in range(i0, min(i1, len(table))):
                a = (i - i0) * chunk
                piece = block[a:a + chunk]
                if zlib.crc32(piece) != table[i]:
                    if good_end < a:
                        yield i0 * chunk + good_end, block[good_end:a]
                    yield self._damage(i * chunk, "crc_mismatch", f"bytes {i * chunk}..{i * chunk + len(piece)} "
                                       f"fail their CRC32 in CRC.db", piece, i * chunk)
                    good_end = a + len(piece)
            if good_end < len(block):
                yield i0 * chunk + good_end, block[good_end:] if good_end else block

    def unchecked(self) -> Optional[Damage]:
        """The damage of a CRC.db too short for Data.db: the bytes it has no CRC for are read unchecked."""
        if self.crcs is None:
            return None
        chunk, table = self.crcs
        needed = -(-self.length // chunk)
        if len(table) >= needed:
            return None
        return self._damage(len(table) * chunk, "crc_mismatch", f"CRC.db has {len(table)} CRCs for the {needed} "
                            f"chunks of Data.db: bytes from {len(table) * chunk} on are read unchecked", b"", None)


class Window:
    """A sliding, contiguous piece of D for the decoders: ``buf`` holds ``D[base : base + len(buf)]``.

    ``extend(keep, need)`` drops the bytes before D offset ``keep`` and appends pieces until ``need`` bytes
    follow ``keep`` or no contiguous bytes are left: at the end of D (``at_end``) or at a damaged chunk, whose
    ``Damage`` then waits in ``damage`` and whose range ``gap`` gives (start, end) in D.
    """

    def __init__(self, stream: DataStream, start: int = 0):
        self.stream = stream
        self.buf = b""
        self.base = start
        self.damage: Optional[Damage] = None
        self.gap: Optional[tuple] = None
        self._pieces = stream.pieces(start)
        self._skip_to = start           # bytes before this offset are not wanted (resuming mid-chunk)
        self.exhausted = False

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    @property
    def at_end(self) -> bool:
        """No byte of D follows the window: the stream ended (not a gap)."""
        return self.exhausted and self.gap is None

    def extend(self, keep: int, need: int) -> bool:
        """Make ``buf`` hold at least ``need`` bytes from D offset ``keep`` if D has them contiguously; returns
        whether it does. Bytes before ``keep`` may be dropped. A refill reads ahead to at least ``FILL`` bytes,
        so the tail copied on each refill is small next to what is added."""
        if self.end - keep >= need:
            return True
        if keep > self.base:
            self.buf = self.buf[keep - self.base:]
            self.base = keep
        target = max(need, FILL)
        parts = [self.buf]
        have = len(self.buf)
        while have < target and not self.exhausted and self.gap is None:
            nxt = next(self._pieces, None)
            if nxt is None:
                self.exhausted = True
                break
            if isinstance(nxt, Damage):
                self.damage = nxt
                length = self.stream.compression.chunk_length if self.stream.compression is not None else \
                    len(nxt.data)
                self.gap = (nxt.position, min(nxt.position + max(length, 1), self.stream.length))
                break
            offset, data = nxt
            if offset < self._skip_to:
                data = data[self._skip_to - offset:]
                offset = self._skip_to
            if offset != self.base + have:
                raise SSTableError(f"internal: piece at {offset} does not follow {self.base + have}",
                                   self.stream.name, offset)
            parts.append(data)
            have += len(data)
        if len(parts) > 1:
            self.buf = b"".join(parts)
        return have >= need

    def restart(self, position: int) -> None:
        """Continue at D offset ``position`` (after damage): a fresh window, the pending damage cleared."""
        self.buf = b""
        self.base = position
        self.damage = None
        self.gap = None
        self.exhausted = position >= self.stream.length
        self._skip_to = position
        self._pieces = self.stream.pieces(position)
