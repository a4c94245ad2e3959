"""The compiled state engine (``cdc_lib.state.native``) against the Python engine, byte for byte.

The property tests' workloads run batch by batch through both engines from the same stored state: random schemas,
every mutation kind, three replicas shuffled and cut into batches, ``now`` moving so that TTLs expire between
batches, and (in two tests) a column dropped and re-added inside the workload or unknown to the schema the engines
are given. Every batch must give the same outbox
rows (event id, op, key JSON, event JSON, write time, in publish order) and the same MERGE source rows (typed
columns and every ``_cdc_*`` column). The Python engine's answers are checked against the reference model by
``test_state_properties.py``; this file checks that the compiled one gives the same answers, or hands a partition
back. A table with a column mask never reaches the compiled engine (it does not render masks).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import random
import uuid
from unittest import mock

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from celllog_diff import require
from hypothesis import given, settings
from hypothesis import strategies as st
from test_state_properties import Gen, make_table
from test_state_rules import PK as RULES_PK
from test_state_rules import make_table as make_rules_table

from cdc_lib.celllog.records import mutation_records
from cdc_lib.celllog.schema import CELL_LOG_SCHEMA
from cdc_lib.commitlog.model import Cell, DeletionTime, LivenessInfo, Mutation, PartitionUpdate, Row
from cdc_lib.commitlog.mutation import finish_update
from cdc_lib.cql.schema import REGULAR, STATIC, ColumnMask, ColumnMetadata, DroppedColumn, TableMetadata
from cdc_lib.cql.tokens import token as murmur3_token
from cdc_lib.cql.types import encode_counter_context, parse_type
from cdc_lib.sinks.delta import (EVENT_FIELDS, META_PREFIX, change_rows, merge_source_schema, outbox_row,
                                 rows_to_arrow, table_outputs)
from cdc_lib.state import native
from cdc_lib.state.batch import process_table
from cdc_lib.state.reconcile import STATE_SCHEMA, partition_to_records

ROW_KEY = ("_cdc_partition_key", "_cdc_row_kind", "_cdc_clustering")


@pytest.fixture(autouse=True)
def _compiled(monkeypatch):
    """The compiled engine's tests: skipped without it, and with ``CASSANDRA_CDC_NATIVE`` pinned to it, so that a
    run of the suite on the Python path (``CASSANDRA_CDC_NATIVE=0``) does not turn the compiled steps these tests
    call in turn (``partition_keys``' grouping, handed to ``process_table``) into Arrow's."""
    require("native")
    monkeypatch.setenv("CASSANDRA_CDC_NATIVE", "1")


def _stored_rows(table, states: dict, keys) -> pa.Table:
    """The stored rows of ``keys`` as a state table holds them (metadata columns)."""
    recs = [r for pk in sorted(keys) if pk in states for r in partition_to_records(pk, states[pk])]
    t = pa.Table.from_pylist(recs, schema=STATE_SCHEMA)
    return t.rename_columns([META_PREFIX + n for n in t.column_names])


def _batches(seed: int, counter: bool, dropped: bool = False, unknown: bool = False):
    rng = random.Random(seed)
    table = make_table(rng, counter)
    if dropped:     # one non-key column dropped and re-added at time 6: its cells written at or before it are gone
        c = rng.choice([c for c in table.columns.values() if c.kind in (REGULAR, STATIC)])
        table = dataclasses.replace(table, dropped={c.name: DroppedColumn(c.name, c.type, 6, c.kind)})
    gen = Gen(rng, table)
    mutations = [gen.mutation() for _ in range(rng.randint(5, 40))]
    if unknown:     # the data names a column the engines' schema lacks (dropped before it), first by name
        gone = min(c.name for c in table.columns.values() if c.kind == REGULAR)
        table = dataclasses.replace(table, columns={n: c for n, c in table.columns.items() if n != gone})
    copies = [Mutation(m.updates, f"CommitLog-7-{replica}.log", replica, 100 + i, mutation_id=m.mutation_id)
              for replica in range(3) for i, m in enumerate(mutations)]
    rng.shuffle(copies)
    cuts = sorted(rng.sample(range(1, len(copies)), rng.randint(1, 6)))
    return rng, table, [copies[a:b] for a, b in zip([0] + cuts, cuts + [len(copies)])]


def compare_engines(seed: int, counter: bool = False, threads: int = 3, dropped: bool = False,
                    unknown: bool = False) -> dict:
    """Run one workload through both engines (the compiled one on ``threads`` threads, so that its partitions are
    split between threads and their outputs joined); assert equal outputs after every batch. Returns counts."""
    rng, table, batches = _batches(seed, counter, dropped, unknown)
    return compare_batches(table, batches, rng, threads, f"seed {seed}")


def compare_batches(table, batches, rng: random.Random, threads: int = 3, label: str = "") -> dict:
    """``compare_engines`` on given batches of mutations (``now`` moves on by ``rng``)."""
    states: dict = {}
    now, prev = 100, None
    seen = {"events": 0, "rows": 0, "python partitions": 0}
    for i, batch in enumerate(batches):
        records = [r for j, m in enumerate(batch) for r in mutation_records(m, j)]
        keys = {r["partition_key"] for r in records}
        expiring = [k for k in states if k not in keys] if prev is not None else []
        results = process_table(table, records, states, now, prev_now=prev, expiring=expiring)
        want_events = [{f: row[f] for f in EVENT_FIELDS}
                       for row in (outbox_row(table, e, "", 0, 0) for r in results for e in r.events)]
        want_rows = rows_to_arrow(table, [row for r in results if r.changed for row in
                                          change_rows(table, r.partition_key, r.prior, r.state, now, 9, r.token)])
        log = pa.Table.from_pylist(records, schema=CELL_LOG_SCHEMA)
        if i % 4 == 3:      # as the Spark job's shuffle hands a chunk over: in token order (a stable sort)
            log = log.take(pc.sort_indices(log, [("token", "ascending")]))
        # every other batch as the pipeline runs it: grouped by partition_keys, the grouping handed on
        grouping = native.partition_keys(log).grouping if i % 2 == 0 else None
        stored = _stored_rows(table, states, keys | set(expiring))
        if i % 3 != 2:      # the stored rows in record batches of 1 to 3 (as a Delta read gives them, in several):
            # a partition's records then run across batches, which the engine reads where they are
            stored = pa.Table.from_batches(stored.to_batches(max_chunksize=rng.randint(1, 3)), schema=stored.schema)
        with compiled_calls() as calls:
            events, source, changed = table_outputs(table, log, stored, now,
                                                    prev_now=prev, expiring=expiring, batch_seq=9, threads=threads,
                                                    grouping=grouping)
        # the partitions the compiled engine left to the Python engine (no call: all of them)
        seen["python partitions"] += sum(len(tb.python) for tb in calls) if calls else len(keys | set(expiring))
        where = f"{label}, batch {i}"
        assert events.select(list(EVENT_FIELDS)).to_pylist() == want_events, where
        assert events.column("partition_key").to_pylist() == [r.partition_key for r in results for _ in r.events]
        assert events.column("idx").to_pylist() == [j for r in results for j in range(len(r.events))]
        assert source.schema == merge_source_schema(table)
        assert source.sort_by([(k, "ascending") for k in ROW_KEY]).to_pylist() == \
            want_rows.sort_by([(k, "ascending") for k in ROW_KEY]).to_pylist(), where
        assert changed == sum(1 for r in results if r.changed), where
        seen["events"] += events.num_rows
        seen["rows"] += source.num_rows
        for r in results:
            states[r.partition_key] = r.state
        prev, now = now, now + rng.randint(0, 12)
    return seen


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2 ** 32))
def test_compiled_engine_equals_python_engine(seed):
    compare_engines(seed)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32))
def test_compiled_engine_equals_python_engine_on_counters(seed):
    compare_engines(seed, counter=True, threads=1)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32))
def test_compiled_engine_equals_python_engine_with_a_dropped_and_re_added_column(seed):
    compare_engines(seed, dropped=True)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32))
def test_compiled_engine_equals_python_engine_on_data_of_a_column_unknown_to_the_schema(seed):
    # the unknown column sorts before the known ones: the engine's column ids no longer follow names
    assert compare_engines(seed, unknown=True)["python partitions"] == 0


def _rules_mutation(table, i: int, row) -> Mutation:
    """The ``i``-th mutation of one segment: ``row`` in ``test_state_rules``' partition of ``table``."""
    u = finish_update(PartitionUpdate(table.id, RULES_PK, table, unfiltereds=[row]))
    return Mutation([u], "CommitLog-7-1.log", 1, 100 + i, mutation_id=bytes([i]) * 16)


def test_compiled_engine_keeps_the_counter_shards_a_later_deletion_uncovers():
    """A shard with clock 3 at ts 10 and one with clock 2 at ts 30 (both kept), then a row deletion at ts 20 in the
    next batch: the clock-2 shard shows (n = 9), an update event from 12, in both engines (the rule itself:
    ``test_state_rules.py``, the deletion that uncovers a lower-clocked counter shard)."""
    table = make_rules_table(counter=True)
    clustering = (table.clustering[0].type.encode(1),)


    def increment(ts, clock, count):
        ctx = encode_counter_context([(uuid.UUID(int=1), clock, count, "global")])
        return Row(clustering, cells=[Cell("n", ctx, ts)])
    batches = [[_rules_mutation(table, 0, increment(10, 3, 12)), _rules_mutation(table, 1, increment(30, 2, 9))],
               [_rules_mutation(table, 2, Row(clustering, deletion=DeletionTime(20, 5)))]]
    seen = compare_batches(table, batches, random.Random(0), threads=1, label="counter shards")
    assert seen["events"] == 2      # c (n = 12), then u (12 -> 9)


def test_a_counter_write_of_no_shard_on_a_stored_row_is_written_back_as_the_python_engine_writes_it():
    """A counter cell whose context holds no shard, on a stored row without that counter: both engines leave an
    empty entry for the column, which shows in no image (no event), and the partition changed, so its state rows
    are written back. The compiled engine keeps no copy of the stored state to compare with: it must learn of the
    change from applying the record (``Changed::Silently``)."""
    table = make_rules_table(counter=True)
    clustering = (table.clustering[0].type.encode(1),)

    batches = [[_rules_mutation(table, 0, Row(clustering, liveness=LivenessInfo(10)))],
               [_rules_mutation(table, 1, Row(clustering, cells=[Cell("n", encode_counter_context([]), 20)]))]]
    # seed 10: `now` stays where it was for the second batch, so no TTL sweep makes the partition count as changed
    seen = compare_batches(table, batches, random.Random(10), threads=1, label="counter of no shard")
    assert seen["events"] == 1      # the row's creation; the empty counter shows nowhere
    assert seen["rows"] == 2        # the row written by each batch
    assert seen["python partitions"] == 0


def _on_one_thread_and_on_two(table, log: pa.Table) -> tuple:
    """The compiled engine's answers for ``log`` with no stored state: on one thread, and on two."""
    return tuple(native.process_table(table, log, pa.Table.from_pylist([], schema=STATE_SCHEMA), 100,
                                      state_schema=merge_source_schema(table), threads=threads) for threads in (1, 2))


def test_a_batch_of_a_few_wide_partitions_is_spread_over_the_threads_and_joins_as_one_thread_gives_it():
    """Three partitions of 12,000 rows each (a wide-row table's batch: few partitions, many records) are cut
    between the compiled engine's threads by records, not by partitions (it was one thread's work while a run
    had to hold 4,096 partitions); the joined outputs are one thread's, row for row and in publish order."""
    table = make_rules_table()
    ck_type, v_type = table.clustering[0].type, table.columns["v"].type
    mutations = []
    for p in range(3):
        pk = table.partition_key[0].type.encode(p)
        for i in range(12_000):
            row = Row((ck_type.encode(i),), cells=[Cell("v", v_type.encode(i), 10)])
            u = finish_update(PartitionUpdate(table.id, pk, table, unfiltereds=[row]))
            mutations.append(Mutation([u], "CommitLog-7-1.log", 1, 100 + len(mutations),
                                      mutation_id=len(mutations).to_bytes(16, "big")))
    log = pa.Table.from_pylist([r for j, m in enumerate(mutations) for r in mutation_records(m, j)],
                               schema=CELL_LOG_SCHEMA)
    one, two = _on_one_thread_and_on_two(table, log)
    assert one.events.column("event_id").num_chunks == 1 and two.events.column("event_id").num_chunks >= 2
    assert not one.python and not two.python
    assert two.events.num_rows == 36_000 and two.events.to_pylist() == one.events.to_pylist()
    assert two.state_rows.to_pylist() == one.state_rows.to_pylist() and two.changed == one.changed == 3
    assert [p for p, _ in itertools.groupby(two.events.column("partition").to_pylist())] == [0, 1, 2]


def test_a_batch_of_many_narrow_partitions_is_cut_into_many_runs_and_joins_as_one_thread_gives_it():
    """50,000 partitions of two rows each (100,000 records, a record a row): the threads take many runs of
    partitions in turn (more than two each, so that a core the machine slows down for a while leaves the other
    idle for less), and the joined outputs are one thread's, row for row and in publish order."""
    table = make_rules_table()
    pk_type, ck_type, v_type = table.partition_key[0].type, table.clustering[0].type, table.columns["v"].type
    rows = [Row((ck_type.encode(ck),), cells=[Cell("v", v_type.encode(7), 10)]) for ck in (1, 2)]
    template = mutation_records(Mutation([finish_update(PartitionUpdate(table.id, pk_type.encode(0), table,
                                                                        unfiltereds=rows))],
                                         "CommitLog-7-1.log", 1, 100, mutation_id=bytes(16)), 0)
    assert len(template) == 2
    records = []
    for p in range(50_000):
        pk = pk_type.encode(p)
        records += [{**r, "partition_key": pk, "token": murmur3_token(pk), "entry_index": p, "position": 100 + p,
                     "mutation_id": p.to_bytes(16, "big")} for r in template]
    log = pa.Table.from_pylist(records, schema=CELL_LOG_SCHEMA)
    one, two = _on_one_thread_and_on_two(table, log)
    assert one.events.column("event_id").num_chunks == 1 and two.events.column("event_id").num_chunks > 4
    assert two.events.num_rows == 100_000 and two.events.to_pylist() == one.events.to_pylist()
    assert two.state_rows.to_pylist() == one.state_rows.to_pylist() and two.changed == one.changed == 50_000
    assert two.events.column("partition").to_pylist() == sorted(list(range(50_000)) * 2)


@contextlib.contextmanager
def compiled_calls():
    """The compiled engine's answers (``TableBatch``) while the block runs, in a list."""
    calls = []
    real = native.process_table

    def spy(*a, **k):
        calls.append(real(*a, **k))
        return calls[-1]
    with mock.patch.object(native, "process_table", spy):
        yield calls


def test_the_installed_engine_times_no_phases():
    """Phase times (``benchmarks/engine_phases.py``) are a build of their own: the module the package runs reads
    no clock in its hot loop."""
    import cdc_native
    assert cdc_native.phase_times() is None


def test_engine_ab_times_builds_in_turn_and_refuses_one_that_answers_differently(capsys, monkeypatch):
    """``benchmarks/engine_ab.py`` compares builds only when their outputs are equal: a build whose events differ
    from the first's fails the run before any build is timed. The timed calls run in turn (A B, then B A), each
    in a process of its own that loads one build and reads the batch the run wrote."""
    import importlib.util
    monkeypatch.setenv("CASSANDRA_CDC_NATIVE", "1")       # engine_ab sets it; restored after the test
    path = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "engine_ab.py")
    spec = importlib.util.spec_from_file_location("engine_ab", path)
    engine_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine_ab)
    from cdc_lib.celllog import native as celllog_native
    args = ["installed", "installed", "--changes", "3000", "--pairs", "2", "--calls", "2"]
    real_timed, timed = engine_ab.timed, []

    def counted(build, *rest):
        # the CPU seconds a timed call reports: its number (1 to 4); the process and its calls are real
        wall, _ = real_timed(build, *rest)
        timed.append(build)
        return wall, float(len(timed))
    monkeypatch.setattr(engine_ab, "timed", counted)
    before = celllog_native._native
    assert engine_ab.main(args) == 0
    out = capsys.readouterr().out
    assert "outputs: equal" in out and out.count("round by round: median") == 2
    # once each a round, in turn (A B, then B A): a build named twice is timed as two, the second's calls 2 and 3
    # against the first's 1 and 4
    assert len(timed) == 2 * 2
    assert "installed: CPU median 2.500 s" in out and "median 1.375 (range 0.750-2.000)" in out
    assert celllog_native._native is before

    calls, real = [], engine_ab.call

    def second_differs(module, *rest):
        wall, cpu, (events, source, changed) = real(module, *rest)
        calls.append(module)
        return wall, cpu, (events.slice(1) if len(calls) == 2 else events, source, changed)
    monkeypatch.setattr(engine_ab, "call", second_differs)
    assert engine_ab.main(args) == 1
    captured = capsys.readouterr()
    assert "answers differently" in captured.err and "round by round" not in captured.out
    assert len(calls) == 2


