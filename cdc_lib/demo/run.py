"""The main job on embedded defaults: ``cassandra-cdc demo`` / ``scripts/demo.sh`` (command line: ``cli.demo``).

1. Starts in the background what the pipeline needs beside Cassandra: Apache Kafka and an S3 store (SeaweedFS) on
   127.0.0.1 (``demo.servers``) and ``airflow db migrate`` (SQLite, AIRFLOW_HOME in the workdir).
2. Meanwhile a real Cassandra 5.0 node (``demo.cassandra``) writes the commit log: the sample schema
   (``demo.workload.SAMPLE_SCHEMA_CQL``, CDC on), writes through cassandra-driver (``demo.shop_writes``),
   ``SELECT *`` of every table kept for the closing check, ``nodetool drain``. With ``--generated`` our own writer
   produces what a 3-node, RF 3 cluster writes instead (replica copies, out-of-order writes), with no JVM.
3. Runs each node's agent once: cdc_raw -> ``s3://<bucket>/cdc/incoming/...``.
4. Runs the real ``cassandra_cdc`` DAG until no segment is left, then ``cassandra_cdc_maintenance`` and one more
   ``cassandra_cdc`` run that publishes the TTL expiries, then ``cassandra_cdc_backfill`` and the ``cassandra_cdc``
   run that publishes its snapshot: each is ``DAG.test()``, what ``airflow dags test`` runs, in one Airflow process
   (``demo.dag_runner``) so Airflow starts once. Every step says what it runs, what it did and how long it took.
5. Prints a summary, a few events read back from Kafka, whole (before -> after of every column, the changed ones
   marked), and a Polars query of a Delta state table.
6. Copies the store to ``<workdir>/store`` (a local store with the same layout: Delta tables, archived segments,
   ledger), stops everything it started, by PID, also on failure or Ctrl-C, ends with the Delta state (after the
   stream batches) compared with the ``SELECT *`` the node answered (``demo.compare``), and prints commands to try
   on what it leaves. The workdir is kept (``--clean`` deletes it); the next demo run in it starts afresh.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "demo"
BUCKET = "cdc-demo"
DEFAULT_WORKDIR = Path("cdc-demo")
MARKER = ".cdc-demo"
ORDERS_COLUMNS = ["customer_id", "order_day", "order_id", "status", "total"]   # shown by the demo and the README


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


@contextlib.contextmanager
def _step(what: str):
    """Say what runs, then how long it took and what it did (``notes.append(...)`` inside the block)."""
    _say(f"{what} ...")
    notes: list = []
    t0 = time.monotonic()
    yield notes
    _say(f"  done in {time.monotonic() - t0:.1f} s" + "".join(f"; {n}" for n in notes))


def airflow_env(home: Path, *, kafka_bootstrap: str, s3) -> dict:
    """Environment for an ``airflow`` subprocess: SQLite under ``home``, our DAGs, connections for Kafka/S3."""
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "AIRFLOW_CONN_CASSANDRA_CDC_KAFKA": json.dumps({"conn_type": "generic", "host": kafka_bootstrap}),
    })
    if s3 is not None:
        env["AIRFLOW_CONN_CASSANDRA_CDC_S3"] = json.dumps({
            "conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
            "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region}})
    return env


def airflow_db_migrate(env: dict) -> None:
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def dags_test_argv(dag_id: str, conf: dict) -> list:
    return [sys.executable, "-m", "airflow", "dags", "test", dag_id, "-c", json.dumps(conf)]


def dags_test(dag_id: str, env: dict, conf: dict, log_path: Path) -> float:
    """``airflow dags test <dag_id> -c <conf>``; its output goes to ``log_path``. Returns seconds taken."""
    t0 = time.monotonic()
    start = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as log:
        proc = subprocess.run(dags_test_argv(dag_id, conf), env=env, stdout=log, stderr=subprocess.STDOUT)
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    finished = [line for line in text.splitlines() if "DagRun Finished" in line]
    if proc.returncode != 0 or not finished or "state=success" not in finished[-1]:
        raise RuntimeError(f"airflow dags test {dag_id} failed (exit {proc.returncode}); log {log_path}:\n"
                           + "\n".join(text.splitlines()[-40:]))
    return time.monotonic() - t0


# ------------------------------------------------------------------------------------------------ what ran

def _batches(store) -> list:
    from cdc_lib.pipeline.batches import Batch
    return sorted((Batch.from_dict(store.get_json(k)) for k in store.list("ledger/batches/")),
                  key=lambda b: b.batch_seq)


def _ops(by_op: dict) -> str:
    return ", ".join(f"{op} {n}" for op, n in sorted(by_op.items())) or "none"


def describe_batch(b) -> list:
    """What one ``cassandra_cdc`` run did to one batch, step by step, with the time each step took."""
    s = b.steps
    kind = "sweep (TTL expiries)" if b.sweep else "snapshot (backfill)" if b.snapshot else \
        f"{len(b.segments)} segments, {s.get('claim', {}).get('bytes', 0):,} bytes"
    pub, tr, ar = s.get("publish", {}), s.get("transform", {}), s.get("archive", {})
    head = f"batch {b.batch_seq}: {kind} -> {pub.get('events', 0)} events ({_ops(pub.get('by_op', {}))})"
    if b.segments:
        head += (f"; {ar.get('archived', 0)} segments archived, {ar.get('quarantined_segments', 0)} quarantined, "
                 f"{tr.get('quarantined_entries', 0)} entries quarantined")
    lines = [head]
    timing = [f"{step} {s[step]['duration_s']:.1f} s" for step in ("claim", "transform", "publish", "archive")
              if "duration_s" in s.get(step, {})]
    if "spark_start_s" in tr:
        timing[1] += f" (Spark start {tr['spark_start_s']:.1f} s)"
    elif tr.get("mode") == "driver":
        timing[1] += " (in this process: a small batch needs no Spark)"
    lines.append("  " + ", ".join(timing))
    return lines


def _run_dag(runner, dag_id: str, why: str, conf: dict, store, notes=None) -> float:
    """One DAG run (``DagRunner``: what ``airflow dags test <dag_id> -c <conf>`` runs): what it is for, the command
    that does the same, what it did (the batches it wrote, or ``notes()``) and how long it took."""
    seen = {b.batch_seq for b in _batches(store)}
    shown = {k: v for k, v in conf.items() if k != "schema_file"}
    _say(f"airflow dags test {dag_id} -c '{json.dumps(shown)}'   ({why})")
    took = runner.run(dag_id, conf)
    steps = 0.0
    for b in _batches(store):
        if b.batch_seq not in seen or b.resumed:
            for line in describe_batch(b):
                _say("  " + line)
            steps += sum(b.steps.get(k, {}).get("duration_s", 0) for k in ("claim", "transform", "publish", "archive"))
    for line in (notes() if notes else []):
        _say("  " + line)
    rest = f" (of which Airflow's task runners {took - steps:.1f} s)" if steps else ""
    _say(f"  done in {took:.1f} s{rest}")
    return took


# ------------------------------------------------------------------------------------------------ events

def consume_all(bootstrap: str, topic_prefix: str, timeout: float = 30.0) -> list:
    """Every record of the table topics (``<prefix>.<keyspace>.<table>``), topic by topic, partition by partition:
    (topic, key, value) with key and value as JSON."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    out = []
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cdc-demo-reader", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    try:
        for topic in sorted(t for t in meta.topics if t.startswith(topic_prefix + ".")
                            and t.count(".") == topic_prefix.count(".") + 2):
            for partition in sorted(meta.topics[topic].partitions):
                c.assign([TopicPartition(topic, partition, 0)])
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    m = c.poll(1.0)
                    if m is None:
                        continue
                    if m.error():
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            break
                        raise RuntimeError(f"reading {topic}: {m.error()}")
                    if m.value() is not None:                  # (a tombstone after a delete, if enabled)
                        out.append((topic, json.loads(m.key()), json.loads(m.value())))
    finally:
        c.close()
    return out


