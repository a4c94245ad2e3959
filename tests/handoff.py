"""The bootstrap handoff on a real Cassandra node, for a backfill mode that loads live data (``run_handoff``).

Rows are written into tables without CDC; then ``ALTER TABLE ... WITH cdc = true``, the backfill request, and a
writer that keeps changing the table (updates of old rows, of their collections, UDT fields and statics, new
rows, deletions of old rows and of columns) while the pipeline runs the backfill's batches; segments shipped
meanwhile wait in ``incoming/`` (the backfill goes first). After the writer stops, the stream batches run. The
writer is the only client, and it reads the partition it changed after every statement (consistency ALL), so
``Handoff.histories`` holds every state each row had, in order: what ``tests/event_invariant.py`` checks the Kafka
events against.

``handoff.t`` gets the concurrent writes; ``handoff.types`` holds a row of every CQL type (``real_workload``'s
``types`` table, edge values, TTLs) and is only loaded, so its values, write times and TTLs can be compared with
``SELECT``, ``WRITETIME()`` and ``TTL()``. Each mode uses its own keyspace, dropped at the end.
"""
from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from event_invariant import canon
from real_workload import Udt, switch_segments, types_insert, types_row, types_table_statements, wait_for
from servers import consume_topic
from sstable_check import select_cell_times

from cdc_lib import pipeline as P
from cdc_lib.agent.shipper import Agent
from cdc_lib.cql.schema_from_cluster import load_from_cluster
from cdc_lib.demo.compare import key_json, select_json, select_native, select_rows
from cdc_lib.pipeline.requests import pending_request
from cdc_lib.settings import AgentConfig
from cdc_lib.sinks.kafka import table_topic

CLUSTER = "handoff"
PARTITIONS, ROWS = 40, 8            # rows written before CDC: PARTITIONS x ROWS (some of them key only)
LONG_TTL = 86_400


@dataclass
class Handoff:
    keyspace: str
    store: Path
    config: P.PipelineConfig
    tables: dict                        # name -> TableMetadata
    request: dict                       # the backfill request's answer
    existing: set                       # key JSON of every row of handoff.t before CDC was enabled
    histories: dict                     # canonical key -> every state of the row, from absent (event_invariant)
    final_rows: dict                    # name -> SELECT * (typed) at the end
    final_native: dict                  # name -> SELECT * scalar columns as the driver's values
    final_times: dict                   # name -> {key JSON: {column: [WRITETIME, TTL]}}
    final_now: int                      # when the final_* were read (seconds)
    backfill_batches: list
    stream_batches: list
    waited: int                         # claims that took a backfill share while segments waited in incoming/
    writes: dict                        # writer statements: during the backfill, after it
    log: list                           # the pipeline's log lines
    timings: dict = field(default_factory=dict)
    # canonical key -> for each state in ``histories``, (µs before the writer's statement, µs after its answer)
    # that made it; None for the states before the writer
    windows: dict = field(default_factory=dict)

    def events(self, table: str) -> list:
        return consume_topic(self.config.kafka_bootstrap, table_topic(self.config.topic_prefix, self.keyspace, table))


