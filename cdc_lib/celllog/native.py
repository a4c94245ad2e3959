"""The compiled reader behind ``read_cell_log``: segment container and mutation decoding in native code.

``cdc_native`` (the Rust crate under ``native/``, built by ``scripts/setup.sh`` with maturin) walks a segment's
sync markers, sections and entries, checks both CRCs of every entry and decodes mutations straight into the
Arrow cell-log columns, with no Python object per record. Everything else stays in Python and is shared with the
pure-Python reader: segment headers, the codecs of compressed and encrypted sections (``SegmentReader.begin``,
``section_bytes``, ``torn_section_bytes``, called once per section), schemas (followed through the log when
``schema_from_log``), system tables, and above all the reference decoder, through ``reader.EntryHandler``: it
decodes every entry the native code does not, and gives the typed error (a Damage record) for every entry that
cannot be decoded. The native decoder never decides an error: on any doubt it hands the entry back.

Output is identical to the pure-Python reader (records, batch boundaries, damage records with their reasons,
counters, exceptions); ``tests/test_celllog_paths.py`` and ``tests/test_celllog_fuzz.py`` check it on real
segments, generated workloads, random mutations and fuzzed files.

The walker (``cdc_native.Decoder.run``) returns to Python with an event whenever it needs it: END, BATCH (the
batch is full), DAMAGE (container damage, reported as ``SegmentReader`` reports it), SECTION (a compressed or
encrypted section to decompress/decrypt here), NEED_TABLE (describe a table, then the entry is retried) and
ENTRY (an entry for ``EntryHandler``).

``CASSANDRA_CDC_NATIVE`` chooses the path: ``0`` pure Python, ``1`` native (an error without the compiled
module), ``auto`` (the default) native when the module is installed.
"""
from __future__ import annotations

import os
import uuid

import pyarrow as pa

from cdc_lib.cql.schema import NOT_CAPTURED
from cdc_lib.cql.system_schema import SYSTEM_KEYSPACES, SYSTEM_TABLE_NOT_IN_SCHEMA

from .schema import CELL_LOG_SCHEMA

ENV = "CASSANDRA_CDC_NATIVE"
API = 7                 # the cdc_native API this code speaks (``API`` in native/src/lib.rs)

try:  # the compiled module is optional: without it the package is pure Python
    import cdc_native as _native
except ImportError:
    _native = None
    _missing = "the compiled module cdc_native is not installed"
else:
    if getattr(_native, "API", None) != API:     # built from other sources than this checkout's native/
        _missing = (f"the installed cdc_native speaks API {getattr(_native, 'API', None)}, this code {API} "
                    "(rebuild it: scripts/setup.sh)")
        _native = None
        import logging
        logging.getLogger(__name__).warning("%s: running pure Python", _missing)


def native_available() -> bool:
    """Whether the compiled module ``cdc_native`` is installed (and built from these sources' API)."""
    return _native is not None


def compiled_module():
    """The compiled module ``cdc_native`` (built from these sources' API), or None: the state engine's too."""
    return _native


def use_native() -> bool:
    """Whether the compiled paths run (``CASSANDRA_CDC_NATIVE`` = 0, 1 or auto; auto when unset)."""
    mode = os.environ.get(ENV, "auto").strip().lower()
    if mode == "0":
        return False
    if mode == "1":
        if _native is None:
            raise ImportError(f"{ENV}=1 but {_missing}: run scripts/setup.sh (it needs cargo), or set {ENV}=0 "
                              "or auto for the pure-Python path")
        return True
    if mode not in ("", "auto"):
        raise ValueError(f"{ENV} must be 0, 1 or auto, not {mode!r}")
    return _native is not None


# ---- column buffers -> Arrow ---------------------------------------------------------------------------------

_TYPES = [f.type for f in CELL_LOG_SCHEMA]
_VAR = [pa.types.is_binary(t) or pa.types.is_string(t) for t in _TYPES]