def test_the_comparison_sees_events_and_rows_from_the_compiled_engine():
    """The workloads give the compiled engine real work: events and rows, not partitions handed back."""
    with compiled_calls() as calls:
        seen = [compare_engines(seed) for seed in range(8)]
    assert sum(s["events"] for s in seen) > 100 and sum(s["rows"] for s in seen) > 100
    assert sum(tb.events.num_rows for tb in calls) == sum(s["events"] for s in seen)
    assert not any(tb.python for tb in calls)


def _cell(table, k: int, column: str, value: bytes, seq: int = 0) -> dict:
    """A cell-log record: the value of ``column`` in partition ``k`` (an int key), written at time 10 by the k-th
    mutation of one segment."""
    pk, position = k.to_bytes(4, "big"), 100 + k
    return {"segment": "CommitLog-7-1.log", "segment_id": 1, "position": position, "entry_index": k, "seq": seq,
            "table_id": str(table.id), "keyspace": table.keyspace, "table": table.name, "partition_key": pk,
            "token": murmur3_token(pk), "clustering": b"", "is_static": False, "kind": "cell", "column": column,
            "value": value, "timestamp": 10, "ttl": 0, "local_deletion_time": (1 << 31) - 1,
            "mutation_id": position.to_bytes(16, "big")}


