"""A test-only SSTable writer: partition updates -> the files Cassandra writes, in any version from ``ma`` to ``da``.

It exists so that tests can make SSTables with every deletion kind, every codec, every version and damage at
chosen bytes, which the real corpus does not have. The SSTable framing here (file names, Statistics.db with and
without CRCs, the serialization header, partition headers in both deletion forms, the always-present static
row, row and marker sizes, compression chunks with their CRCs, CompressionInfo.db, CRC.db, Index.db) is written
from the format reference (cassandra-sstable-format.md §1-§7), independently of ``cdc_lib.sstable``. Row and
marker bodies come from the commit-log encoder (``encode_unfiltered``), whose layout SSTables share and whose
decoder is checked against real files.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from cdc_lib import wire
from cdc_lib.commitlog.compression import compressor_for
from cdc_lib.commitlog.model import (DELETION_TIME_EPOCH, NO_TIMESTAMP, TIMESTAMP_EPOCH, EncodingStats, Row)
from cdc_lib.commitlog.mutation import compute_stats, encode_unfiltered

MURMUR3 = "org.apache.cassandra.dht.Murmur3Partitioner"


@dataclass
class Written:
    directory: Path
    data: Path                     # the Data.db path
    partition_offsets: list        # D offset of each partition, in order
    length: int                    # len(D)


def table_dir(root: Path, table) -> Path:
    return Path(root) / table.keyspace / f"{table.name}-{table.id.hex}"


def _column_order(table, name: str):
    return (1 if table.column_for_data(name).type.multicell else 0, name.encode("utf-8"))


def _uvint(v: int) -> bytes:
    return wire.encode_uvint(v)


def _vbytes(b: bytes) -> bytes:
    return _uvint(len(b)) + b


def _utf(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack(">H", len(b)) + b


def _min_stats(updates) -> EncodingStats:
    stats = [compute_stats(u) for u in updates]
    return EncodingStats(min(s.min_timestamp for s in stats), min(s.min_local_deletion_time for s in stats),
                         min(s.min_ttl for s in stats))


def _header(table, stats: EncodingStats, static: list, regular: list, type_strings: dict) -> bytes:
    out = bytearray()
    out += _uvint((stats.min_timestamp - TIMESTAMP_EPOCH) & wire.MASK64)
    out += _uvint(wire.s32(stats.min_local_deletion_time - DELETION_TIME_EPOCH))
    out += _uvint(wire.s32(stats.min_ttl))
    if len(table.partition_key) == 1:
        pk = table.partition_key[0].type.marshal
    else:
        pk = ("org.apache.cassandra.db.marshal.CompositeType("
              + ",".join(c.type.marshal for c in table.partition_key) + ")")
    out += _vbytes(pk.encode())
    out += _uvint(len(table.clustering))
    for c in table.clustering:
        m = c.type.marshal
        out += _vbytes((f"org.apache.cassandra.db.marshal.ReversedType({m})" if c.reversed else m).encode())
    for names in (static, regular):
        out += _uvint(len(names))
        for n in names:
            ts = type_strings.get(n) or table.column_for_data(n).type.marshal
            out += _vbytes(n.encode()) + _vbytes(ts.encode())
    return bytes(out)


def _statistics(version: str, fmt: str, header: bytes) -> bytes:
    checksums = fmt == "bti" or version >= "na"
    bodies = [_utf(MURMUR3) + struct.pack(">d", 0.01), struct.pack(">i", 0), b"\x00" * 16, header]
    if checksums:
        bodies = [b + struct.pack(">I", zlib.crc32(b)) for b in bodies]
    count = struct.pack(">i", len(bodies))
    toc_len = 4 + (4 if checksums else 0) + 8 * len(bodies) + (4 if checksums else 0)
    toc = bytearray()
    off = toc_len
    for i, b in enumerate(bodies):
        toc += struct.pack(">ii", i, off)
        off += len(b)
    head = count
    if checksums:
        c1 = zlib.crc32(count)
        head += struct.pack(">I", c1) + bytes(toc) + struct.pack(">I", zlib.crc32(bytes(toc), c1))
    else:
        head += bytes(toc)
    return head + b"".join(bodies)


def _deletion(version: str, fmt: str, d) -> bytes:
    uint = fmt == "bti" or version >= "oa"
    if d is None or d.marked_for_delete_at == NO_TIMESTAMP:
        return b"\x80" if uint else struct.pack(">iq", (1 << 31) - 1, NO_TIMESTAMP)
    if uint:
        return struct.pack(">qI", d.marked_for_delete_at, d.local_deletion_time & wire.MASK32)
    return struct.pack(">iq", wire.s32(d.local_deletion_time), d.marked_for_delete_at)


def data_bytes(table, updates, version: str = "nb", fmt: str = "big", mv: Optional[int] = None,
               type_strings: Optional[dict] = None) -> tuple:
    """(D, partition offsets, header bytes) for ``updates`` written in order as SSTable partitions;
    ``type_strings`` overrides the header's type string of some columns."""
    mv = mv if mv is not None else (13 if fmt == "bti" or version >= "oa" else 12)
    static = sorted({n for u in updates for n in u.static_columns}, key=lambda n: _column_order(table, n))
    regular = sorted({n for u in updates for n in u.regular_columns}, key=lambda n: _column_order(table, n))
    stats = _min_stats(updates)
    ctypes = [c.type for c in table.clustering]
    out = bytearray()
    offsets = []
    for u in updates:
        start = len(out)
        offsets.append(start)
        out += struct.pack(">H", len(u.partition_key)) + u.partition_key
        out += _deletion(version, fmt, u.partition_deletion)
        if static:
            row = u.static_row if u.static_row is not None else Row((), is_static=True, columns=())
            head, body = encode_unfiltered(row, table, tuple(static), ctypes, stats, mv)
            sized = _uvint(0) + body
            out += head + _uvint(len(sized)) + sized
        prev = start
        for x in u.unfiltereds:
            at = len(out)
            head, body = encode_unfiltered(x, table, tuple(regular), ctypes, stats, mv)
            sized = _uvint(at - prev) + body
            out += head + _uvint(len(sized)) + sized
            prev = at
        out.append(0x01)
    return bytes(out), offsets, _header(table, stats, static, regular, type_strings or {})


