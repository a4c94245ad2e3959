"""Rows of ``SELECT`` (values, ``WRITETIME()`` and ``TTL()`` as bytes) -> cell-log records.

``TableScan(table)`` says what to select from one table and turns the rows into records (``CELL_LOG_SCHEMA``),
so the state engine merges a scanned row exactly as it merges the same row read from a commit log or an SSTable.

What CQL shows of a row and what it does not, and what each record then carries:

* **Simple cells** (every column that is not a non-frozen collection or UDT): the value bytes, ``WRITETIME()``
  as the timestamp, and for an expiring cell the remaining ``TTL()`` as ``ttl`` and the read's time plus it as the
  expiry (``local_deletion_time``; exact to the second Cassandra counts TTLs in). The TTL the cell was written
  with is not shown by CQL: the remaining one stands in for it (it only matters to ``TTL()``, which then agrees).
* **Non-frozen sets, maps and UDTs**: one cell per element, its cell path the element (set), the key (map) or
  the field's number (UDT), exactly the paths Cassandra stores; on Cassandra 5.0 each element has its own
  ``WRITETIME()``/``TTL()`` (``element_times``). Before 5.0 CQL refuses ``WRITETIME()`` of such columns: their
  elements then get the lowest write time the row shows (the row's marker time, below), so any later write
  wins over them.
* **Non-frozen lists**: Cassandra keys list elements by time-based UUIDs that CQL never shows. A scanned list is
  therefore loaded as what CQL can tell: the list as it is, as a whole-list overwrite at its latest element's write
  time ``T`` (a collection deletion at ``T``, the elements at ``T + 1`` with their own TTLs), the elements under
  made-up UUIDs (``list_path``) between those Cassandra gives prepends (before 2010) and appends (now), in the
  list's order. So the commit log's copies of the elements the scan read (written at ``T`` or before: also those
  written before CDC was enabled that share a segment with CDC writes) are covered and never show twice, and
  appends, prepends and whole-list overwrites made after the scan land where they belong. What cannot be exact: a
  later update or removal of a scanned element by index or value names its real UUID, which the state does not
  have (the element stays); ``WRITETIME()`` of a loaded element is ``T + 1``.
* **Row marker** (``row_liveness``, what keeps a row with only null columns alive): CQL shows no marker and no
  time for it. Every scanned row gets one, at the lowest write time among its cells (where an ``INSERT`` puts it),
  expiring with the row's last cell when every cell of the row expires (``INSERT ... USING TTL``); a row that
  shows no timed cell at all (only its key) gets write time 0, below any real write, so any later deletion of
  the row wins. So a row that an ``UPDATE`` created (it has no marker in Cassandra) stays visible in the state with
  null columns after all its columns are set to null.
* **Statics**: once per partition and token range, on the partition's static row (``is_static``).
* **Tombstones**: none but a list's (above). A scan shows live data only; deletions made before the scan are
  already applied to what it reads, later ones come from the commit log.
* **Counters**: refused (``ScanError``). CQL shows a counter's total, not the per-node shards that the commit
  log's counter updates carry: merged with them, the shards already in the total would count twice.

Source columns of the records: ``segment`` names the scan (``source``), ``position`` and ``entry_index`` are the
row's number in the token range, ``seq`` the record's number within the row, ``mutation_id`` is null (no
commit-log entry: the state engine applies a partition's scanned records as one change).
"""
from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Optional

from cdc_lib.celllog.schema import (CELL_LOG_SCHEMA, KIND_CELL, KIND_COMPLEX_DELETION, KIND_ROW_LIVENESS,
                                   encode_clustering)
from cdc_lib.commitlog.model import NO_DELETION_TIME
from cdc_lib.cql.schema import REGULAR, STATIC
from cdc_lib.cql.tokens import token as murmur3_token
from cdc_lib.cql.types import read_length_prefixed
from cdc_lib.errors import CdcError, CqlValueError

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")

# Made-up list cell paths: version-1 UUIDs from Cassandra's list reference time (2010-01-01T00:00:00Z, where its
# prepends count back from and below any append), one 100 ns tick per element, fixed clock sequence and node.
_UUID_EPOCH_OFFSET = 0x01B21DD213814000          # 100-ns ticks from 1582-10-15 to 1970-01-01
LIST_PATH_BASE = 1262304000000 * 10_000 + _UUID_EPOCH_OFFSET
_LIST_PATH_NODE = 0x01CA55A4D5CA                  # multicast bit set: no real MAC address


class ScanError(CdcError):
    """A table cannot be scanned (counters), or a row is not what its columns say (names the table and key)."""


def list_path(index: int) -> bytes:
    """The made-up cell path of element ``index`` of a scanned non-frozen list (see the module docstring)."""
    t = LIST_PATH_BASE + index
    return uuid.UUID(fields=(t & 0xFFFFFFFF, (t >> 32) & 0xFFFF, (t >> 48) & 0x0FFF, 0x80, 0x00, _LIST_PATH_NODE),
                     version=1).bytes


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _length_prefixed(data: bytes, pos: int, count: Optional[int], what: str, kind: str) -> tuple[list, int]:
    """``read_length_prefixed`` of ``kind`` values, its error a ScanError naming the column and row (``what``)."""
    try:
        return read_length_prefixed(data, pos, count, kind, what)
    except CqlValueError as e:
        raise ScanError(e.reason) from None