def batch_from_columns(n: int, cols: list) -> pa.RecordBatch:
    """A RecordBatch from ``Decoder.take_batch()`` buffers (zero-copy: Arrow wraps the native buffers)."""
    arrays = []
    for typ, var, (valid, b1, b2, nulls) in zip(_TYPES, _VAR, cols):
        vb = pa.py_buffer(valid) if valid is not None else None
        bufs = [vb, pa.py_buffer(b1), pa.py_buffer(b2)] if var else [vb, pa.py_buffer(b1)]
        arrays.append(pa.Array.from_buffers(typ, n, bufs, null_count=nulls))
    return pa.RecordBatch.from_arrays(arrays, schema=CELL_LOG_SCHEMA)


# ---- tables -> what the native decoder needs of them -------------------------------------------------------

def register_table(dec, raw_id: bytes, table, schema_from_log: bool) -> None:
    """Describe ``table`` (``EntryHandler.table_of``: TableMetadata, None or a sentinel) to the
    native decoder: only what decoding needs, as values stay bytes: per column name whether it is complex and
    its fixed value length, per clustering column its fixed length."""
    if table is None:
        dec.register_table(raw_id, _native.MODE_UNKNOWN)
        return
    if table is SYSTEM_TABLE_NOT_IN_SCHEMA:
        dec.register_table(raw_id, _native.MODE_SYSTEM_UNKNOWN)
        return
    if table is NOT_CAPTURED:
        # handed to Python (``EntryHandler.handle`` counts it as not captured); nothing of it is decoded
        dec.register_table(raw_id, _native.MODE_PYTHON)
        return
    if table.keyspace in SYSTEM_KEYSPACES:
        mode = _native.MODE_PYTHON if schema_from_log and table.keyspace == "system_schema" else _native.MODE_SKIP
    else:
        mode = _native.MODE_USER
    cols = [(name, col.type.multicell, col.type.fixed_length) for name, col in table.columns.items()]
    cols += [(name, d.type.multicell, d.type.fixed_length) for name, d in table.dropped.items()
             if name not in table.columns]           # as column_for_data: current columns first, then dropped
    dec.register_table(raw_id, mode, str(table.id), table.keyspace, table.name,
                       [c.type.fixed_length for c in table.clustering], cols)


class NativeCellLog:
    """``fast.FastCellLog``'s interface over the native decoder: the records of entries given one at a time."""

    def __init__(self, dec=None):
        self._dec = dec if dec is not None else _native.Decoder()
        self._schema_ref = None

    def __len__(self):
        return self._dec.rows

    def add_entry(self, data: bytes, schema, messaging_version: int, segment: str, segment_id: int,
                  position: int, entry_index: int) -> int:
        """Append the records of one mutation; returns its number of partition updates. Raises ValueError when
        the native decoder leaves it to the reference (then nothing of this entry is kept)."""
        if self._schema_ref is not schema:
            self._dec.clear_tables()
            self._schema_ref = schema
        while True:
            try:
                n = self._dec.add_entry(data, messaging_version, segment, segment_id, position, entry_index)
            except KeyError as e:
                raw = e.args[0]
                register_table(self._dec, raw, schema.get(uuid.UUID(bytes=raw)), False)
                continue
            if n is None:
                raise ValueError("entry left to the reference decoder")
            return n

    def add_records(self, records: list) -> None:
        self._dec.add_records(records)

    def to_batch(self) -> pa.RecordBatch:
        n, cols = self._dec.take_batch()
        return batch_from_columns(n, cols)


# ---- read_cell_log ------------------------------------------------------------------------------------------