def write_sstable(root: Path, table, updates, *, version: str = "nb", fmt: str = "big", generation: str = "1",
                  compressor: Optional[str] = None, options: Optional[dict] = None, chunk_length: int = 4096,
                  max_compressed_length: Optional[int] = None, trailing_empty_chunk: bool = False,
                  index: bool = True, mutate_data=None, type_strings: Optional[dict] = None) -> Written:
    """Write ``updates`` (in the order given) as one SSTable of ``table`` under ``root``. ``mutate_data(D)``
    may change the uncompressed stream before it is framed (to make undecodable bytes with good CRCs)."""
    d = table_dir(root, table)
    d.mkdir(parents=True, exist_ok=True)
    prefix = f"{version}-{generation}-{fmt}-"
    data, offsets, header = data_bytes(table, updates, version, fmt, type_strings=type_strings)
    if mutate_data is not None:
        data = mutate_data(data)
    (d / (prefix + "Statistics.db")).write_bytes(_statistics(version, fmt, header))
    if compressor is None:
        (d / (prefix + "Data.db")).write_bytes(data)
        crcs = [zlib.crc32(data[i:i + 65536]) for i in range(0, len(data), 65536)]
        (d / (prefix + "CRC.db")).write_bytes(struct.pack(f">i{len(crcs)}I", 65536, *crcs))
    else:
        codec = compressor_for(compressor, options or {})
        has_max = fmt == "bti" or version >= "na"
        max_len = max_compressed_length if max_compressed_length is not None else (1 << 31) - 1
        chunks = [data[i:i + chunk_length] for i in range(0, len(data), chunk_length)]
        if trailing_empty_chunk:
            chunks.append(b"")
        body = bytearray()
        chunk_offsets = []
        for c in chunks:
            chunk_offsets.append(len(body))
            payload = codec.compress(c)
            if has_max and len(payload) >= max_len:         # stored raw (§5.2)
                payload = c
            body += payload + struct.pack(">I", zlib.crc32(payload))
        (d / (prefix + "Data.db")).write_bytes(bytes(body))
        info = _utf(compressor) + struct.pack(">i", len(options or {}))
        for k, v in (options or {}).items():
            info += _utf(k) + _utf(str(v))
        info += struct.pack(">i", chunk_length)
        if has_max:
            info += struct.pack(">i", max_len)
        info += struct.pack(">qi", len(data), len(chunk_offsets)) + b"".join(struct.pack(">q", o)
                                                                            for o in chunk_offsets)
        (d / (prefix + "CompressionInfo.db")).write_bytes(info)
    if index and fmt == "big":
        idx = bytearray()
        for u, off in zip(updates, offsets):
            idx += struct.pack(">H", len(u.partition_key)) + u.partition_key + _uvint(off) + _uvint(0)
        (d / (prefix + "Index.db")).write_bytes(bytes(idx))
    elif index:
        (d / (prefix + "Partitions.db")).write_bytes(partitions_db(offsets))
        (d / (prefix + "Rows.db")).write_bytes(b"")
    return Written(d, d / (prefix + "Data.db"), offsets, len(data))


def partitions_db(offsets) -> bytes:
    """A BTI partition index (Cassandra's BtiFormat.md "Trie nodes" and "Partition index"): one PAYLOAD_ONLY leaf
    per partition (a hash byte, then ~offset in 4 bytes), all children of a SPARSE_16 root in Data.db order.
    Transition bytes are the partition's number: the reader walks the trie in order and does not look at them."""
    out = bytearray()
    leaves = []
    for off in offsets:
        leaves.append(len(out))
        out += bytes((0x0B, 0)) + struct.pack(">i", ~off)           # pb = 11: hash byte + 4 bytes
    root = len(out)
    out += bytes((0x70, len(offsets))) + bytes(range(len(offsets)))
    out += b"".join(struct.pack(">H", root - leaf) for leaf in leaves)
    first = len(out)
    out += b"\x00\x00\x00\x00"                                      # first and last key (not read)
    return bytes(out) + struct.pack(">qqq", first, len(offsets), root)