def _elements(data: bytes, pairs: bool, what: str) -> list:
    """The elements of a serialized collection (i32 count, then i32-length-prefixed values; maps: key, value)."""
    if len(data) < 4:
        raise ScanError(f"{what}: truncated collection: {len(data)} bytes, no element count")
    count = _I32.unpack_from(data, 0)[0]
    out, pos = _length_prefixed(data, 4, count * (2 if pairs else 1), what, "collection")
    if pos != len(data):
        raise ScanError(f"{what}: {len(data) - pos} bytes after the last of {count} elements")
    return out


def _fields(data: bytes, what: str) -> list:
    """The fields of a serialized UDT value (i32-length-prefixed, as many as the bytes hold)."""
    return _length_prefixed(data, 0, None, what, "UDT field")[0]


@dataclass(frozen=True)
class _Column:
    name: str
    static: bool
    kind: str          # "simple", "list", "set", "map", "udt"
    timed: bool        # WRITETIME()/TTL() are selected for it


class TableScan:
    """What to ``SELECT`` from ``table`` and how its rows become cell-log records.

    ``element_times``: the cluster gives ``WRITETIME()``/``TTL()`` of non-frozen collections and UDTs per element
    (Cassandra 5.0 and later).
    """

    def __init__(self, table, *, element_times: bool = True):
        if table.is_counter or any(c.type.kind == "counter" for c in table.columns.values()):
            raise ScanError(f"{table.qualified_name} has counter columns: a CQL scan shows a counter's total, not "
                            "the per-node shards the commit log's counter updates are merged with (each old "
                            "shard would count twice at the next increment); load it with mode sstables")
        self.table = table
        self.table_id = str(table.id)
        self.keys = [c.name for c in table.partition_key + table.clustering]
        self.n_pk = len(table.partition_key)
        self.n_ck = len(table.clustering)
        cols = []
        for c in table.columns.values():
            if c.kind not in (REGULAR, STATIC) or c.name in table.dropped:
                continue        # key columns are selected above; a left-out column (capture rules) is not read
            kind = c.type.kind if c.type.multicell else "simple"
            if kind not in ("simple", "list", "set", "map", "udt"):
                raise ScanError(f"{table.qualified_name}.{c.name}: cannot scan a non-frozen {c.type.cql}")
            cols.append(_Column(c.name, c.kind == STATIC, kind, kind == "simple" or element_times))
        self.columns = cols
        select = [_quote(k) for k in self.keys]
        for c in cols:
            select.append(_quote(c.name))
            if c.timed:
                select += [f"WRITETIME({_quote(c.name)})", f"TTL({_quote(c.name)})"]
        pk = ", ".join(_quote(c.name) for c in table.partition_key)
        self.query = (f"SELECT {', '.join(select)} FROM {_quote(table.keyspace)}.{_quote(table.name)} "
                      f"WHERE token({pk}) > %s AND token({pk}) <= %s")

    def records(self, rows, now_s: int, source: str, first_row: int, out: "RecordColumns") -> None:
        """Append the records of ``rows`` (tuples of bytes/None in ``query``'s column order, read at ``now_s``) to
        ``out``; rows are numbered from ``first_row`` (their ``position``). Consecutive rows of one partition
        share its static row, written with the partition's first row."""
        n_pk, n_ck = self.n_pk, self.n_ck
        table = self.table
        for i, row in enumerate(rows):
            number = first_row + i
            pk_parts = row[:n_pk]
            if any(p is None for p in pk_parts):
                raise ScanError(f"{table.qualified_name}: row {number} of {source} has a null partition key")
            pk = pk_parts[0] if n_pk == 1 else b"".join(len(p).to_bytes(2, "big") + p + b"\x00" for p in pk_parts)
            new_partition = pk != out.last_pk
            if new_partition:
                out.last_pk, out.last_token = pk, murmur3_token(pk)
            ck_parts = row[n_pk:n_pk + n_ck]
            static_only = n_ck > 0 and all(v is None for v in ck_parts)
            if not static_only and any(v is None for v in ck_parts):
                raise ScanError(f"{table.qualified_name}: row {number} of {source} has a null clustering column")
            cells = []                  # (kind, static, column, path, value, timestamp or None, ttl, deletion time)
            pos = n_pk + n_ck
            for c in self.columns:
                value = row[pos]
                wt, ttl = (row[pos + 1], row[pos + 2]) if c.timed else (None, None)
                pos += 3 if c.timed else 1
                if value is None or (c.static and not new_partition) or (static_only and not c.static):
                    continue
                what = f"{table.qualified_name}.{c.name} (row {number} of {source})"
                for cell in self._cells(c, value, wt, ttl, now_s, what):
                    cells.append((cell[0], c.static, c.name) + cell[1:])
            live = [x for x in cells if x[0] == KIND_CELL]
            row_ts = min((x[5] for x in live if not x[1] and x[5] is not None), default=0)
            static_ts = min((x[5] for x in live if x[1] and x[5] is not None), default=0)
            clustering = encode_clustering(ck_parts) if n_ck and not static_only else b""
            base = (source, number, self.table_id, table.keyspace, table.name, pk, out.last_token)
            seq = 0
            for kind, static, name, path, value, ts, ttl, ldt in cells:
                if ts is None:           # an element without its own time (before Cassandra 5.0)
                    ts = static_ts if static else row_ts
                out.add(base, seq, b"" if static else clustering, static, kind, name, path, value, ts, ttl, ldt)
                seq += 1
            if static_only:
                continue
            regular = [x for x in live if not x[1]]
            if regular and all(x[6] for x in regular):      # every cell expires: the marker with the last one
                last = max(regular, key=lambda x: x[7])
                ttl, ldt = last[6], last[7]
            else:
                ttl, ldt = 0, NO_DELETION_TIME
            out.add(base, seq, clustering, False, KIND_ROW_LIVENESS, None, None, None, row_ts, ttl, ldt)

    def _cells(self, c: _Column, value: bytes, wt, ttl, now_s: int, what: str) -> list:
        """[(kind, path, value, timestamp, ttl, local deletion time)] of one column of one row; timestamp None for
        the elements of a column whose elements' times CQL does not give."""
        if c.kind == "simple":
            t = _I32.unpack(ttl)[0] if ttl is not None else 0
            return [(KIND_CELL, None, value, _I64.unpack(wt)[0], t, now_s + t if t else NO_DELETION_TIME)]
        if c.kind == "map":
            flat = _elements(value, True, what)
            elements = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        elif c.kind == "set":
            elements = [(e, b"") for e in _elements(value, False, what)]
        elif c.kind == "list":
            elements = [(list_path(i), e) for i, e in enumerate(_elements(value, False, what))]
        else:
            elements = [(_I16.pack(i), f) for i, f in enumerate(_fields(value, what))]
        if not c.timed:
            return [(KIND_CELL, path, v, None, 0, NO_DELETION_TIME) for path, v in elements if v is not None]
        wts = _elements(wt, False, what + " WRITETIME") if wt is not None else []
        ttls = _elements(ttl, False, what + " TTL") if ttl is not None else [None] * len(wts)
        if len(wts) != len(elements) or len(ttls) != len(elements):
            raise ScanError(f"{what}: {len(elements)} elements but {len(wts)} WRITETIME and {len(ttls)} TTL values")
        out = []
        for (path, v), w, t in zip(elements, wts, ttls):
            if v is None:
                continue                                # a UDT field without a cell
            if w is None:
                raise ScanError(f"{what}: an element without a WRITETIME")
            t = _I32.unpack(t)[0] if t is not None else 0
            out.append((KIND_CELL, path, v, _I64.unpack(w)[0], t, now_s + t if t else NO_DELETION_TIME))
        if c.kind == "list" and out:
            # the whole list, as an overwrite at its latest write time (module docstring)
            latest = max(x[3] for x in out)
            out = [(KIND_COMPLEX_DELETION, None, None, latest, 0, now_s)] + \
                  [(kind, path, v, latest + 1, t, ldt) for kind, path, v, _, t, ldt in out]
        return out


