"""The compiled state engine behind ``state.batch``: one table's batch over Arrow, with no Python work per change.

``cdc_native.process_table`` (``native/src/state``) does for a table what ``batch.process_table`` and
``sinks.delta.change_rows`` do: it drops replica copies, reads the stored records of the touched partitions
(``reconcile.STATE_SCHEMA`` columns), sweeps expiries, applies each partition's mutations in write-time order,
computes the visible-row images, the events (their JSON envelope and content-hash id included) and the MERGE
source rows of the changed partitions, all over Arrow buffers.

The Python engine stays the single truth. The compiled one either gives exactly its answer or doubts: a
partition it is not sure of (a type or value it does not render, a clustering order it cannot decide, a record
kind it does not know) appends nothing, and the Python engine processes that partition here (raising the typed
error, if there is one). ``tests/test_state_native.py`` runs both on the property-test workloads and compares
every outbox and state byte.

Which path runs follows ``CASSANDRA_CDC_NATIVE`` (``celllog.native.use_native``), as the reader does. The engine
covers the batch sequence's plain case: a backfill's ``r`` events and scan horizons run in Python.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Optional

import pyarrow as pa
import pyarrow.compute as pc

from cdc_lib.celllog.native import compiled_module, use_native
from cdc_lib.celllog.schema import CELL_LOG_SCHEMA
from cdc_lib.cql.tokens import token as murmur3_token
from cdc_lib.errors import CdcError

from .batch import partition_order, process_partition
from .reconcile import STATE_SCHEMA, partition_from_records

EVENT_COLUMNS = ("event_id", "op", "key_json", "event_json")
# a table's events as the compiled engine gives them: the partition's index in publish order, the outbox's columns,
# then the partition's token and key and the event's number among its events
EVENTS_SCHEMA = pa.schema([("partition", pa.int32()), *((n, pa.string()) for n in EVENT_COLUMNS),
                           ("ts_us", pa.int64()), ("token", pa.int64()), ("partition_key", pa.binary()),
                           ("idx", pa.int64())])


class NotCompiled(CdcError):
    """The compiled engine cannot take a table (a type it does not know, a batch beyond 32-bit Arrow offsets):
    the caller runs it in Python (``python_table``)."""


def type_desc(t) -> tuple:
    """A CQL type as the compiled engine reads it: (kind, fixed length, multicell, subtypes, field names,
    dimension)."""
    return (t.kind, t.fixed_length if t.kind == "custom" else None, bool(t.multicell),
            [type_desc(s) for s in t.subtypes], list(getattr(t, "field_names", None) or ()),
            int(getattr(t, "dimension", None) or 0))


def table_desc(table) -> tuple:
    """(id, keyspace, name, [(column, kind, type, reversed)] in ``table.columns`` order, [(dropped column, type,
    drop time)])."""
    cols = [(c.name, c.kind, type_desc(c.type), bool(c.reversed)) for c in table.columns.values()]
    return (str(table.id), table.keyspace, table.name, cols,
            [(n, type_desc(d.type), int(d.dropped_time)) for n, d in table.dropped.items()])


def supports(table) -> bool:
    """Whether the compiled engine can take ``table``: its key columns listed in key order, and no column mask
    (Cassandra 5's ``MASKED WITH``: the events carry masked values, ``cql.masks``, which the compiled engine does
    not render)."""
    if any(c.mask is not None for c in table.columns.values()):
        return False
    keys = [c.name for c in table.columns.values() if c.kind == "partition_key"]
    ck = [c.name for c in table.columns.values() if c.kind == "clustering"]
    return keys == [c.name for c in table.partition_key] and ck == [c.name for c in table.clustering]


def available() -> bool:
    """Whether the compiled engine is installed."""
    return hasattr(compiled_module(), "process_table")


def enabled() -> bool:
    """Whether the compiled engine runs (``CASSANDRA_CDC_NATIVE``; an error when it is 1 without the module)."""
    return use_native() and available()


@dataclass
class TableBatch:
    """One table's batch from the compiled engine, with the partitions it left to the Python engine."""
    keys: pa.Array                  # the partition keys in publish order (binary)
    tokens: pa.Array                # their tokens (int64)
    events: pa.Table                # partition (index into keys), event_id, op, key_json, event_json, ts_us, token,
                                    # partition_key, idx (the event's number within its partition)
    state_rows: Optional[pa.Table]  # MERGE source rows of the changed partitions the compiled engine did
    changed: int                    # partitions written back (both engines)
    python: dict = field(default_factory=dict)   # index into keys -> PartitionResult of the Python engine


