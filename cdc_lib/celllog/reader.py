"""``read_cell_log``: commit-log segments -> Arrow batches of the cell log (``CELL_LOG_SCHEMA``), streaming.

Two implementations sit behind it and give the same batches, damage records and counters: the compiled one
(``native``: the ``cdc_native`` extension walks the segment and decodes entries straight into Arrow buffers)
and the pure-Python one below (``SegmentReader`` and the fast path ``fast``). ``CASSANDRA_CDC_NATIVE`` chooses
(``native.use_native``). Both hand every entry they do not decode to ``EntryHandler``, which runs the reference
decoder (``cdc_lib.commitlog.mutation`` + ``records``): its typed error becomes a ``Damage`` record for the
caller to quarantine, and its records are the truth the fast paths are tested against.
"""
from __future__ import annotations

import gc
import logging
import uuid

from cdc_lib.cql.schema import NOT_CAPTURED
from cdc_lib.cql.system_schema import SYSTEM_KEYSPACES, SYSTEM_TABLE_NOT_IN_SCHEMA, is_system_table_id

from .records import mutation_records

log = logging.getLogger(__name__)


def read_cell_log(paths, schema=None, *, schema_from_log: bool = False, keys=None, batch_rows: int = 65536,
                  on_damage=None, start=None, stop=None, strict: bool = False, stats: dict | None = None,
                  cdc_only: bool = False):
    """Arrow batches (CELL_LOG_SCHEMA) of the user-table cells of ``paths``, in file order.

    ``paths``: one segment or an iterable of them, each a path (str, bytes or os.PathLike), a segment's bytes
    (``commitlog.segment.is_segment_bytes``) or its bytes with its name (``commitlog.segment.SegmentBytes``).
    Mutations of system keyspaces are not user data and are skipped, counted in ``system_entries``
    (``system_schema`` ones update the schema when ``schema_from_log``), also those of system tables the schema
    does not describe (``system.local`` and the like: ``cql.system_schema.is_system_table_id``); any other unknown
    table id is Damage (``unknown_table``). Each
    Damage goes to ``on_damage`` (required: the caller quarantines it; nothing is dropped here); with ``strict``
    the first one that means damaged bytes is raised instead. ``stats`` (a dict) receives counters.
    ``entry_index`` counts partition updates per segment. A batch closes after the entry that brings it to
    ``batch_rows`` records. With ``cdc_only`` (what the pipeline reads), entries of tables without ``cdc = true``
    are skipped too, counted in ``not_captured_entries``: they are in the segment because it also held CDC data,
    and the pipeline captures CDC tables only (``Schema.captured_tables``).
    """
    from cdc_lib.commitlog.reader import schema_source
    from cdc_lib.commitlog.segment import segment_sources

    from . import native
    if on_damage is None:
        raise TypeError("read_cell_log needs on_damage: damaged or undecodable entries must go somewhere")
    sources = segment_sources(paths)
    counters = stats if stats is not None else {}
    for k in ("entries", "system_entries", "not_captured_entries", "damaged", "records"):
        counters.setdefault(k, 0)
    entries = EntryHandler(schema_source(schema, schema_from_log), schema_from_log, strict, on_damage, counters,
                           cdc_only)
    if native.use_native():
        yield from native.read_segments(sources, entries, keys=keys, start=start, stop=stop, strict=strict,
                                        batch_rows=batch_rows)
        return
    # Decoding allocates millions of acyclic tuples; the cyclic collector would rescan the growing record buffer
    # again and again (measured: 2.5x slower batches). It is paused while a batch is built.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield from _read_python(sources, entries, keys, start, stop, strict, batch_rows, gc_was_enabled)
    finally:
        if gc_was_enabled:
            gc.enable()


def _read_python(sources, entries, keys, start, stop, strict, batch_rows, gc_was_enabled):
    from cdc_lib.commitlog.segment import Damage, SegmentReader

    from .fast import FastCellLog
    fast = FastCellLog()
    counters = entries.counters
    for source in sources:
        entry_index = 0
        for rec in SegmentReader(source, keys=keys, start=start, stop=stop, strict=strict):
            if isinstance(rec, Damage):
                entries.damage(rec)
                continue
            entry_index += entries.handle(rec, fast, entry_index)
            if len(fast) >= batch_rows:
                counters["records"] += len(fast)
                batch = fast.to_batch()
                if gc_was_enabled:
                    gc.enable()          # the caller's code runs with the collector as it had it
                yield batch
                gc.disable()
    if len(fast):
        counters["records"] += len(fast)
        yield fast.to_batch()