_FIELDS = [f.name for f in CELL_LOG_SCHEMA]


class RecordColumns:
    """Cell-log records collected column by column, handed out as Arrow batches (``CELL_LOG_SCHEMA``). Keeps the
    partition key of the last row added (a partition's rows come together in a scan)."""

    def __init__(self):
        self.columns = {name: [] for name in _FIELDS}
        self.last_pk: Optional[bytes] = None
        self.last_token = 0

    def __len__(self) -> int:
        return len(self.columns["kind"])

    def add(self, base: tuple, seq: int, clustering: bytes, is_static: bool, kind: str, column, path, value,
            timestamp: int, ttl: int, local_deletion_time: int) -> None:
        source, number, table_id, keyspace, table, pk, token = base
        c = self.columns
        c["segment"].append(source)
        c["segment_id"].append(0)
        c["position"].append(number)
        c["entry_index"].append(number)
        c["seq"].append(seq)
        c["table_id"].append(table_id)
        c["keyspace"].append(keyspace)
        c["table"].append(table)
        c["partition_key"].append(pk)
        c["token"].append(token)
        c["clustering"].append(clustering)
        c["clustering_end"].append(None)
        c["start_inclusive"].append(None)
        c["end_inclusive"].append(None)
        c["is_static"].append(is_static)
        c["kind"].append(kind)
        c["column"].append(column)
        c["path"].append(path)
        c["value"].append(value)
        c["timestamp"].append(timestamp)
        c["ttl"].append(ttl)
        c["local_deletion_time"].append(local_deletion_time)
        c["mutation_id"].append(None)

    def take(self):
        """The records added since the last ``take``, as one Arrow batch."""
        import pyarrow as pa
        batch = pa.RecordBatch.from_pydict(self.columns, schema=CELL_LOG_SCHEMA)
        self.columns = {name: [] for name in _FIELDS}
        return batch
