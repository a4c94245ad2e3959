"""Read one SSTable into typed partitions: the reference decoder, and what the fast path shares with it.

``SSTable`` opens an SSTable (its Statistics.db header, the table it belongs to, its Data.db stream) and
``SSTable.mutations()`` yields its partitions, in file order, as ``commitlog.model.Mutation`` objects with one
``PartitionUpdate`` each, so that everything built for commit-log mutations (the ``inspect`` JSON, the
reference cell-log conversion) works on SSTables unchanged. A partition with many rows comes as several
mutations of at most ``rows_per_update`` unfiltereds each (the first carries the partition deletion and the
static row), so memory does not grow with the partition.

Rows, cells and markers are decoded by the commit-log decoder's functions (``commitlog.mutation``): the byte
layout is the same (format reference §6). What SSTables add is decoded here: the partition header (a u16 key,
an always-present partition deletion in the version's form, §6.2), the static row that every partition has
when the header has static columns (§6.3), and the two sizes after each row's and marker's clustering
(§6.4–§6.5), which are checked exactly: ``row_size`` against the body, ``prev_unfiltered_size`` against the
distance from the previous unfiltered.

Source fields: ``Mutation.segment`` is the Data.db file name, ``Mutation.position`` the partition's offset in D
(the uncompressed Data.db stream, where Index.db and Partitions.db point), ``segment_id`` the SSTable's
generation (``Descriptor.generation_number``).

Damage is never silent: a chunk that fails its CRC or does not decompress, and bytes that do not decode, become
``commitlog.segment.Damage`` records (file name, D offset, kind, reason, the bytes where they are small). The
scan then resumes at the next partition the index (Index.db, or Partitions.db for BTI) lists after the damage,
or, without a readable index, reports the rest of the file as not read.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

from cdc_lib.commitlog.model import (NO_TIMESTAMP, DeletionTime, Mutation, PartitionUpdate, RangeTombstoneMarker,
                                     Row)
from cdc_lib.commitlog.mutation import (R_END_OF_PARTITION, R_EXTENSION_FLAG, R_IS_MARKER, RX_IS_STATIC, Reader,
                                        Times, read_bound, read_clustering, read_marker_body, read_row_body)
from cdc_lib.commitlog.segment import Damage
from cdc_lib.errors import CdcError, FormatError, SSTableError, TruncatedError

from .chunks import DataStream, Window
from .descriptor import parse_data_path
from .index import PartitionIndex
from .statistics import read_statistics
from .table import sstable_table

LOOKAHEAD = 1 << 18             # bytes a decoder asks for beyond what it knows it needs
DAMAGE_BYTES_KEPT = 1 << 20     # at most this much of an undecodable range is kept in its Damage record
ROWS_PER_UPDATE = 1000


class _Short(Exception):
    """The window ends before the structure being read: it needs the window's bytes up to index ``end``."""

    def __init__(self, end: int):
        self.end = end


class Damaged(Exception):
    """Decoding stopped at damage; ``damage`` says where and why (raised by ``SSTable.decode``)."""

    def __init__(self, damage: Damage):
        self.damage = damage


@dataclass
class PartitionHead:
    start: int                          # D offset of the partition (its key length field)
    key: bytes
    deletion: Optional[DeletionTime]    # None when live
    static_row: Optional[Row]           # None when absent or empty