def _buffer(b) -> Optional[pa.Buffer]:
    return None if b is None else pa.py_buffer(b)


def _array(spec, typ: pa.DataType) -> pa.Array:
    """An Arrow array from the engine's buffers (``out_spec`` in native/src/lib.rs), without a copy."""
    length, nulls, validity, buffers, children = spec
    if pa.types.is_struct(typ):
        children = [_array(c, typ.field(i).type) for i, c in enumerate(children)]
    elif pa.types.is_map(typ):
        children = [_array(children[0], pa.struct([typ.key_field, typ.item_field]))]
    elif pa.types.is_list(typ):
        children = [_array(children[0], typ.value_type)]
    return pa.Array.from_buffers(typ, length, [_buffer(validity), *map(_buffer, buffers)], null_count=nulls,
                                 children=children or None)


def default_threads() -> int:
    """The cores this process may run on: the compiled engine spreads a table's partitions over them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def process_table(table, cell_log, stored: pa.Table, now: int, *, state_schema: pa.Schema,
                  prev_now: Optional[int] = None, expiring: Iterable[bytes] = (), cluster: str = "",
                  batch_seq: int = 0, threads: Optional[int] = None, grouping: Any = None) -> TableBatch:
    """``batch.process_table`` plus ``sinks.delta.change_rows`` for one table, compiled.

    ``cell_log``: the table's records (``CELL_LOG_SCHEMA``, a table or batch); ``stored``: the stored records
    of every partition with records or in ``expiring`` (``STATE_SCHEMA`` column names); ``state_schema``: the
    MERGE source schema the state rows are built in (``sinks.delta.merge_source_schema``). ``threads``: how
    many threads the partitions are spread over (default: every core this process may use; a Spark task, which
    shares the cores with its sibling tasks, passes 1). ``grouping``: ``partition_keys(cell_log).grouping``, to
    group the records as it did (ignored, and the records sorted again, if it was made from other record
    batches). The GIL is released meanwhile.
    """
    log = _as_table(cell_log, CELL_LOG_SCHEMA)
    st = _as_table(stored.select(STATE_SCHEMA.names), STATE_SCHEMA)
    expiring = list(expiring)
    try:
        # the cell log's and the stored records' batches as they are: joining them would copy every column first
        out = compiled_module().process_table(table_desc(table), log.to_batches(), stored_batches(st), expiring, now,
                                              prev_now, batch_seq, cluster, threads or default_threads(), grouping)
    except ValueError as e:
        raise NotCompiled(f"{table.qualified_name}: {e}") from e
    keys = _array(out["keys"], pa.binary())
    tokens = pa.Array.from_buffers(pa.int64(), len(keys), [None, pa.py_buffer(out["tokens"])])
    events, states, doubted, changed = [], [], [], 0
    for run in out["runs"]:        # one per thread: Arrow chunks of the batch, joined without a copy
        n = len(run["event_partition"]) // 4
        int64 = lambda name: pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(run[name])])  # noqa: E731
        events.append(pa.record_batch({
            "partition": pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(run["event_partition"])]),
            **{name: _array(run[name], pa.string()) for name in EVENT_COLUMNS},
            "ts_us": int64("event_ts_us"), "token": int64("event_token"),
            "partition_key": _array(run["event_partition_key"], pa.binary()), "idx": int64("event_idx"),
        }, schema=EVENTS_SCHEMA))
        states.append(pa.RecordBatch.from_arrays([_array(spec, f.type) for spec, f in zip(run["state"], state_schema)],
                                                 schema=state_schema))
        doubted += run["doubted"]
        changed += run["changed"]
    result = TableBatch(keys, tokens, pa.Table.from_batches(events, schema=EVENTS_SCHEMA),
                        pa.Table.from_batches(states, schema=state_schema), changed)
    if doubted:
        result.python = _python_partitions(table, log, st, list(zip(keys.take(doubted).to_pylist(),
                                                                    tokens.take(doubted).to_pylist())),
                                           doubted, now, prev_now, cluster)
        result.changed += sum(1 for r in result.python.values() if r.changed)
    return result


class PartitionKeys(NamedTuple):
    """``partition_keys``' answer."""
    keys: pa.Array
    """binary, in publish order"""
    tokens: pa.Array
    """int64, one per key: keys that share a token each carry it"""
    grouping: Any = None
    """how the compiled engine grouped the records (``cdc_native.Grouping``), for ``process_table`` on the same
    cell log, which then does not sort them again; None from the Arrow path"""