def _has_non_ascii(row) -> bool:
    return row is not None and any(isinstance(v, str) and not v.isascii() for v in row.values())


def pick_sample_events(events: list) -> list:
    """A few events that show what the stream holds: one row's story (created, then updated: both events of the
    same key, preferably with non-ASCII text), a delete, a TTL expiry and a counter update, in that order. Tables
    with many columns (``shop.all_types`` has one of every CQL type) only when nothing else has such an event."""
    def narrow_first(candidates: list) -> list:
        return sorted(candidates, key=lambda e: len((e[2].get("after") or e[2].get("before") or {})) > 16)

    by_key: dict = {}
    for topic, key, value in events:
        by_key.setdefault((topic, json.dumps(key, sort_keys=True)), []).append((topic, key, value))
    stories = [h[:2] for h in by_key.values() if [v["op"] for _, _, v in h[:2]] == ["c", "u"]]
    stories.sort(key=lambda h: (len(h[1][2]["after"]) > 16, not _has_non_ascii(h[1][2]["after"])))
    picked = list(stories[0]) if stories else []

    def first(pred):
        for e in narrow_first(events):
            if e not in picked and pred(e[2]):
                picked.append(e)
                return

    first(lambda v: v["op"] == "d" and not v["source"].get("expired"))
    first(lambda v: v["source"].get("expired"))
    first(lambda v: v["source"].get("table") == "page_views" and v["op"] == "u")
    return picked