def test_floats_and_doubles_are_written_as_python_writes_them():
    """Float and double columns in the events' JSON, byte for byte as the Python engine writes them: amounts and
    readings (which the compiled engine writes without formatting a float), every magnitude of float, and doubles
    that lie halfway between two shortest decimals, of which Python writes the one with the even last digit."""
    import struct

    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    table = load_cql_schema("CREATE TABLE ks.readings (k int PRIMARY KEY, f float, d double) "
                            "WITH ID = 0c6f3f52-8d0e-4b7e-9a51-3f3c2f6d7e11;").by_name("ks", "readings")
    rng = random.Random(5)
    floats = [struct.pack(">f", x) for x in [k / 100 for k in range(0, 100_000, 7)]
              + [k * 0.0137 - 50 for k in range(0, 10_000, 3)] + [1e-8, 1e-7, 9.999999e21, 1e22, 3.4028235e38]]
    floats += [b for b in (rng.getrandbits(32).to_bytes(4, "big") for _ in range(5000)) if b[0] & 0x7f != 0x7f]
    doubles = [struct.pack(">d", x) for x in [1059438285926254.25, -108868734838530.125, 0.1 + 0.2, 1e16, 5e-324]
               + [rng.randrange(10 ** 13, 10 ** 16) + rng.choice([0.125, 0.25, 0.75]) for _ in range(3000)]]
    doubles += [b for b in (rng.getrandbits(64).to_bytes(8, "big") for _ in range(5000)) if b[0] & 0x7f != 0x7f]

    log = pa.Table.from_pylist([_cell(table, k, "f", v) for k, v in enumerate(floats)]
                               + [_cell(table, k, "d", v, 1) for k, v in enumerate(doubles)], schema=CELL_LOG_SCHEMA)
    with compiled_calls() as calls:
        events, _, _ = table_outputs(table, log, _stored_rows(table, {}, ()), 100)
    assert calls and not any(tb.python for tb in calls)
    want = [{f: row[f] for f in EVENT_FIELDS} for row in
            (outbox_row(table, e, "", 0, 0) for r in process_table(table, log.to_pylist(), {}, 100) for e in r.events)]
    assert len(want) == max(len(floats), len(doubles))
    got = events.select(list(EVENT_FIELDS)).to_pylist()
    assert len(got) == len(want)
    wrong = [(g["event_json"], w["event_json"]) for g, w in zip(got, want) if g != w]
    assert not wrong, f"{len(wrong)} events differ, the first: {wrong[0]}"
    text = " ".join(e["event_json"] for e in got)
    assert '"d":1059438285926254.2' in text and '"d":-108868734838530.12' in text