class SSTable:
    """One SSTable, opened for a sequential scan. ``schema`` (optional) names the key columns and the table;
    without one, the snapshot's ``schema.cql`` beside the files is used if present, else default names."""

    def __init__(self, data_path, schema=None, *, strict: bool = False):
        self.desc = parse_data_path(data_path)
        self.name = self.desc.data_name
        self.path = self.desc.path("Data.db")
        self.version = self.desc.version
        self.header = read_statistics(self.desc.path("Statistics.db"), self.version)
        self.table = sstable_table(self.desc, self.header, schema)
        self.stream = DataStream(self.desc)
        self.strict = strict
        self.messaging_version = self.version.messaging_version
        self.times = Times(self.header.stats, self.messaging_version)
        self.clustering_types = [c.type for c in self.table.clustering]
        self.static_columns = tuple(c.name for c in self.header.static_columns)
        self.regular_columns = tuple(c.name for c in self.header.regular_columns)
        self._index: Optional[PartitionIndex] = None

    @property
    def length(self) -> int:
        """Bytes of D (the uncompressed Data.db)."""
        return self.stream.length

    # -- reading structures out of the window ----------------------------------------------------------------
    def decode(self, win: Window, pos: int, read, need: int = LOOKAHEAD):
        """``read(r)`` at D offset ``pos`` -> (its result, the D offset after it). The window grows while
        ``read`` runs out of bytes; bytes that end (or are cut by a damaged chunk) before the structure does,
        and any decoding error, raise ``Damaged``."""
        while True:
            win.extend(pos, need)
            r = Reader(win.buf, pos - win.base)
            try:
                return read(r), win.base + r.pos
            except (_Short, TruncatedError) as e:
                if not (win.at_end or win.gap):             # more bytes can come: ask for more
                    want = e.end - (pos - win.base) if isinstance(e, _Short) else 0
                    need = max(want, 2 * need, 2 * (win.end - pos))
                    continue
                cause = "is cut by a damaged chunk" if win.gap else "runs past the end of Data.db"
                raise Damaged(self._damage(win, pos, "undecodable", f"the partition data at {pos} {cause}")) \
                    from None
            except FormatError as e:
                at = "" if e.position is None else f" (at offset {win.base + e.position})"
                raise Damaged(self._damage(win, pos, "undecodable", e.reason + at)) from None
            except CdcError as e:
                raise Damaged(self._damage(win, pos, "undecodable", str(e))) from None
            except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
                raise Damaged(self._damage(win, pos, "undecodable", f"undecodable bytes: {e}")) from None

    def _damage(self, win: Window, pos: int, kind: str, reason: str) -> Damage:
        at = pos - win.base
        return Damage(self.name, pos, kind, reason, bytes(win.buf[at:at + DAMAGE_BYTES_KEPT]))

    def read_partition_head(self, r: Reader, start: int) -> PartitionHead:
        """Key, partition deletion and static row of the partition whose key length field is at ``r.pos``."""
        klen = r.u16()
        key = r.take(klen)
        if self.version.uint_deletion_time:                     # oa, da: 1 byte when live (§6.2)
            b0 = r.u8()
            if b0 & 0x80:
                if b0 != 0x80:
                    raise SSTableError(f"partition deletion starts with {b0:#04x}, which is neither LIVE "
                                       f"(0x80) nor a timestamp", position=r.pos - 1)
                deletion = None
            else:
                rest = r.take(7)
                mfda = (b0 << 56) | int.from_bytes(rest, "big")
                deletion = DeletionTime(mfda, struct.unpack(">I", r.take(4))[0])
        else:
            ldt, mfda = struct.unpack(">iq", r.take(12))
            deletion = None if mfda == NO_TIMESTAMP else DeletionTime(mfda, ldt)
        static_row = None
        if self.static_columns:
            row_at = r.pos
            flags = r.u8()
            if flags & (R_END_OF_PARTITION | R_IS_MARKER) or not flags & R_EXTENSION_FLAG:
                raise SSTableError("the static row every partition has when the header has static columns is "
                                   "missing", position=row_at)
            ext = r.u8()
            if not ext & RX_IS_STATIC:
                raise SSTableError("the partition's first row is not marked static", position=row_at)
            static_row = self.read_row(r, flags, ext, (), self.static_columns, 0)
            if _is_empty(static_row):
                static_row = None
        return PartitionHead(start, key, deletion, static_row)

    def read_row(self, r: Reader, flags: int, ext: int, clustering: tuple, columns: tuple, prev: int) -> Row:
        """A row's two sizes and body (after flags, ext and clustering); ``prev``: the expected distance back
        to the previous unfiltered (§6.4)."""
        return self._sized(r, prev, "row", lambda: read_row_body(r, flags, ext, clustering, self.table, columns,
                                                                 self.times, self.messaging_version))

    def _sized(self, r: Reader, prev: int, what: str, read_body):
        """The SSTable-only sizes of a row or marker, then its body, read within the size it states."""
        size = r.uvint()
        body = r.pos
        if body + size > r.end:
            raise _Short(body + size)
        end = r.end
        r.end = body + size
        try:
            prev_size = r.uvint()
            if prev_size != prev:
                raise SSTableError(f"{what} says the previous unfiltered is {prev_size} bytes back, it is {prev}",
                                   position=body)
            out = read_body()
            if r.pos != body + size:
                raise SSTableError(f"{what} body is {r.pos - body} bytes, its size field says {size}",
                                   position=body)
        except TruncatedError as e:
            raise SSTableError(f"{what} body runs past the {size} bytes its size field gives: {e.reason}",
                               position=body) from None
        finally:
            r.end = end
        return out

    def read_unfiltered(self, r: Reader, prev: int) -> Union[Row, RangeTombstoneMarker, None]:
        """The unfiltered at ``r.pos`` (None: the end-of-partition byte); ``prev`` as in ``read_row``."""
        at = r.pos
        flags = r.u8()
        if flags & R_END_OF_PARTITION:
            return None
        if flags & R_IS_MARKER:
            kind, values = read_bound(r, self.clustering_types)
            return self._sized(r, prev, "marker", lambda: read_marker_body(r, kind, values, self.times))
        ext = r.u8() if flags & R_EXTENSION_FLAG else 0
        if ext & RX_IS_STATIC:
            raise SSTableError("a static row among the clustering rows", position=at)
        clustering = read_clustering(r, self.clustering_types, len(self.clustering_types))
        return self.read_row(r, flags, ext, clustering, self.regular_columns, prev)

    # -- damage -----------------------------------------------------------------------------------------------
    def after_damage(self, win: Window, err: Damage, partition_start: Optional[int]) -> tuple:
        """(Damage records, D offset to resume at or None) for a decoding failure ``err`` inside the partition
        starting at ``partition_start`` (None: at a partition boundary). ``strict`` raises instead."""
        if self.strict:
            raise damage_error(win.damage if win.gap else err)
        if win.gap:
            floor = win.gap[1]
        else:
            floor = err.position + 1
        if self._index is None:
            self._index = PartitionIndex(self.desc)
        nxt = self._index.next_start(floor) if floor < self.length else None
        stop = self.length if nxt is None else nxt
        if nxt is not None:
            how = f"the scan resumes at the next partition (offset {nxt})"
        elif floor >= self.length:
            how = "it is the end of Data.db"
        else:
            how = (f"the rest of Data.db is not read: {'Index.db' if self.version.format == 'big' else 'Partitions.db'}"
                   f" lists no later partition")
        if not win.gap:
            err.reason += f"; bytes {err.position}..{stop} are skipped, {how}"
            return [err], nxt
        out = [win.damage]
        if partition_start is not None and partition_start < win.gap[0]:
            out.append(Damage(self.name, partition_start, "undecodable",
                              f"the partition at {partition_start} is cut by the damaged chunk at {win.gap[0]}: "
                              f"only its rows before the damage were read"))
        if stop > win.gap[1]:
            out.append(Damage(self.name, win.gap[1], "undecodable",
                              f"bytes {win.gap[1]}..{stop} after the damaged chunk are skipped: {how}"))
        return out, nxt

    # -- the reference scan -------------------------------------------------------------------------------------
    def mutations(self, rows_per_update: int = ROWS_PER_UPDATE) -> Iterator[Union[Mutation, Damage]]:
        """Every partition, in Data.db order, as mutations of at most ``rows_per_update`` unfiltereds each,
        with a ``Damage`` record wherever bytes could not be read."""
        unchecked = self.stream.unchecked()
        if unchecked is not None:
            if self.strict:
                raise damage_error(unchecked)
            yield unchecked
        win = Window(self.stream)
        pos = 0
        while pos is not None and pos < self.length:
            start = pos
            try:
                head, pos = self.decode(win, pos, lambda r: self.read_partition_head(r, start))
                update = self._update(head, first=True)
                first = True
                prev_at = start
                while True:
                    at = pos
                    u, pos = self.decode(win, pos, lambda r: self.read_unfiltered(r, at - prev_at))
                    if u is None:
                        break
                    prev_at = at
                    update.unfiltereds.append(u)
                    if len(update.unfiltereds) >= rows_per_update:
                        yield self._mutation(update, head)
                        update = self._update(head, first=False)
                        first = False
                if first or update.unfiltereds:
                    yield self._mutation(update, head)
            except Damaged as d:
                records, pos = self.after_damage(win, d.damage, start if d.damage.position > start else None)
                yield from records
                if pos is not None:
                    win.restart(pos)

    def _update(self, head: PartitionHead, first: bool) -> PartitionUpdate:
        return PartitionUpdate(self.table.id, head.key, self.table, head.deletion if first else None,
                               head.static_row if first else None, [], self.static_columns, self.regular_columns,
                               self.header.stats)

    def _mutation(self, update: PartitionUpdate, head: PartitionHead) -> Mutation:
        return Mutation([update], self.name, self.desc.generation_number, head.start, self.messaging_version)