def _utc(ts_us) -> str:
    import datetime
    if ts_us is None:
        return "?"
    t = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=ts_us)
    return t.isoformat().replace("+00:00", "Z")


def _text(v) -> str:
    return json.dumps(v, ensure_ascii=False, default=str)


def render_event(topic: str, key, value: dict) -> list:
    """An event as lines a person reads: topic, op, key, where it came from, then every column before -> after,
    the changed ones marked with '*'. Values are whole, text as text."""
    src = value["source"]
    what = {"c": "created", "u": "updated", "d": "deleted", "r": "read (snapshot)"}.get(value["op"], value["op"])
    if src.get("expired"):
        what += " by TTL expiry"
    lines = [f"{topic}  op={value['op']} ({what})  key={_text(key)}"]
    if src.get("segment"):
        node = f"{src['node']} " if src.get("node") else ""
        lines.append(f"    from {node}{src['segment']} @ {src.get('position')}, written {_utc(src.get('ts_us'))}")
    elif src.get("ts_us") is not None:
        lines.append(f"    at {_utc(src['ts_us'])}")
    before, after = value.get("before") or {}, value.get("after") or {}
    changed = set(value.get("changed") or [])
    names = list(after or before)
    cells = {n: (_text(before[n]) if value.get("before") is not None else "-",
                 _text(after[n]) if value.get("after") is not None else "-") for n in names}
    width = max([len("column")] + [len(n) for n in names])
    left = max([len("before")] + [min(len(b), 48) for b, _ in cells.values()])
    lines.append(f"    {'column':<{width}}  {'before':<{left}}    after")
    for n in names:
        b, a = cells[n]
        lines.append(f"  {'*' if n in changed else ' '} {n:<{width}}  {b:<{left}} -> {a}")
    return lines


# ------------------------------------------------------------------------------------------------ the store

def mirror_store(store, dest: Path) -> int:
    """Copy every object of ``store`` (with its checksum sidecar) to the local store ``dest``; returns the count."""
    from cdc_lib.storage.objects import ObjectStore
    local = ObjectStore.from_url(str(dest.resolve()))
    keys = store.list()
    for key in keys:
        local.put_bytes(key, store.get_bytes(key), checksum=store.info(key).checksum)
    return len(keys)