def read_segments(sources: list, entries, *, keys, start, stop, strict: bool, batch_rows: int):
    """``reader.read_cell_log`` on the native path: the batches of ``sources``; entries the walker hands back,
    damage and counters go through ``entries`` (a ``reader.EntryHandler``)."""
    dec = _native.Decoder()
    walk = _Walk(dec, entries, batch_rows)
    for source in sources:
        yield from walk.segment(source, keys, start, stop, strict)
    if dec.rows:
        yield walk.take()


class _Walk:
    """Python's side of the native walk: handles the events ``Decoder.run`` returns, in file order."""

    def __init__(self, dec, entries, batch_rows: int):
        self.dec = dec
        self.cells = NativeCellLog(dec)
        self.entries = entries
        self.counters = entries.counters
        self.batch_rows = batch_rows
        self.schema = None               # the schema the decoder's tables describe

    def take(self) -> pa.RecordBatch:
        self.counters["records"] += self.dec.rows
        n, cols = self.dec.take_batch()
        return batch_from_columns(n, cols)

    def _sync(self):
        """Counters the walker kept natively; the decoder forgets its tables when the schema changes."""
        e, s = self.dec.take_counts()
        self.counters["entries"] += e
        self.counters["system_entries"] += s
        current = self.entries.current()
        if current is not self.schema:
            self.dec.clear_tables()
            self.schema = current

    def segment(self, source, keys, start, stop, strict):
        from cdc_lib.commitlog.segment import SegmentReader
        reader = SegmentReader(source, keys=keys, start=start, stop=stop, strict=strict)
        with reader.mapped() as buf:
            d = reader.begin(buf)
            if d is not None:
                self.entries.damage(d)
                return
            h = reader.header
            self.dec.begin_segment(buf, reader.name, h.id, h.version, h.size,
                                   h.compression_class is not None or h.encrypted, start, stop)
            try:
                yield from self._events(reader, buf)
            finally:
                self.dec.end_segment()

    def _events(self, reader, buf):
        dec = self.dec
        n = _native
        while True:
            self._sync()
            ev = dec.run(self.batch_rows)
            self._sync()
            code = ev[0]
            if code == n.EV_BATCH:
                yield self.take()
            elif code == n.EV_END:
                return
            elif code == n.EV_DAMAGE:
                _, kind, position, reason, data, physical = ev
                self.entries.damage(reader.damage(position, kind, reason, data, physical))
            elif code == n.EV_NEED_TABLE:
                raw = ev[1]
                register_table(dec, raw, self.entries.table_of(raw), self.entries.schema_from_log)
            elif code == n.EV_SECTION:
                self._section(reader, buf, *ev[1:])
            elif code == n.EV_ENTRY:
                if self._entry(reader, *ev[1:]):
                    yield self.take()
            else:  # pragma: no cover - a new event without its handler
                raise RuntimeError(f"unknown native event {ev!r}")

    def _section(self, reader, buf, pos, nxt, ulen, section_logical, cut_reason):
        """Decompress/decrypt one section in Python (as ``SegmentReader`` does) and hand its bytes to the walker."""
        from cdc_lib.errors import CdcError
        payload = bytes(buf[pos + 12:min(nxt, len(buf))])
        if cut_reason is not None:
            data, reason = reader.torn_section_bytes(payload, ulen, cut_reason)
            self.dec.feed_section(data, reason)
            return
        try:
            data = reader.section_bytes(payload, ulen)
        except CdcError as e:
            self.dec.skip_section()
            self.entries.damage(reader.section_failed(buf, pos, nxt, section_logical, e))
            return
        self.dec.feed_section(data)

    def _entry(self, reader, start, position, data, native_failed) -> bool:
        """One entry the walker left to Python; True when the batch is then full."""
        from cdc_lib.commitlog.segment import LogEntry
        h = reader.header
        rec = LogEntry(reader.name, h.id, start, position, data, h.version)
        dec = self.dec
        dec.entry_index += self.entries.handle(rec, self.cells, dec.entry_index, try_fast=False,
                                               fast_failed=native_failed)
        return dec.rows >= self.batch_rows