def partition_keys(cell_log, threads: Optional[int] = None) -> PartitionKeys:
    """The distinct partitions of a table's cell-log records (a table or batch with ``partition_key`` and
    ``token``), in publish order (``batch.partition_order``: token, then key): the partitions a batch reads the
    stored records of.

    Compiled where the engine runs: one sort of the records, the grouping ``process_table`` needs, which it is
    handed (``grouping=``) instead of sorting them a second time. Hashing every record's key and token into
    sets, as ``pyarrow.compute.unique`` does, took a tenth of a 1M-change batch's reconcile time. Without the
    compiled engine, Arrow groups and sorts them. ``threads``: as ``process_table``'s.
    """
    t = cell_log if isinstance(cell_log, pa.Table) else pa.Table.from_batches([cell_log])
    pks, tokens = t.column("partition_key").cast(pa.binary()), t.column("token").cast(pa.int64())
    if enabled():
        keys, toks, grouping = compiled_module().partition_keys(pks.chunks, tokens.chunks, threads or default_threads())
        keys = _array(keys, pa.binary())
        return PartitionKeys(keys, pa.Array.from_buffers(pa.int64(), len(keys), [None, pa.py_buffer(toks)]),
                             grouping)
    distinct = (pa.table({"token": tokens, "key": pks}).group_by(["token", "key"]).aggregate([])
                .sort_by([("token", "ascending"), ("key", "ascending")]))
    return PartitionKeys(distinct.column("key").combine_chunks(), distinct.column("token").combine_chunks())


def python_table(table, cell_log, stored: pa.Table, now: int, *, prev_now: Optional[int] = None,
                 expiring: Iterable[bytes] = (), cluster: str = "") -> TableBatch:
    """``process_table``'s answer from the Python engine alone (every partition in ``TableBatch.python``)."""
    log = _as_table(cell_log, CELL_LOG_SCHEMA)
    st = _as_table(stored.select(STATE_SCHEMA.names), STATE_SCHEMA)
    tokens = dict(zip(log.column("partition_key").to_pylist(), log.column("token").to_pylist()))
    for pk in expiring:
        tokens.setdefault(pk, murmur3_token(pk))
    keys = sorted(tokens.items(), key=lambda kv: partition_order(kv[1], kv[0]))
    result = TableBatch(pa.array([k for k, _ in keys], pa.binary()), pa.array([t for _, t in keys], pa.int64()),
                        EVENTS_SCHEMA.empty_table(), None, 0)
    result.python = _python_partitions(table, log, st, keys, list(range(len(keys))), now, prev_now, cluster)
    result.changed = sum(1 for r in result.python.values() if r.changed)
    return result


def _as_table(data, schema: pa.Schema) -> pa.Table:
    t = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    return t if t.schema == schema else t.cast(schema)


def stored_batches(stored: pa.Table) -> list:
    """The stored rows' record batches as the compiled engine takes them: as they are, unless there are too many
    to number (it knows a record by a 32-bit number, its batch in the high bits and its row in the low ones
    below the longest batch's length); then joined into one."""
    batches = stored.to_batches()
    longest = max((b.num_rows for b in batches), default=0)
    if len(batches) << longest.bit_length() >= 2 ** 32 - 1:
        batches = stored.combine_chunks().to_batches()
    return batches


def _python_partitions(table, log: pa.Table, stored: pa.Table, keys: list, indexes: list, now: int,
                       prev_now: Optional[int], cluster: str) -> dict:
    """The Python engine's results for the partitions the compiled one doubted."""
    wanted = pa.array([k for k, _ in keys], pa.binary())
    recs: dict = {}
    for r in log.filter(pc.is_in(log.column("partition_key"), value_set=wanted)).to_pylist():
        recs.setdefault(r["partition_key"], []).append(r)
    rows: dict = {}
    for r in stored.filter(pc.is_in(stored.column("partition_key"), value_set=wanted)).to_pylist():
        rows.setdefault(r["partition_key"], []).append(r)
    out = {}
    for i, (pk, token) in zip(indexes, keys):
        prior = partition_from_records(rows[pk]) if pk in rows else None
        out[i] = process_partition(table, pk, token, recs.get(pk, []), prior, now, prev_now=prev_now,
                                   cluster=cluster)
    return out