def damage_error(d: Damage) -> SSTableError:
    """The typed error for a Damage record of an SSTable (what ``strict`` raises)."""
    return SSTableError(f"{d.kind}: {d.reason}", d.segment, d.position)


def _is_empty(row: Row) -> bool:
    return (not row.cells and not row.complex_deletions and row.deletion is None
            and (row.liveness is None or row.liveness.timestamp == NO_TIMESTAMP))


def open_sstable(path, schema=None, *, strict: bool = False) -> Union[SSTable, Damage]:
    """``SSTable(path)``, or a ``Damage`` record (kind ``header``) when its Statistics.db or CompressionInfo.db
    cannot be read, so that one broken SSTable does not stop the others (``strict`` raises instead)."""
    try:
        return SSTable(path, schema, strict=strict)
    except SSTableError as e:
        if strict:
            raise
        return Damage(Path(path).name, 0, "header", str(e))


def read_sstable_mutations(paths, schema=None, *, strict: bool = False) -> Iterator[Union[Mutation, Damage]]:
    """Mutations and Damage of every SSTable in ``paths`` (``*-Data.db`` files or table directories), in the
    same form ``commitlog.read_mutations`` gives for segments."""
    from .descriptor import find_data_files
    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        paths = [paths]
    for path in paths:
        for data in find_data_files(Path(path)):
            sst = open_sstable(data, schema, strict=strict)
            if isinstance(sst, Damage):
                yield sst
            else:
                yield from sst.mutations()