def query_delta(table_path: str, columns: list, limit: int = 5):
    """Polars over a Delta state table: the visible rows (``_cdc_live``), the given columns."""
    import polars as pl
    live = pl.scan_delta(table_path).filter(pl.col("_cdc_live")).select(columns)
    return live.select(pl.len()).collect().item(), live.head(limit).collect()


def summarize(store, cw=None) -> dict:
    """Totals over every batch manifest in the store, next to what the generator wrote (``cw``, if it did)."""
    by_op: dict = {}
    by_table: dict = {}
    s = {"batches": 0, "segments": 0, "events": 0, "published": 0, "already_in_kafka": 0, "quarantined": 0,
         "archived": 0, "sweep_batches": 0, "expiry_events": 0, "snapshot_batches": 0}
    for b in _batches(store):
        s["batches"] += 1
        s["segments"] += len(b.segments)
        s["sweep_batches"] += int(b.sweep)
        s["snapshot_batches"] += int(b.snapshot)
        pub = b.steps.get("publish", {})
        s["expiry_events"] += pub.get("events", 0) if b.sweep else 0
        s["events"] += pub.get("events", 0)
        s["published"] += pub.get("produced", 0)
        s["already_in_kafka"] += pub.get("already_in_kafka", 0)
        s["quarantined"] += b.steps.get("transform", {}).get("quarantined_entries", 0)
        s["archived"] += b.steps.get("archive", {}).get("archived", 0)
        for k, v in pub.get("by_op", {}).items():
            by_op[k] = by_op.get(k, 0) + v
        for k, v in pub.get("by_table", {}).items():
            by_table[k] = by_table.get(k, 0) + v
    s["by_op"] = by_op
    s["by_table"] = by_table
    if cw is not None:                     # generated segments: what the generator wrote
        s["generated_mutations"] = len(cw.mutations)
        s["commit_log_entries"] = cw.replica_copies
        s["replica_copies_dropped"] = cw.replica_copies - len(cw.mutations)
    return s


def _print_summary(s: dict, store_url: str) -> None:
    _say("summary")
    if "cql_statements" in s:
        print(f"    CQL statements (real node)   {s['cql_statements']} (node up in {s['cassandra_started_in']} s)")
    if "generated_mutations" in s:
        print(f"    generated mutations          {s['generated_mutations']}")
        print(f"    commit-log entries (3 nodes) {s['commit_log_entries']}")
        print(f"    replica copies dropped       {s['replica_copies_dropped']}")
    print(f"    batches / segments           {s['batches']} / {s['segments']} (archived {s['archived']}, "
          f"sweep batches {s['sweep_batches']} with {s['expiry_events']} TTL expiry events, snapshot batches "
          f"{s['snapshot_batches']})")
    print(f"    events published             {s['events']} (produced {s['published']}, already in Kafka "
          f"{s['already_in_kafka']})")
    print(f"    events by op                 {json.dumps(s['by_op'], sort_keys=True)}")
    print(f"    events by table              {json.dumps(s['by_table'], sort_keys=True)}")
    print(f"    quarantined entries          {s['quarantined']}")
    print(f"    counters                     {store_url}/checkpoints/metrics.json")