def test_a_doubted_partition_is_done_by_the_python_engine_in_its_place():
    """A value the compiled engine does not render as Python does (a map whose keys decode equal, 0.0 and -0.0,
    which a Python dict merges into one) makes it hand that partition back; the outputs are still the Python
    engine's, the doubted partition in its place in publish order."""
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    table = load_cql_schema("CREATE TABLE ks.doubt (k int PRIMARY KEY, m frozen<map<double, int>>, n int) "
                            "WITH ID = 6d0c1e2a-93f4-4c1b-8f7a-2b5e9d3c4a10;").by_name("ks", "doubt")
    one = lambda b: len(b).to_bytes(4, "big") + b  # noqa: E731
    aliasing = ((2).to_bytes(4, "big") + one(b"\0" * 8) + one((1).to_bytes(4, "big"))
                + one(b"\x80" + b"\0" * 7) + one((2).to_bytes(4, "big")))

    # one mutation a partition: partition `bad`'s sets n and the map. Each partition in turn, so that the doubted
    # one comes at every place in publish order: the compiled engine hashes event ids in pairs, and the doubted
    # partition's event is now the first of a pair, now the second
    places = set()
    for bad in range(8):
        log = pa.Table.from_pylist([_cell(table, k, "n", k.to_bytes(4, "big")) for k in range(8)]
                                   + [_cell(table, bad, "m", aliasing, 1)], schema=CELL_LOG_SCHEMA)
        records = log.to_pylist()
        tb = native.process_table(table, log, pa.Table.from_pylist([], schema=STATE_SCHEMA), 100,
                                  state_schema=merge_source_schema(table))
        doubted = tb.keys.to_pylist().index(bad.to_bytes(4, "big"))
        places.add(doubted)
        assert sorted(tb.python) == [doubted] and tb.events.num_rows == len(tb.keys) - 1
        events, _, _ = table_outputs(table, log, _stored_rows(table, {}, ()), 100)
        want = [{f: row[f] for f in EVENT_FIELDS} for row in
                (outbox_row(table, e, "", 0, 0) for r in process_table(table, records, {}, 100) for e in r.events)]
        assert events.select(list(EVENT_FIELDS)).to_pylist() == want and len(want) == len(tb.keys)
        # the map shows one entry, as the dict Python decodes it into
        assert len(json.loads(events.column("event_json")[doubted].as_py())["after"]["m"]) == 1
    assert places == set(range(8))


