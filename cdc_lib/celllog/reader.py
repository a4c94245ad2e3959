"""``read_cell_log``: commit-log segments -> Arrow batches of the cell log (``CELL_LOG_SCHEMA``), streaming.

Each entry goes through the fast path (``fast``); one it cannot decode is decoded again by the reference decoder
(``cdc_lib.commitlog.mutation``), whose typed error becomes a ``Damage`` record for the caller to quarantine.
"""
from __future__ import annotations

import gc
import uuid

from cdc_lib.cql.system_schema import SYSTEM_KEYSPACES, is_system_table_id

from .records import mutation_records


_SYSTEM_TABLE_NOT_IN_SCHEMA = object()     # cache value: a system table id the schema does not describe
_NOT_CAPTURED = object()                   # cache value: a user table without cdc = true (with ``cdc_only``)


def read_cell_log(paths, schema=None, *, schema_from_log: bool = False, keys=None, batch_rows: int = 65536,
                  on_damage=None, start=None, stop=None, strict: bool = False, stats: dict | None = None,
                  cdc_only: bool = False):
    """Arrow batches (CELL_LOG_SCHEMA) of the user-table cells of ``paths``, in file order.

    Entries are decoded by the fast path (``fast``). An entry it cannot decode is decoded again by the
    reference decoder (``mutation``): the typed error it raises becomes a ``Damage`` record. Mutations of system
    keyspaces are not user data and are skipped, counted in ``system_entries`` (``system_schema`` ones update the
    schema when ``schema_from_log``), also those of system tables the schema does not describe (``system.local``
    and the like: ``cql.system_schema.is_system_table_id``); any other unknown table id is Damage
    (``unknown_table``). Each Damage goes to ``on_damage``
    (required: the caller quarantines it; nothing is dropped here). ``stats`` (a dict) receives counters.
    ``entry_index`` counts partition updates per segment. With ``cdc_only`` (what the pipeline reads), entries of
    tables without ``cdc = true`` are skipped too, counted in ``not_captured_entries``: they are in the segment
    because it also held CDC data, and the pipeline captures CDC tables only (``Schema.captured_tables``).
    """
    from cdc_lib.commitlog.reader import schema_source

    from .fast import FastCellLog
    if on_damage is None:
        raise TypeError("read_cell_log needs on_damage: damaged or undecodable entries must go somewhere")
    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        paths = [paths]
    counters = stats if stats is not None else {}
    for k in ("entries", "system_entries", "not_captured_entries", "damaged", "records"):
        counters.setdefault(k, 0)
    src = schema_source(schema, schema_from_log)
    fast = FastCellLog()
    # Decoding allocates millions of acyclic tuples; the cyclic collector would rescan the growing record buffer
    # again and again (measured: 2.5x slower batches). It is paused while a batch is built.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield from _read_cell_log(paths, src, fast, keys, start, stop, strict, on_damage, counters, batch_rows,
                                  schema_from_log, gc_was_enabled, cdc_only)
    finally:
        if gc_was_enabled:
            gc.enable()


def _read_cell_log(paths, src, fast, keys, start, stop, strict, on_damage, counters, batch_rows, schema_from_log,
                   gc_was_enabled, cdc_only):
    import logging

    from cdc_lib.commitlog.model import Mutation
    from cdc_lib.commitlog.reader import decode_entry
    from cdc_lib.commitlog.segment import Damage, SegmentReader
    from cdc_lib.wire import EXTRA_BYTES
    tables_by_raw_id: dict = {}     # 16 raw id bytes -> TableMetadata | None, for the schema in `cached_for`
    cached_for = None
    for path in paths:
        entry_index = 0
        for rec in SegmentReader(path, keys=keys, start=start, stop=stop, strict=strict):
            if isinstance(rec, Damage):
                counters["damaged"] += 1
                on_damage(rec)
                continue
            counters["entries"] += 1
            current = src.current()
            if current is not cached_for:
                tables_by_raw_id = {}
                cached_for = current
            data = rec.data
            p = 1 if data[0] < 0x80 else 1 + EXTRA_BYTES[data[0]]
            raw_id = data[p:p + 16]
            try:
                table = tables_by_raw_id[raw_id]
            except KeyError:
                tid = uuid.UUID(bytes=bytes(raw_id)) if len(raw_id) == 16 else None
                table = current.get(tid) if tid is not None else None
                if table is None and tid is not None and is_system_table_id(tid):
                    table = _SYSTEM_TABLE_NOT_IN_SCHEMA
                elif cdc_only and table is not None and table.keyspace not in SYSTEM_KEYSPACES and not table.cdc:
                    table = _NOT_CAPTURED
                tables_by_raw_id[raw_id] = table
            if table is _SYSTEM_TABLE_NOT_IN_SCHEMA:
                counters["system_entries"] += 1
                continue
            if table is _NOT_CAPTURED:
                counters["not_captured_entries"] += 1
                continue
            if table is not None and table.keyspace in SYSTEM_KEYSPACES:
                counters["system_entries"] += 1
                if schema_from_log and table.keyspace == "system_schema":
                    out = decode_entry(rec, current)
                    if isinstance(out, Mutation):
                        src.observe(out)
                    else:
                        counters["damaged"] += 1
                        on_damage(out)
                continue
            n = None
            if table is not None and rec.messaging_version is not None:
                try:
                    n = fast.add_entry(rec.data, current, rec.messaging_version, rec.segment, rec.segment_id,
                                       rec.position, entry_index)
                except Exception:  # noqa: BLE001 - the reference decoder below gives the typed answer
                    n = None
            if n is None:
                out = decode_entry(rec, current)
                if isinstance(out, Damage):
                    if strict and out.is_damage:
                        raise out.error()
                    counters["damaged"] += 1
                    on_damage(out)
                    continue
                logging.getLogger(__name__).warning(
                    "fast path and reference disagree on %s@%d; using the reference", rec.segment, rec.position)
                recs = mutation_records(out, entry_index)
                fast.add_records(recs)
                n = len(out.updates)
            entry_index += n
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
