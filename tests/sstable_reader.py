"""A minimal, test-only reader of uncompressed ``ma``..``me`` SSTables (``*-Data.db`` + ``*-Statistics.db``).

It exists to check the CQL value codecs against bytes written by a real Cassandra (the corpus'
``sstables/3.11-types``); it is not the project's backfill reader. Layout: cassandra-sstable-format.md §4
(Statistics.db TOC and SerializationHeader) and §6 (partitions, rows, cells), with the row and cell encodings of
cassandra-commitlog-format.md §12-§16. Values stay bytes; types come from the header via ``parse_type``.
Anything it does not understand raises FormatError naming the file and offset.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from cdc_lib.cql.types import CqlType, parse_type
from cdc_lib.errors import FormatError
from cdc_lib.wire import read_uvint, s32, s64

TIMESTAMP_EPOCH = 1442880000000000
DELETION_TIME_EPOCH = 1442880000
LEGACY_VERSIONS = ("ma", "mb", "mc", "md", "me")   # no metadata checksums, 12-byte partition deletion


@dataclass
class HeaderColumn:
    name: str
    type_string: str
    type: CqlType


@dataclass
class Header:
    min_timestamp: int
    min_local_deletion_time: int
    min_ttl: int
    partition_key_type: str
    clustering_types: list
    static_columns: list            # [HeaderColumn], Cassandra column order
    regular_columns: list


@dataclass
class Cell:
    column: str
    flags: int
    timestamp: int
    local_deletion_time: int | None
    ttl: int | None
    path: bytes | None
    value: bytes | None             # None when HAS_EMPTY_VALUE


@dataclass
class Row:
    clustering: list
    flags: int
    timestamp: int | None           # primary-key liveness
    cells: list = field(default_factory=list)
    complex_deletions: dict = field(default_factory=dict)    # column -> (markedForDeleteAt, ldt)


@dataclass
class Partition:
    key: bytes
    deletion: tuple                 # (local_deletion_time, marked_for_delete_at)
    static_row: Row | None
    rows: list


class _Reader:
    def __init__(self, data: bytes, source: str):
        self.data = data
        self.pos = 0
        self.source = source

    def fail(self, msg):
        return FormatError(msg, self.source, self.pos)

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise self.fail(f"need {n} bytes, {len(self.data) - self.pos} left")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u8(self):
        return self.take(1)[0]

    def u16(self):
        return struct.unpack(">H", self.take(2))[0]

    def i32(self):
        return struct.unpack(">i", self.take(4))[0]

    def i64(self):
        return struct.unpack(">q", self.take(8))[0]

    def uvint(self):
        try:
            v, self.pos = read_uvint(self.data, self.pos)
        except FormatError as e:
            raise e.located(self.source) from None
        return v

    def vint_bytes(self) -> bytes:
        return self.take(self.uvint())


def read_header(statistics: Path) -> Header:
    """The SerializationHeader component (ordinal 3) of a ``ma``..``me`` Statistics.db."""
    r = _Reader(statistics.read_bytes(), str(statistics))
    count = r.i32()
    offsets = dict((r.i32(), r.i32()) for _ in range(count))
    if 3 not in offsets:
        raise r.fail("no HEADER component")
    r.pos = offsets[3]
    min_ts = s64(r.uvint()) + TIMESTAMP_EPOCH
    min_ldt = s32(r.uvint() + DELETION_TIME_EPOCH)
    min_ttl = s32(r.uvint())
    pk_type = r.vint_bytes().decode()
    clustering = [r.vint_bytes().decode() for _ in range(r.uvint())]

    def columns():
        out = []
        for _ in range(r.uvint()):
            name = r.vint_bytes().decode()
            ts = r.vint_bytes().decode()
            out.append(HeaderColumn(name, ts, parse_type(ts)))
        # Cassandra's column order: simple before complex, then by name (ASCII names: byte order).
        return sorted(out, key=lambda c: (c.type.multicell, c.name.encode()))

    static = columns()
    regular = columns()
    return Header(min_ts, min_ldt, min_ttl, pk_type, clustering, static, regular)


def _read_clustering(r: _Reader, types: list) -> list:
    values = []
    header = 0
    for i, t in enumerate(types):
        if i % 32 == 0:
            header = r.uvint()
        j = i % 32
        if header & (1 << (2 * j + 1)):
            values.append(None)
        elif header & (1 << (2 * j)):
            values.append(b"")
        elif t.fixed_length is not None:
            values.append(r.take(t.fixed_length))
        else:
            values.append(r.vint_bytes())
    return values


def _read_cell(r: _Reader, h: Header, column: HeaderColumn, row_ts, row_ttl, row_ldt) -> Cell:
    flags = r.u8()
    ts = row_ts if flags & 0x08 else s64(r.uvint()) + h.min_timestamp
    ldt = ttl = None
    if flags & 0x10:
        ldt, ttl = row_ldt, row_ttl
    else:
        if flags & 0x03:
            ldt = s32(r.uvint() + h.min_local_deletion_time)
        if flags & 0x02:
            ttl = s32(r.uvint() + h.min_ttl)
    path = r.vint_bytes() if column.type.multicell else None
    value = None
    if not flags & 0x04:
        # Complex-column cell values always carry a length (the column type is never fixed-length).
        if column.type.multicell or column.type.fixed_length is None:
            value = r.vint_bytes()
        else:
            value = r.take(column.type.fixed_length)
    return Cell(column.name, flags, ts, ldt, ttl, path, value)


def _read_row(r: _Reader, h: Header, flags: int, static: bool, clustering_types: list) -> Row:
    ext = r.u8() if flags & 0x80 else 0
    if bool(ext & 0x01) != static:
        raise r.fail("static flag does not match the row's position")
    clustering = [] if static else _read_clustering(r, clustering_types)
    size = r.uvint()
    body_start = r.pos
    r.uvint()                                   # previous unfiltered size
    row_ts = row_ttl = row_ldt = None
    if flags & 0x04:
        row_ts = s64(r.uvint()) + h.min_timestamp
        if flags & 0x08:
            row_ttl = s32(r.uvint() + h.min_ttl)
            row_ldt = s32(r.uvint() + h.min_local_deletion_time)
    if flags & 0x10:
        r.uvint()
        r.uvint()
    superset = h.static_columns if static else h.regular_columns
    if flags & 0x20:
        present = superset
    else:
        if len(superset) >= 64:
            raise r.fail("large column subsets are not supported by this test reader")
        missing = r.uvint()
        present = [c for i, c in enumerate(superset) if not missing >> i & 1]
    row = Row(clustering, flags, row_ts)
    for col in present:
        if not col.type.multicell:
            row.cells.append(_read_cell(r, h, col, row_ts, row_ttl, row_ldt))
            continue
        if flags & 0x40:
            mfda = s64(r.uvint()) + h.min_timestamp
            ldt = s32(r.uvint() + h.min_local_deletion_time)
            row.complex_deletions[col.name] = (mfda, ldt)
        for _ in range(r.uvint()):
            row.cells.append(_read_cell(r, h, col, row_ts, row_ttl, row_ldt))
    if r.pos - body_start != size:
        raise r.fail(f"row body is {r.pos - body_start} bytes, row_size says {size}")
    return row


def read_partitions(data_file: Path, h: Header) -> list:
    """Every partition of an uncompressed ``ma``..``me`` Data.db."""
    r = _Reader(data_file.read_bytes(), str(data_file))
    clustering_types = [parse_type(t) for t in h.clustering_types]
    partitions = []
    while r.pos < len(r.data):
        key = r.take(r.u16())
        deletion = (r.i32(), r.i64())
        static_row = None
        if h.static_columns:
            static_row = _read_row(r, h, r.u8(), True, clustering_types)
        rows = []
        while True:
            flags = r.u8()
            if flags & 0x01:
                break
            if flags & 0x02:
                r.u8()                                      # bound kind
                _read_clustering(r, clustering_types[:r.u16()])
                size = r.uvint()
                r.take(size)                                # marker body: not needed here
                continue
            rows.append(_read_row(r, h, flags, False, clustering_types))
        partitions.append(Partition(key, deletion, static_row, rows))
    return partitions


def read_sstable(table_dir: Path):
    """(header, partitions) of the single uncompressed legacy-format SSTable in ``table_dir``."""
    data_files = sorted(table_dir.glob("*-Data.db"))
    if len(data_files) != 1:
        raise FormatError(f"expected one Data.db, found {len(data_files)}", str(table_dir))
    data_file = data_files[0]
    version = data_file.name.split("-")[0]
    if version not in LEGACY_VERSIONS:
        raise FormatError(f"format version {version!r} is not supported by this test reader", str(data_file))
    if (table_dir / data_file.name.replace("Data.db", "CompressionInfo.db")).exists():
        raise FormatError("compressed SSTables are not supported by this test reader", str(data_file))
    header = read_header(table_dir / data_file.name.replace("Data.db", "Statistics.db"))
    return header, read_partitions(data_file, header)