def test_a_table_the_compiled_engine_cannot_take_runs_in_python(caplog):
    """A type kind the compiled engine does not know is a typed refusal (``NotCompiled``), and the table runs in
    Python with a warning naming it."""
    rng, table, batches = _batches(5, False)
    records = [r for j, m in enumerate(batches[0]) for r in mutation_records(m, j)]
    real_desc = native.table_desc

    def unknown_kind(t):
        tid, ks, name, cols, dropped = real_desc(t)
        cols = [(n, kind, ("newtype", None, False, [], [], 0) if kind == "regular" else ty, rev)
                for n, kind, ty, rev in cols]
        return tid, ks, name, cols, dropped
    with mock.patch.object(native, "table_desc", unknown_kind):
        with pytest.raises(native.NotCompiled, match="newtype"):
            native.process_table(table, pa.Table.from_pylist(records, schema=CELL_LOG_SCHEMA),
                                 pa.Table.from_pylist([], schema=STATE_SCHEMA), 100,
                                 state_schema=merge_source_schema(table))
        events, _, _ = table_outputs(table, pa.Table.from_pylist(records, schema=CELL_LOG_SCHEMA),
                                     _stored_rows(table, {}, ()), 100)
    want = [{f: row[f] for f in EVENT_FIELDS} for row in
            (outbox_row(table, e, "", 0, 0) for r in process_table(table, records, {}, 100) for e in r.events)]
    assert events.select(list(EVENT_FIELDS)).to_pylist() == want and want
    assert table.qualified_name in caplog.text and "Python" in caplog.text