def try_it_commands(work: Path) -> list:
    """Commands that work on what the demo leaves in ``work``: the README's "Try it after the demo" ones."""
    store = work / "store"
    orders = store / "delta" / "state" / "shop.orders"
    venv = REPO / ".venv" / "bin"
    py = shlex.quote(str(venv / "python")) if venv.is_dir() else shlex.quote(sys.executable)
    cli = shlex.quote(str(venv / "cassandra-cdc")) if venv.is_dir() else f"{py} -m cdc_lib.cli"
    columns = ", ".join(repr(c) for c in ORDERS_COLUMNS)
    store_url = shlex.quote(str(store)) if store.is_absolute() else f'"$PWD/{store}"'
    return [
        f"{py} -c \"import polars as pl; print(pl.read_delta('{orders}').filter(pl.col('_cdc_live'))"
        f".select({columns}))\"",
        f"{py} -c \"import duckdb; from deltalake import DeltaTable; orders = DeltaTable('{orders}')"
        ".to_pyarrow_dataset(); duckdb.sql('SELECT status, count(*) AS n FROM orders WHERE _cdc_live GROUP BY "
        "status ORDER BY status').show()\"",
        f"{py} -c \"import duckdb; from deltalake import DeltaTable; "
        f"events = DeltaTable('{store / 'delta' / 'events'}').to_pyarrow_dataset(); "
        "duckdb.sql('SELECT \\\"table\\\", op, count(*) AS n FROM events GROUP BY ALL ORDER BY ALL').show()\"",
        f"{cli} inspect --schema {work / 'schema.cql'} --format text "
        f"{store / 'archived' / CLUSTER / 'node1'}/CommitLog-7-*.log | head -20",
        # the pipeline's settings take absolute paths only (its steps run in other working directories)
        f"{cli} metrics --store-url {store_url} --cluster {CLUSTER} | grep events_total",
    ]


# ------------------------------------------------------------------------------------------------ the run

def _prepare_workdir(work: Path) -> None:
    if work.exists() and any(work.iterdir()):
        if not (work / MARKER).exists():
            raise SystemExit(f"cassandra-cdc demo: {work} is not empty and not an earlier demo's workdir; "
                             "choose another with --workdir")
        shutil.rmtree(work)          # an earlier demo's files: start afresh
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text("made by cassandra-cdc demo; deleted by the next demo run here\n")


def write_real_cluster(work: Path, n_statements: int, seed: int, schema_file: Path) -> dict:
    """A real Cassandra 5.0 node writes the commit log: starts it, creates the sample schema, writes through
    cassandra-driver, keeps ``SELECT *`` of every table (the demo's closing check) and the ``DESCRIBE`` output (the
    pipeline's schema file), drains and stops it. Its ``cdc_raw`` stays for the agent."""
    from cdc_lib.cql.schema_from_ddl import load_cql_schema

    from .cassandra import LocalCassandra, describe
    from .compare import select_native, select_rows
    from .shop_writes import KEYSPACE, TABLES, schema_for_one_node, write_shop
    from .workload import SAMPLE_SCHEMA_CQL
    cluster = LocalCassandra(work.resolve() / "cassandra", 1)
    node = cluster.node(1)
    try:
        with _step("starting a real Cassandra 5.0 node on 127.0.0.1 (the jars setup.sh fetched into "
                   ".jvm/lib/cassandra)") as notes:
            cluster.start()
            notes.append(f"pid {node.pid}, CQL on 127.0.0.1:{cluster.native_port} after {cluster.started_in:.1f} s; "
                         f"logs in {node.log_dir}")
        with _step(f"writing {n_statements} statements through cassandra-driver (sample schema, RF 1, CDC on, "
                   "1 MiB commit-log segments)") as notes:
            session = cluster.session()
            for statement in schema_for_one_node(SAMPLE_SCHEMA_CQL):
                session.execute(statement)
            statements = write_shop(session, n_statements, seed)
            schema_file.write_text(describe(session, KEYSPACE))
            schema = load_cql_schema(schema_file.read_text())
            tables = [schema.by_name(KEYSPACE, t) for t in TABLES]
            expected = {t.qualified_name: select_rows(session, t) for t in tables}
            native = {t.qualified_name: select_native(session, t) for t in tables}
            now = int(time.time())
            notes.append(f"SELECT * kept for the closing check ({sum(map(len, expected.values()))} rows); "
                         f"DESCRIBE written to {schema_file}")
        with _step(f"nodetool drain (the last segment completes), then stop the node (pid {node.pid})"):
            cluster.nodetool(1, "drain")
    finally:
        cluster.stop()
    return {"cdc_raw": node.cdc_raw, "tables": tables, "expected": expected, "native": native, "now": now,
            "statements": statements, "started_in": cluster.started_in}