def writable_session(cluster):
    """A session of ``cluster`` (node 1) that takes writes: a node another scenario drained is restarted."""
    try:
        session = cluster.session()
        session.execute("CREATE KEYSPACE IF NOT EXISTS handoff_probe WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("DROP KEYSPACE handoff_probe")
        return session
    except Exception:  # noqa: BLE001 - drained: no native transport, writes refused
        cluster.close_driver()
        cluster.stop_node(1)
        cluster.start_node(1)
        return cluster.session()


def _schema_statements(ks: str) -> list:
    return [f"CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}",
            *types_table_statements(ks, cdc=False),
            f"""CREATE TABLE {ks}.t (k int, c int, s text static, v text, n bigint, st set<text>,
                m map<text, int>, u addr, fl frozen<list<int>>, PRIMARY KEY (k, c))"""]


def _write_existing(session, ks: str) -> None:
    """Rows before CDC: every column kind, rows with a TTL, key-only rows, statics; the types table."""
    ins = session.prepare(f"INSERT INTO {ks}.t (k, c, v, n, st, m, u, fl) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
    ins_ttl = session.prepare(f"INSERT INTO {ks}.t (k, c, v, n, st, m, u, fl) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                              f"USING TTL {LONG_TTL}")
    for k in range(PARTITIONS):
        if k % 4 == 0:
            session.execute(f"UPDATE {ks}.t SET s = 'static {k}' WHERE k = {k}")
        for c in range(ROWS):
            if (k + c) % 9 == 0:
                session.execute(f"INSERT INTO {ks}.t (k, c) VALUES ({k}, {c})")        # a key-only row
                continue
            values = (k, c, f"v{k}.{c}", k * 1000 + c, {f"e{c}", "x"}, {"a": c, f"k{k}": k},
                      Udt(street=f"{k} Main St", city=None if c % 3 else "Utrecht", zip=c), [k, c])
            session.execute(ins_ttl if (k * ROWS + c) % 5 == 0 else ins, values)
    ins_types = session.prepare(types_insert(ks))
    for i in range(1, 10):
        session.execute(ins_types, types_row(i))
    session.execute(f"UPDATE {ks}.types USING TTL {LONG_TTL} SET a_text = 'expires', s = s + {{'ttl'}} "
                    "WHERE id = 2 AND ck = 'ck2'")
    session.execute(f"INSERT INTO {ks}.types (id, ck, a_int, a_text) VALUES (10, 'ck10', 7, 'old') "
                    "USING TIMESTAMP 1000")


class Writer(threading.Thread):
    """Changes ``handoff.t`` until stopped, recording the rows of the partition it changed after every statement
    (``histories``: canonical key -> states; ``now``: key JSON -> row JSON as it is now)."""

    def __init__(self, session, table, existing: dict, seed: int):
        super().__init__(name="handoff-writer", daemon=True)
        self.session, self.table, self.rnd = session, table, random.Random(seed)
        self.ks = table.keyspace
        self.now = dict(existing)
        self.histories = {canon(k): [None, canon(row)] for k, row in existing.items()}   # consumers start empty
        self.windows = {canon(k): [None, None] for k in existing}      # Handoff.windows
        self.parts: dict = {}           # k -> key JSON of its rows now
        for key in existing:
            self.parts.setdefault(_k_of(key), set()).add(key)
        self.stop_flag = threading.Event()
        self.count = 0
        self.error = None
        self.new_c = 100

    def run(self):
        try:
            while not self.stop_flag.is_set():
                self.step()
        except BaseException as e:  # noqa: BLE001 - reported by the scenario
            self.error = e

    def step(self):
        r, ks = self.rnd, self.ks
        k, c = r.randrange(PARTITIONS), r.randrange(ROWS)
        op = r.random()
        if 0.61 > op and key_json(self.table, {"k": k, "c": c}) not in self.now:
            # Rows are created by INSERT only: an UPDATE of a row that is gone would create one without a row
            # marker, which a scan cannot tell from one with (README, "Bootstrap": such a row would stay visible
            # in the state once all its columns are null).
            cql = f"INSERT INTO {ks}.t (k, c, v) VALUES ({k}, {c}, 'again{self.count}')"
        elif op < 0.25:
            cql = f"UPDATE {ks}.t SET v = 'w{self.count}', n = {self.count} WHERE k = {k} AND c = {c}"
        elif op < 0.32:
            cql = f"UPDATE {ks}.t SET st = st + {{'w{self.count}'}} WHERE k = {k} AND c = {c}"
        elif op < 0.37:
            cql = f"UPDATE {ks}.t SET st = st - {{'x'}} WHERE k = {k} AND c = {c}"
        elif op < 0.45:
            cql = f"UPDATE {ks}.t SET m['w'] = {self.count} WHERE k = {k} AND c = {c}"
        elif op < 0.52:
            cql = f"UPDATE {ks}.t SET u.city = 'c{self.count}' WHERE k = {k} AND c = {c}"
        elif op < 0.56:
            cql = f"UPDATE {ks}.t SET fl = [{self.count}] WHERE k = {k} AND c = {c}"
        elif op < 0.61:
            cql = f"UPDATE {ks}.t SET s = 'ws{self.count}' WHERE k = {k}"
        elif op < 0.76:
            cql = f"DELETE FROM {ks}.t WHERE k = {k} AND c = {c}"
        elif op < 0.81:
            cql = f"DELETE v FROM {ks}.t WHERE k = {k} AND c = {c}"
        else:
            if r.random() < 0.5:
                k = PARTITIONS + r.randrange(20)                 # a new partition
            self.new_c += 1
            c = self.new_c
            cql = f"INSERT INTO {ks}.t (k, c, v, st) VALUES ({k}, {c}, 'new{self.count}', {{'n'}})"
        from cassandra import ConsistencyLevel
        from cassandra.query import SimpleStatement
        issued = time.time_ns() // 1000
        self.session.execute(SimpleStatement(cql, consistency_level=ConsistencyLevel.ALL))
        window = (issued, time.time_ns() // 1000)
        self.count += 1
        rows = select_json(self.session, self.table, "ALL", "k = %s", (k,))
        for key in self.parts.get(k, set()) | set(rows):
            row = rows.get(key)
            history = self.histories.setdefault(canon(key), [None])
            if history[-1] != canon(row):
                history.append(canon(row))
                self.windows.setdefault(canon(key), [None]).append(window)
            if row is None:
                self.now.pop(key, None)
            else:
                self.now[key] = row
        self.parts[k] = set(rows)


def _k_of(key_json: str) -> int:
    import json
    return json.loads(key_json)["k"]


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def run_handoff(cluster, base: Path, kafka_broker: str, mode: str, request: Callable[..., dict], *,
                seed: int = 9) -> Handoff:
    """The scenario (module docstring) for backfill ``mode``; ``request(config, agent, keyspace)`` makes the
    backfill request (the agent of node 1 is there for a mode that needs it) and returns its answer."""
    t0 = time.monotonic()
    ks = f"handoff_{mode}"
    session = writable_session(cluster)
    session.execute(f"DROP KEYSPACE IF EXISTS {ks}")
    for cql in _schema_statements(ks):
        session.execute(cql)
    _write_existing(session, ks)
    store = base / "store"
    store.mkdir()
    agent = Agent(AgentConfig(cdc_raw=cluster.node(1).cdc_raw, store_url=str(store), cluster=CLUSTER, node="node1",
                              state_dir=base / "agent", ship_live_prefix=True, orphan_grace_s=1.0))
    config = P.PipelineConfig(store_url=str(store), cluster=CLUSTER, kafka_bootstrap=kafka_broker,
                              topic_prefix=f"h{uuid.uuid4().hex[:6]}", schema_source="driver",
                              cassandra_hosts=cluster.contact_points, cassandra_port=cluster.native_port,
                              include_keyspaces=[ks])
    lines = _Lines()
    loggers = [logging.getLogger(name) for name in ("cassandra_cdc", "cdc_lib")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(lines)
        lg.setLevel(logging.INFO)
    try:
        for name in ("t", "types"):
            session.execute(f"ALTER TABLE {ks}.{name} WITH cdc = true")
        tables = {n: load_from_cluster(session, [ks]).by_name(ks, n) for n in ("t", "types")}
        existing = select_json(session, tables["t"])
        answer = request(config, agent, ks)
        writer = Writer(cluster.session(), tables["t"], existing, seed)
        writer.start()
        t1 = time.monotonic()
        backfill, waited, switched = [], 0, False
        while pending_request(P.open_store(config)) is not None:
            agent.run_once()
            batch = P.run_once(config)
            assert batch.backfill.get("mode") == mode, f"batch {batch.batch_id} is not a {mode} backfill batch"
            if switched and batch.steps["claim"]["backlog"]:
                waited += 1
            backfill.append(batch)
            if not switched:         # a complete segment in incoming/ from here on: it must wait
                switch_segments(session, cluster, [1], ks, quiet=False)      # the writer writes on
                agent.run_once()
                switched = True
        during = writer.count
        wait_for("writes after the backfill", lambda: writer.count >= during + 20 or writer.error)
        writer.stop_flag.set()
        writer.join(30)
        assert writer.error is None, writer.error
        timings = {"backfill_s": round(time.monotonic() - t1, 1)}
        final_now = int(time.time())
        final_rows = {n: select_rows(session, t) for n, t in tables.items()}
        final_native = {n: select_native(session, t) for n, t in tables.items()}
        final_times = {n: select_cell_times(session, t, "ALL") for n, t in tables.items()}
        assert select_json(session, tables["t"]) == writer.now, "the writer's last state is not the table"
        switch_segments(session, cluster, [1], ks)
        agent.run_once()
        t1 = time.monotonic()
        stream = P.run_until_idle(config)
        timings["stream_s"] = round(time.monotonic() - t1, 1)
        session.execute(f"DROP KEYSPACE {ks}")
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(lines)
            lg.setLevel(level)
    timings["scenario_s"] = round(time.monotonic() - t0, 1)
    return Handoff(ks, store, config, tables, answer, set(existing), writer.histories, final_rows, final_native,
                   final_times, final_now, backfill, stream, waited,
                   {"during": during, "after": writer.count - during}, lines.lines, timings, writer.windows)