def test_a_table_with_a_column_mask_runs_in_python_and_its_events_are_masked():
    """The compiled engine does not render Cassandra 5's column masks (``MASKED WITH``): a masked table takes the
    Python engine, whose events carry the masked values."""
    rng, table, batches = _batches(7, False)
    regular = next(c for c in table.columns.values() if c.kind == REGULAR and c.type.kind == "int")
    cols = {n: (ColumnMetadata(c.name, c.type, c.kind, c.position, c.reversed, ColumnMask("mask_null", ()))
                if c is regular else c) for n, c in table.columns.items()}
    masked = TableMetadata(table.keyspace, table.name, table.id, table.partition_key, table.clustering, cols,
                           flags=table.flags)
    assert native.supports(table) and not native.supports(masked)
    records = [r for batch in batches for j, m in enumerate(batch) for r in mutation_records(m, j)]
    with mock.patch.object(native, "process_table", side_effect=AssertionError("the compiled engine ran")):
        events, _, _ = table_outputs(masked, pa.Table.from_pylist(records, schema=CELL_LOG_SCHEMA),
                                     _stored_rows(masked, {}, ()), 100)
    want = [{f: row[f] for f in EVENT_FIELDS} for row in
            (outbox_row(masked, e, "", 0, 0) for r in process_table(masked, records, {}, 100) for e in r.events)]
    assert events.select(list(EVENT_FIELDS)).to_pylist() == want and want
    shown = [json.loads(e["event_json"])["after"] for e in want if json.loads(e["event_json"])["after"]]
    assert shown and all(row[regular.name] is None for row in shown)


def _key_log(pairs, chunk: int) -> pa.Table:
    """A cell log holding only (partition key, token) pairs, in record batches of ``chunk`` records."""
    t = pa.table({"partition_key": pa.array([k for k, _ in pairs], pa.binary()),
                  "token": pa.array([tok for _, tok in pairs], pa.int64())})
    return pa.Table.from_batches(t.to_batches(max_chunksize=chunk), schema=t.schema)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=3), st.integers(-3, 3)), max_size=60), st.integers(1, 7))
def test_partition_keys_are_the_distinct_partitions_in_publish_order(pairs, chunk):
    """The partitions a batch reads the stored records of: each (token, key) once, by token then key bytes, on
    both paths; the token range is small so that keys share tokens (as two keys can in Cassandra), and the records
    arrive in several record batches."""
    want = sorted({(tok, k) for k, tok in pairs})
    # as they come, and in token order (as the Spark job's shuffle hands a chunk over; keys sharing a token as
    # they come)
    for arrived in (pairs, sorted(pairs, key=lambda p: p[1])):
        for mode in ("1", "0"):
            with mock.patch.dict(os.environ, {"CASSANDRA_CDC_NATIVE": mode}):
                keys, tokens, grouping = native.partition_keys(_key_log(arrived, chunk))
            assert (grouping is None) == (mode == "0"), mode
            assert keys.type == pa.binary() and tokens.type == pa.int64(), mode
            assert list(zip(tokens.to_pylist(), keys.to_pylist())) == want, mode