class EntryHandler:
    """What ``read_cell_log`` does with one CRC-valid entry, whichever reader walked the segment.

    ``handle`` skips system tables (and follows ``system_schema`` when the schema comes from the log), lets the
    fast path decode the entry into ``cells`` (a ``FastCellLog`` or the native decoder's ``NativeCellLog``), and
    when it cannot, decodes it with the reference: records, or a Damage record.
    """

    def __init__(self, src, schema_from_log: bool, strict: bool, on_damage, counters: dict,
                 cdc_only: bool = False):
        self.src = src                    # the schema source (fixed, or followed through the log)
        self.schema_from_log = schema_from_log
        self.cdc_only = cdc_only          # skip user tables without cdc = true (NOT_CAPTURED)
        self.strict = strict
        self.on_damage = on_damage
        self.counters = counters
        self._tables: dict = {}           # 16 raw id bytes -> TableMetadata | None | a sentinel
        self._tables_of = None            # the schema object ``_tables`` describes

    def damage(self, d) -> None:
        self.counters["damaged"] += 1
        self.on_damage(d)

    def current(self):
        """The schema in force; the table cache follows it (a new schema object, e.g. from the log)."""
        current = self.src.current()
        if current is not self._tables_of:
            self._tables = {}
            self._tables_of = current
        return current

    def table_of(self, raw_id: bytes):
        """The table of a 16-byte table id in the current schema: TableMetadata, None (unknown),
        ``SYSTEM_TABLE_NOT_IN_SCHEMA`` or (with ``cdc_only``) ``NOT_CAPTURED``."""
        current = self.current()
        try:
            return self._tables[raw_id]
        except KeyError:
            pass
        tid = uuid.UUID(bytes=bytes(raw_id)) if len(raw_id) == 16 else None
        table = current.get(tid) if tid is not None else None
        if table is None and tid is not None and is_system_table_id(tid):
            table = SYSTEM_TABLE_NOT_IN_SCHEMA
        elif self.cdc_only and table is not None and table.keyspace not in SYSTEM_KEYSPACES and not table.cdc:
            table = NOT_CAPTURED
        self._tables[raw_id] = table
        return table

    def handle(self, rec, cells, entry_index: int, try_fast: bool = True, fast_failed: bool = False) -> int:
        """Decode one ``LogEntry`` into ``cells``; returns its number of partition updates (0 when skipped or
        damaged). The table of its first update decides whether it is user data. ``try_fast``: try
        ``cells.add_entry`` before the reference; ``fast_failed``: the caller's fast path already tried."""
        from cdc_lib.commitlog.model import Mutation
        from cdc_lib.commitlog.reader import decode_entry
        from cdc_lib.commitlog.segment import Damage
        from cdc_lib.wire import EXTRA_BYTES
        counters = self.counters
        counters["entries"] += 1
        data = rec.data
        p = 1 if data[0] < 0x80 else 1 + EXTRA_BYTES[data[0]]
        table = self.table_of(data[p:p + 16])
        if table is SYSTEM_TABLE_NOT_IN_SCHEMA:
            counters["system_entries"] += 1
            return 0
        if table is NOT_CAPTURED:
            counters["not_captured_entries"] += 1
            return 0
        current = self._tables_of
        if table is not None and table.keyspace in SYSTEM_KEYSPACES:
            counters["system_entries"] += 1
            if self.schema_from_log and table.keyspace == "system_schema":
                out = decode_entry(rec, current)
                if isinstance(out, Mutation):
                    self.src.observe(out)
                else:
                    self.damage(out)
            return 0
        if try_fast and table is not None and rec.messaging_version is not None:
            try:
                return cells.add_entry(data, current, rec.messaging_version, rec.segment, rec.segment_id,
                                       rec.position, entry_index)
            except Exception:  # noqa: BLE001 - the reference decoder below gives the typed answer
                fast_failed = True
        out = decode_entry(rec, current)
        if isinstance(out, Damage):
            if self.strict and out.is_damage:
                raise out.error()
            self.damage(out)
            return 0
        if fast_failed:
            log.warning("fast path and reference disagree on %s@%d; using the reference", rec.segment,
                        rec.position)
        cells.add_records(mutation_records(out, entry_index))
        return len(out.updates)