def write_generated(work: Path, n_mutations: int, seed: int):
    """``--generated``: what a 3-node, RF 3 cluster writes for the sample schema, from our own segment writer
    (``demo.workload``): replica copies and out-of-order arrivals included, no JVM needed."""
    from .workload import Workload, clock_start_us, sample_schema, write_cluster_segments
    with _step(f"generating {n_mutations} writes on 3 nodes, RF 3 (sample schema)") as notes:
        schema = sample_schema()
        workload = Workload(schema, seed=seed, start_us=clock_start_us())  # dated now: TTLs run out later
        cw = write_cluster_segments(work / "cassandra", schema, n_mutations, seed=seed, workload=workload,
                                    segment_size=256 * 1024)
        notes.append(", ".join(f"{node}: {len(paths)} segments" for node, paths in sorted(cw.segments.items()))
                     + f" in {work / 'cassandra'}/<node>")
    # The end of the generated traffic: TTLs (60 s, 3600 s) are still running at the first batches.
    return cw, workload.clock_us // 1_000_000 + 5


def closing_check(real: dict, store_root: str, storage_options: dict):
    """The Delta state (``WHERE _cdc_live``) of every table against the ``SELECT *`` the node answered."""
    from .compare import Comparison, compare_native, compare_table, delta_live_rows
    out = Comparison()
    for t in real["tables"]:
        delta_rows = delta_live_rows(store_root, t, storage_options)
        compare_table(t, real["expected"][t.qualified_name], delta_rows, out)
        compare_native(t, real["native"][t.qualified_name], delta_rows, out)
    return out


@contextlib.contextmanager
def _background_services(work: Path, home: Path):
    """What the pipeline needs beside Cassandra, started while Cassandra starts and takes the writes: Kafka and S3
    on 127.0.0.1, ``airflow db migrate``, then the one Airflow process of the DAG runs (``DagRunner``: Airflow's
    imports, the DAG folder parsed, the in-process execution API built). None of them needs the node, and on 2
    cores their start-up overlaps the node's. Yields ``ready()``, which waits for them and returns
    ``(broker, s3, runner, seconds they took)``; everything started is stopped by PID on exit."""
    import threading

    from .dag_runner import DagRunner
    from .servers import run_kafka_broker, run_s3_server
    migrate_log = home / "db-migrate.log"
    with open(migrate_log, "wb") as log:
        migrate = subprocess.Popen([sys.executable, "-m", "airflow", "db", "migrate"],
                                   env=airflow_env(home, kafka_bootstrap="", s3=None), stdout=log,
                                   stderr=subprocess.STDOUT)
    started: dict = {}
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        def start() -> None:
            try:
                broker = started["broker"] = stack.enter_context(run_kafka_broker(work.resolve() / "kafka"))
                s3 = started["s3"] = stack.enter_context(run_s3_server(work.resolve() / "weed", bucket=BUCKET))
                if migrate.wait() != 0:
                    raise RuntimeError(f"airflow db migrate failed (exit {migrate.returncode}): "
                                       + migrate_log.read_text()[-2000:])
                env = airflow_env(home, kafka_bootstrap=broker.bootstrap, s3=s3)
                started["runner"] = stack.enter_context(DagRunner(env, work / "airflow-dags-test.log"))
            except BaseException as e:  # noqa: BLE001 - raised again by ready(), in the demo's thread
                started["error"] = e
            started["seconds"] = time.monotonic() - t0
        thread = threading.Thread(target=start, name="demo-services", daemon=True)
        thread.start()

        def ready():
            thread.join()
            if "error" in started:
                raise started["error"]
            return started["broker"], started["s3"], started["runner"], started["seconds"]
        try:
            yield ready
        finally:
            thread.join()
            if migrate.poll() is None:
                migrate.kill()
                migrate.wait()