def test_partition_keys_of_a_large_batch_on_several_threads_are_the_same():
    """A batch large enough for the compiled grouping to split its records between threads (by the tokens' top
    bits): 360,000 records of 180,000 keys, tokens over the whole range, every seventh key sharing the token of
    the key before it, each key in up to three places of several record batches. The same keys and tokens on one
    thread, on two, and by Arrow."""
    rng = random.Random(7)
    pairs, token = [], 0
    for i in range(180_000):
        if i % 7:                   # every seventh key shares the token of the key before it
            token = rng.randrange(-2 ** 63, 2 ** 63)
        pairs += [(i.to_bytes(4, "big")[rng.randrange(2):], token)] * rng.choice((1, 2, 3))
    rng.shuffle(pairs)
    want = sorted({(tok, k) for k, tok in pairs})
    got = {}
    # shuffled, and in token order with keys sharing a token as they come (the grouping takes those as they are)
    for order, arrived in (("shuffled", pairs), ("by token", sorted(pairs, key=lambda p: p[1]))):
        log = _key_log(arrived, 50_000)
        for mode, threads in (("1", 1), ("1", 2), ("0", 2)):
            with mock.patch.dict(os.environ, {"CASSANDRA_CDC_NATIVE": mode}):
                keys, tokens, _ = native.partition_keys(log, threads=threads)
            got[order, mode, threads] = list(zip(tokens.to_pylist(), keys.to_pylist()))
    assert len(want) > 170_000 and all(g == want for g in got.values())


def test_partition_keys_are_the_partitions_the_compiled_engine_processes_in_its_order():
    """On a property-test workload (three replicas of each mutation, in several record batches) the keys are the
    compiled engine's partitions in its publish order."""
    _, table, batches = _batches(11, False)
    records = [r for batch in batches for j, m in enumerate(batch) for r in mutation_records(m, j)]
    log = pa.Table.from_batches(pa.Table.from_pylist(records, schema=CELL_LOG_SCHEMA).to_batches(max_chunksize=7))
    keys, tokens, _ = native.partition_keys(log)
    tb = native.process_table(table, log, pa.Table.from_pylist([], schema=STATE_SCHEMA), 100,
                              state_schema=merge_source_schema(table))
    assert len(keys) == len({r["partition_key"] for r in records}) > 1
    assert keys.to_pylist() == tb.keys.to_pylist() and tokens.to_pylist() == tb.tokens.to_pylist()


def test_the_grouping_is_used_for_the_record_batches_it_was_made_from_only():
    """``process_table`` groups the records as ``partition_keys`` did (no second sort) when handed its grouping
    of the same record batches; given one made from other batches (the same records copied, or a slice of
    them), it sorts the records itself. The outputs are the same either way."""
    _, table, batches = _batches(11, False)
    records = [r for batch in batches for j, m in enumerate(batch) for r in mutation_records(m, j)]
    log = pa.Table.from_batches(pa.Table.from_pylist(records, schema=CELL_LOG_SCHEMA).to_batches(max_chunksize=7))
    copy = pa.Table.from_batches(pa.Table.from_pylist(records, schema=CELL_LOG_SCHEMA).to_batches(max_chunksize=7))
    compiled, grouped = native.compiled_module(), []

    def recording(*args, **kwargs):
        out = process(*args, **kwargs)
        grouped.append(out["grouped"])
        return out

    def run(cells, grouping):
        tb = native.process_table(table, cells, pa.Table.from_pylist([], schema=STATE_SCHEMA), 100,
                                  state_schema=merge_source_schema(table), grouping=grouping)
        return tb.keys, tb.tokens, tb.events, tb.state_rows, tb.changed

    process = compiled.process_table
    with mock.patch.object(compiled, "process_table", recording):
        alone = run(log, None)
        assert run(log, native.partition_keys(log).grouping) == alone
        assert run(log, native.partition_keys(copy).grouping) == alone
        assert run(log.slice(5), native.partition_keys(log).grouping) == run(log.slice(5), None)
    assert grouped == [False, True, False, False, False]
    assert alone[2].num_rows and alone[3].num_rows


