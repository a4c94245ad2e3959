"""Statistics.db: the table of contents, its checksums, the partitioner and the serialization header.

A sequential scan needs two of the four metadata components (format reference §4): VALIDATION (the partitioner,
which orders the partitions and gives each key its token) and HEADER, the SSTable-wide serialization header:
the encoding stats every delta-encoded time in Data.db is relative to, the partition-key and clustering types,
and the static and regular columns with the types they were written with. With it the SSTable decodes without
any schema. From ``na`` on every component carries a CRC32 (§4.1); a mismatch is an ``SSTableError``.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from cdc_lib.commitlog.model import EncodingStats
from cdc_lib.commitlog.mutation import Reader, read_encoding_stats
from cdc_lib.cql.types import CqlType, marshal_is_reversed, parse_type
from cdc_lib.errors import FormatError, SchemaError, SSTableError

from .descriptor import Version

VALIDATION, COMPACTION, STATS, HEADER = 0, 1, 2, 3
MURMUR3 = "org.apache.cassandra.dht.Murmur3Partitioner"


@dataclass(frozen=True)
class HeaderColumn:
    name: str
    type_string: str            # as written, e.g. org.apache.cassandra.db.marshal.MapType(...)
    type: CqlType


@dataclass(frozen=True)
class ClusteringType:
    type_string: str
    type: CqlType
    reversed: bool              # ReversedType(...): a DESC clustering column


@dataclass(frozen=True)
class SerializationHeader:
    stats: EncodingStats
    partition_key_type: str     # type string; CompositeType(...) for a multi-column key
    partition_key_types: tuple  # CqlType per partition-key column
    clustering: tuple           # ClusteringType per clustering column
    static_columns: tuple       # HeaderColumn, in Cassandra's column order
    regular_columns: tuple
    partitioner: str

    @property
    def counter(self) -> bool:
        return any(c.type.kind == "counter" for c in self.static_columns + self.regular_columns)


def column_order_key(column: HeaderColumn) -> tuple:
    """Cassandra's column order within the static or the regular columns (format reference §4.5): simple
    columns before complex ones; then ``ColumnMetadata.comparisonOrder``: the first 6 name bytes with the top
    bit of the first flipped (so names starting with a byte >= 0x80 come first), then the whole name."""
    raw = column.name.encode("utf-8")
    prefix = (raw[:6] + bytes(6))[:6]
    prefix = bytes((prefix[0] ^ 0x80,)) + prefix[1:]
    return (column.type.multicell, prefix, raw)


def _component_extents(data: bytes, version: Version, source: str) -> dict:
    """{ordinal: (start, end)} of each component's body, CRCs checked and excluded (format reference §4.1)."""
    if len(data) < 4:
        raise SSTableError("file too short for its component count", source, 0)
    count = struct.unpack_from(">i", data, 0)[0]
    pos = 4
    if count <= 0 or count > 64:
        raise SSTableError(f"implausible component count {count}", source, 0)
    if version.metadata_checksums:
        stored = struct.unpack_from(">I", data, pos)[0] if len(data) >= pos + 4 else None
        running = zlib.crc32(data[0:4])
        if stored != running:
            raise SSTableError("component count CRC mismatch", source, pos)
        pos += 4
    toc_end = pos + 8 * count
    if toc_end > len(data):
        raise SSTableError("table of contents runs past the end of the file", source, pos)
    toc = [struct.unpack_from(">ii", data, pos + 8 * i) for i in range(count)]
    if version.metadata_checksums:
        stored = struct.unpack_from(">I", data, toc_end)[0] if len(data) >= toc_end + 4 else None
        if stored != zlib.crc32(data[pos:toc_end], running):
            raise SSTableError("table of contents CRC mismatch", source, toc_end)
    offsets = sorted(off for _, off in toc) + [len(data)]
    extents = {}
    for ordinal, off in toc:
        end = offsets[offsets.index(off) + 1]
        if not toc_end <= off <= end <= len(data):
            raise SSTableError(f"component {ordinal} at {off} lies outside the file", source, off)
        if version.metadata_checksums:
            if end - off < 4:
                raise SSTableError(f"component {ordinal} is too short for its CRC", source, off)
            end -= 4
            if struct.unpack_from(">I", data, end)[0] != zlib.crc32(data[off:end]):
                raise SSTableError(f"CRC mismatch in metadata component {ordinal}", source, off)
        extents[ordinal] = (off, end)
    return extents


def _utf(r: Reader) -> str:
    return r.take(r.u16()).decode("utf-8")


def _vstring(r: Reader) -> str:
    return r.vbytes().decode("utf-8")


def _type(text: str, source: str, position: int) -> CqlType:
    try:
        return parse_type(text)
    except SchemaError as e:
        raise SSTableError(f"serialization header type {text!r}: {e}", source, position) from None


def _columns(r: Reader, source: str) -> tuple:
    n = r.uvint32()
    if not 0 <= n <= r.end - r.pos:
        raise SSTableError(f"implausible column count {n}", source, r.pos)
    cols = []
    for _ in range(n):
        at = r.pos
        name = _vstring(r)
        type_string = _vstring(r)
        cols.append(HeaderColumn(name, type_string, _type(type_string, source, at)))
    return tuple(sorted(cols, key=column_order_key))


def read_statistics(path: Path, version: Version) -> SerializationHeader:
    """The serialization header and partitioner of a Statistics.db. Raises SSTableError naming the file."""
    source = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SSTableError(f"cannot read: {e}", source) from None
    extents = _component_extents(data, version, source)
    if HEADER not in extents or VALIDATION not in extents:
        raise SSTableError(f"no {'HEADER' if HEADER not in extents else 'VALIDATION'} component", source)
    try:
        start, end = extents[VALIDATION]
        partitioner = _utf(Reader(data[:end], start))
        start, end = extents[HEADER]
        r = Reader(data[:end], start)
        stats = read_encoding_stats(r)
        pk_string = _vstring(r)
        pk_type = _type(pk_string, source, start)
        pk_types = pk_type.subtypes if pk_type.kind == "composite" else (pk_type,)
        n = r.uvint32()
        if not 0 <= n <= end - r.pos:
            raise SSTableError(f"implausible clustering column count {n}", source, r.pos)
        clustering = []
        for _ in range(n):
            at = r.pos
            s = _vstring(r)
            clustering.append(ClusteringType(s, _type(s, source, at), marshal_is_reversed(s)))
        static = _columns(r, source)
        regular = _columns(r, source)
    except SSTableError:
        raise
    except (FormatError, UnicodeDecodeError) as e:
        raise SSTableError(f"serialization header is damaged: {getattr(e, 'reason', e)}", source,
                           getattr(e, "position", None)) from None
    return SerializationHeader(stats, pk_string, tuple(pk_types), tuple(clustering), static, regular, partitioner)