def run_demo(n_mutations: int = 2000, workdir: Path = DEFAULT_WORKDIR, seed: int = 7, max_segments: int = 16,
             clean: bool = False, generated: bool = False) -> dict:
    from cdc_lib.agent.shipper import Agent
    from cdc_lib.pipeline.batches import read_metrics
    from cdc_lib.pipeline.resources import delta_root, open_store
    from cdc_lib.settings import AgentConfig, PipelineConfig

    from .workload import SAMPLE_SCHEMA_CQL
    t_start = time.monotonic()
    work = Path(workdir)
    _prepare_workdir(work)
    try:
        schema_file = (work / "schema.cql").resolve()   # the pipeline takes absolute paths only
        schema_file.write_text(SAMPLE_SCHEMA_CQL)
        _say(f"workdir {work} (" + ("deleted at the end: --clean" if clean else
                                    "kept after the demo; --clean deletes it, the next demo run here starts afresh")
             + ")")
        home = (work / "airflow").resolve()
        home.mkdir(exist_ok=True)
        with contextlib.ExitStack() as stack:
            _say(f"starting in the background: Kafka and S3 (SeaweedFS) on 127.0.0.1, airflow db migrate (SQLite, "
                 f"AIRFLOW_HOME={home}), then one Airflow process for every DAG run below (DAG.test(), what "
                 f"`airflow dags test` runs: Airflow starts and parses the DAGs once, not once per run)")
            services = stack.enter_context(_background_services(work, home))
            cw = real = None
            if generated:
                cw, now = write_generated(work, n_mutations, seed)
                cdc_raws = {node: work / "cassandra" / node for node in cw.segments}
            else:
                real = write_real_cluster(work, n_mutations, seed, schema_file)
                cdc_raws = {"node1": real["cdc_raw"]}
                now = real["now"]
            with _step("waiting for Kafka, S3 and Airflow") as notes:
                broker, s3, runner, took = services()
                notes.append(f"kafka {broker.bootstrap} (pid {broker.pid}), s3 {s3.endpoint_url} (pid {s3.pid}), "
                             f"Airflow pid {runner.pid} (DAGs parsed in {runner.parse_s:.1f} s); all ready "
                             f"{took:.1f} s after they started")
            store_url = f"s3://{BUCKET}/cdc"
            cfg = PipelineConfig(store_url=store_url, s3_endpoint_url=s3.endpoint_url, s3_access_key=s3.access_key,
                                 s3_secret_key=s3.secret_key, cluster=CLUSTER, schema_file=str(schema_file),
                                 kafka_bootstrap=broker.bootstrap, now=now, max_segments=max_segments)
            store = open_store(cfg)

            with _step(f"agents: shipping each node's cdc_raw to {store_url}") as notes:
                for node, cdc_raw in sorted(cdc_raws.items()):
                    agent = Agent(AgentConfig(cdc_raw=cdc_raw, store_url=store_url,
                                              cluster=CLUSTER, node=node, storage_options=cfg.fs_options(),
                                              state_dir=work / "agent-state" / node), store=store)
                    agent.run_once()
                    notes.append(f"{node}: {agent.metrics()['segments_shipped']} segments")

            conf = {"store_url": store_url, "cluster": CLUSTER, "schema_file": str(schema_file),
                    "now": now, "max_segments": max_segments}
            log_path = work / "airflow-dags-test.log"
            _say(f"Airflow's environment: that AIRFLOW_HOME, the Kafka and S3 connections as AIRFLOW_CONN_* variables, "
                 f"and schema_file={schema_file} in each -c; task logs: {log_path}")
            timings = []
            for run in range(1, 20):
                left = len(store.list(f"incoming/{CLUSTER}/"))
                if not left:
                    break
                timings.append(_run_dag(runner, "cassandra_cdc", f"run {run}: claim -> transform -> publish (Kafka) "
                                        f"-> archive; {left} segments waiting", conf, store))
            check = None
            if real is not None:    # before the sweep below, which runs "an hour later" than SELECT * was read
                check = closing_check(real, delta_root(cfg, store), cfg.delta_options())
            # An hour later TTLs have run out: the maintenance DAG requests the sweep, the next run does it.
            later = {**conf, "now": now + 4000}

            def upkeep() -> list:
                m = read_metrics(cfg).get("last", {}).get("maintenance", {})
                return [f"sweep requested; {m.get('tables', 0)} Delta tables: {m.get('files_removed', 0)} small files "
                        f"compacted into {m.get('files_added', 0)}, {m.get('vacuumed', 0)} old files vacuumed"]
            _run_dag(runner, "cassandra_cdc_maintenance", "an hour later: request the TTL-expiry sweep; compact and "
                     "vacuum the Delta tables", later, store, upkeep)
            timings.append(_run_dag(runner, "cassandra_cdc", "the sweep batch: an event for every row a TTL changed",
                                    later, store))
            _run_dag(runner, "cassandra_cdc_backfill", "request a snapshot of the current state", later, store,
                     lambda: ["snapshot requested: the next cassandra_cdc run publishes it"])
            timings.append(_run_dag(runner, "cassandra_cdc", "the snapshot batch: an 'r' event for every visible "
                                    "row, between the batches before and after it", later, store))

            summary = summarize(store, cw)
            if real is not None:
                summary["cql_statements"] = real["statements"]
                summary["cassandra_started_in"] = round(real["started_in"], 1)
            summary["metrics"] = read_metrics(cfg).get("totals", {})
            summary["dag_run_seconds"] = [round(t, 1) for t in timings]
            _print_summary(summary, store_url)

            events = consume_all(broker.bootstrap, cfg.topic_prefix)
            samples = pick_sample_events([e for e in events if e[2]["op"] != "r"])
            _say(f"{len(events)} events in Kafka; a few of them, whole (every column before -> after, "
                 "changed ones marked *):")
            for topic, key, value in samples:
                for line in render_event(topic, key, value):
                    print("    " + line)
            summary["sample_events"] = samples

            with _step(f"copying the store {store_url} to {work / 'store'} (a local store to query after the demo)") \
                    as notes:
                notes.append(f"{mirror_store(store, work / 'store')} objects")
            orders = work / "store" / "delta" / "state" / "shop.orders"
            count, df = query_delta(str(orders), ORDERS_COLUMNS)
            _say(f"Polars over the Delta state table shop.orders ({orders}): {count} visible rows; first {len(df)}:")
            print(df)
            summary["orders_rows"] = count
            t0 = time.monotonic()
            _say(f"stopping Airflow (pid {runner.pid}), kafka (pid {broker.pid}) and s3 (pid {s3.pid}) ...")
        _say(f"  stopped in {time.monotonic() - t0:.1f} s")
        summary["seconds"] = round(time.monotonic() - t_start, 1)
        if check is not None:
            summary["equality"] = {"tables": check.tables, "rows": check.rows, "cells": check.cells,
                                   "equal": check.equal}
            _say(check.summary() + " (after the stream batches, before the TTL sweep)")
            if not check.equal:
                raise RuntimeError("the Delta state differs from what Cassandra returns (above)")
        _say(f"done in {summary['seconds']} s")
        if not clean:
            _say(f"try it on what the demo left in {work} (more in the README, \"Try it after the demo\"):")
            for cmd in try_it_commands(work):
                print("    " + cmd)
        return summary
    finally:
        if clean:
            shutil.rmtree(work, ignore_errors=True)