def test_the_partitions_of_a_grouping_come_back_without_a_copy():
    """Handed the grouping of the same records (and no partitions to sweep), ``process_table`` answers with the
    very key and token buffers ``partition_keys`` gave: a copy would cost a 1M-change batch 20 MB of fresh memory.
    Another cell log's grouping gets keys of its own, equal to them."""
    _, table, batches = _batches(12, False)
    records = [r for batch in batches for j, m in enumerate(batch) for r in mutation_records(m, j)]
    log = pa.Table.from_batches(pa.Table.from_pylist(records, schema=CELL_LOG_SCHEMA).to_batches(max_chunksize=7))
    run = lambda grouping: native.process_table(  # noqa: E731
        table, log, pa.Table.from_pylist([], schema=STATE_SCHEMA), 100, state_schema=merge_source_schema(table),
        grouping=grouping)
    pk = native.partition_keys(log)
    same, own = run(pk.grouping), run(None)
    assert len(pk.keys) > 1
    assert [b.address for b in same.keys.buffers()[1:]] == [b.address for b in pk.keys.buffers()[1:]]
    assert same.tokens.buffers()[1].address == pk.tokens.buffers()[1].address
    assert own.keys.buffers()[2].address != pk.keys.buffers()[2].address
    assert (same.keys, same.tokens) == (own.keys, own.tokens) == (pk.keys, pk.tokens)


def test_a_null_partition_key_is_an_error_naming_the_record():
    log = pa.table({"partition_key": pa.array([b"a", None], pa.binary()), "token": pa.array([1, 2], pa.int64())})
    with mock.patch.dict(os.environ, {"CASSANDRA_CDC_NATIVE": "1"}), \
            pytest.raises(ValueError, match="chunk 0, record 1: a null partition key"):
        native.partition_keys(log)


@pytest.mark.parametrize("seed", range(6))
def test_column_and_table_names_that_need_escaping_give_the_python_engines_events(seed):
    """Quoted CQL identifiers may hold quotes, backslashes and any Unicode: the compiled engine writes each name's
    JSON once per table, escaped as Python escapes it, hashes its UTF-8 bytes into event ids as Python does, and
    its events and rows are the Python engine's."""
    rng = random.Random(seed)
    table = make_table(rng, counter=seed % 3 == 0)
    forms = ["it's {}", 'say "{}"', "back\\{}", "both'\"{}", "{}", "é{}", "名前{}", "{}\u00ff"]
    renamed = {n: (n if n == "st" else forms[i % len(forms)].format(n)) for i, n in enumerate(table.columns)}
    cols = {renamed[n]: dataclasses.replace(c, name=renamed[n]) for n, c in table.columns.items()}
    odd = TableMetadata('k"s\\', "t'1", table.id, [cols[renamed[c.name]] for c in table.partition_key],
                        [cols[renamed[c.name]] for c in table.clustering], cols, flags=table.flags)
    gen = Gen(rng, odd)
    mutations = [gen.mutation() for _ in range(30)]
    logged = [Mutation(m.updates, "CommitLog-7-1.log", 1, 100 + i, mutation_id=m.mutation_id)
              for i, m in enumerate(mutations)]
    batches = [logged[a:a + 10] for a in range(0, 30, 10)]
    with compiled_calls() as calls:
        seen = compare_batches(odd, batches, rng, threads=1, label=f"escaped names, seed {seed}")
    assert seen["events"] > 0 and calls and not any(tb.python for tb in calls)


def test_stored_rows_in_too_many_batches_to_number_are_joined_into_one():
    """The engine knows a stored record by its batch (high bits) and row (low bits, below the longest batch's
    length) in 32 bits: 32,768 batches, one of 65,536 rows, do not fit and are joined into one first; the rows of
    a usual Delta read (a few batches) are handed over as they are."""
    few = pa.table({"x": pa.array(range(10))})
    few = pa.Table.from_batches(few.to_batches(max_chunksize=3))
    assert [b.num_rows for b in native.stored_batches(few)] == [3, 3, 3, 1]
    big = pa.record_batch({"x": pa.array(range(65_536))})
    many = pa.Table.from_batches([big] + [big.slice(i, 1) for i in range(32_767)])
    joined = native.stored_batches(many)
    assert len(joined) == 1 and joined[0].column(0).to_pylist() == many.column(0).to_pylist()
    # the engine itself refuses what it cannot number (and the Python engine then runs the batch: NotCompiled)
    nulls = pa.RecordBatch.from_arrays([pa.nulls(65_536, f.type) for f in STATE_SCHEMA], schema=STATE_SCHEMA)
    with pytest.raises(ValueError, match="too many to number"):
        native.compiled_module().process_table(native.table_desc(make_rules_table()), [],
                                               [nulls] + [nulls.slice(0, 1)] * 32_767, [], 100, None, 0, "", 1)
