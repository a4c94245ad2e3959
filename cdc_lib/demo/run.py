"""The main job on embedded defaults: ``python -m cdc_lib.demo`` / ``cassandra-cdc demo`` / ``scripts/demo.sh``.

1. Generates what a 3-node, RF 3 cluster writes for the sample schema (``demo.workload.SAMPLE_SCHEMA_CQL``): one
   fake ``cdc_raw`` per node with completed segments (``_cdc.idx`` COMPLETED), so replica copies, out-of-order
   writes, updates, deletes, TTLs, collections and counters all occur.
2. Starts the embedded Kafka broker (Tansu) and S3 store (SeaweedFS) on 127.0.0.1 (``cdc_lib.embedded``).
3. Runs each node's agent once: cdc_raw -> ``s3://<bucket>/cdc/incoming/...``.
4. Runs the real ``cassandra_cdc`` DAG with ``airflow dags test`` (SQLite, temporary AIRFLOW_HOME; Kafka and
   S3 as Airflow connections in the environment) until no segment is left; then ``cassandra_cdc_maintenance``
   and one more ``cassandra_cdc`` run to publish the TTL expiries.
5. Prints a summary, a few events consumed from Kafka and a Polars query of a Delta state table.
6. Stops everything it started, by PID, also on failure or Ctrl-C.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "demo"
BUCKET = "cdc-demo"


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


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


def dags_test(dag_id: str, env: dict, conf: dict, log_path: Path) -> float:
    """``airflow dags test <dag_id> -c <conf>``; its output goes to ``log_path``. Returns seconds taken."""
    argv = [sys.executable, "-m", "airflow", "dags", "test", dag_id, "-c", json.dumps(conf)]
    t0 = time.monotonic()
    start = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as log:
        proc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    finished = [line for line in text.splitlines() if "DagRun Finished" in line]
    if proc.returncode != 0 or not finished or "state=success" not in finished[-1]:
        raise RuntimeError(f"airflow dags test {dag_id} failed (exit {proc.returncode}); log {log_path}:\n"
                           + "\n".join(text.splitlines()[-40:]))
    return time.monotonic() - t0


def _sum_into(acc: dict, d: dict) -> None:
    for k, v in (d or {}).items():
        acc[k] = acc.get(k, 0) + v


def summarize(store, cw) -> dict:
    """Totals over every batch manifest in the store, next to what the generator wrote."""
    from cdc_lib.pipeline.batches import Batch
    by_op: dict = {}
    by_table: dict = {}
    s = {"batches": 0, "segments": 0, "events": 0, "published": 0, "already_in_kafka": 0, "quarantined": 0,
         "archived": 0, "sweep_batches": 0, "expiry_events": 0}
    for key in store.list("ledger/batches/"):
        b = Batch.from_dict(store.get_json(key))
        s["batches"] += 1
        s["segments"] += len(b.segments)
        s["sweep_batches"] += int(b.sweep)
        pub = b.steps.get("publish", {})
        s["expiry_events"] += pub.get("events", 0) if b.sweep else 0
        s["events"] += pub.get("events", 0)
        s["published"] += pub.get("produced", 0)
        s["already_in_kafka"] += pub.get("already_in_kafka", 0)
        s["quarantined"] += b.steps.get("transform", {}).get("quarantined_entries", 0)
        s["archived"] += b.steps.get("archive", {}).get("archived", 0)
        _sum_into(by_op, pub.get("by_op"))
        _sum_into(by_table, pub.get("by_table"))
    s["by_op"] = by_op
    s["by_table"] = by_table
    s["generated_mutations"] = len(cw.mutations)
    s["commit_log_entries"] = cw.replica_copies
    s["replica_copies_dropped"] = cw.replica_copies - len(cw.mutations)
    return s


def consume_some(bootstrap: str, topic_prefix: str, n: int = 5, timeout: float = 20.0) -> list:
    """The first ``n`` records of each table topic (key, value as JSON)."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient
    topics = sorted(t for t in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
                    if t.startswith(topic_prefix + "."))
    out = []
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cdc-demo-reader", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    try:
        for topic in topics:
            c.assign([TopicPartition(topic, 0, 0)])
            got = 0
            deadline = time.monotonic() + timeout
            while got < n and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is None or m.error():
                    continue
                out.append((topic, json.loads(m.key()), json.loads(m.value()) if m.value() else None))
                got += 1
    finally:
        c.close()
    return out


def query_delta(root: str, storage_options: dict, keyspace: str, table: str, limit: int = 5):
    """Polars over the Delta state table: the visible rows (``_cdc_live``), typed columns only."""
    import polars as pl

    from cdc_lib.sinks.delta import state_table_uri
    uri = state_table_uri(root, keyspace, table)
    df = pl.scan_delta(uri, storage_options=storage_options or None)
    cols = [c for c in df.collect_schema().names() if not c.startswith("_cdc_")]
    live = df.filter(pl.col("_cdc_live")).select(cols[:6])      # the key columns and a few more
    return live.select(pl.len()).collect().item(), live.head(limit).collect()


def run_demo(n_mutations: int = 2000, workdir: Path | None = None, keep: bool = False, seed: int = 7,
             max_segments: int = 16) -> dict:
    from cdc_lib.agent.shipper import Agent
    from cdc_lib.pipeline.batches import read_metrics
    from cdc_lib.pipeline.resources import open_store
    from cdc_lib.settings import AgentConfig, PipelineConfig

    from .servers import run_kafka_broker, run_s3_server
    from .workload import SAMPLE_SCHEMA_CQL, Workload, clock_start_us, sample_schema, write_cluster_segments
    t_start = time.monotonic()
    owned = workdir is None
    work = Path(tempfile.mkdtemp(prefix="cdc-demo-")) if owned else Path(workdir)
    if not owned and work.exists() and any(work.iterdir()):
        if not (work / ".cdc-demo").exists():
            raise SystemExit(f"demo: {work} is not empty and not an earlier demo's workdir; choose another")
        shutil.rmtree(work)          # an earlier demo's files: start afresh
    work.mkdir(parents=True, exist_ok=True)
    (work / ".cdc-demo").write_text("made by cassandra-cdc demo; deleted by the next demo run here\n")
    try:
        schema_file = work / "schema.cql"
        schema_file.write_text(SAMPLE_SCHEMA_CQL)
        _say(f"workdir {work}")
        _say(f"generating {n_mutations} writes on 3 nodes, RF 3 (sample schema: {schema_file})")
        schema = sample_schema()
        workload = Workload(schema, seed=seed, start_us=clock_start_us())   # dated now: TTLs run out later
        cw = write_cluster_segments(work / "cassandra", schema, n_mutations, seed=seed, workload=workload,
                                    segment_size=256 * 1024)
        for node, paths in sorted(cw.segments.items()):
            _say(f"  {node}: {len(paths)} segments in {work / 'cassandra' / node}")
        with contextlib.ExitStack() as stack:
            _say("starting Kafka (Tansu) and S3 (SeaweedFS) on 127.0.0.1 ...")
            broker = stack.enter_context(run_kafka_broker(work / "tansu"))
            s3 = stack.enter_context(run_s3_server(work / "weed", bucket=BUCKET))
            _say(f"  kafka {broker.bootstrap} (pid {broker.pid}); s3 {s3.endpoint_url} (pid {s3.pid})")
            store_url = f"s3://{BUCKET}/cdc"
            # The end of the generated traffic: TTLs (60 s, 3600 s) are still running at the first batches.
            now = workload.clock_us // 1_000_000 + 5
            cfg = PipelineConfig(store_url=store_url, s3_endpoint_url=s3.endpoint_url, s3_access_key=s3.access_key,
                                 s3_secret_key=s3.secret_key, cluster=CLUSTER, schema_file=str(schema_file),
                                 kafka_bootstrap=broker.bootstrap, now=now, max_segments=max_segments)
            store = open_store(cfg)

            _say("agents: shipping cdc_raw -> " + store_url)
            for node in sorted(cw.segments):
                agent = Agent(AgentConfig(cdc_raw=work / "cassandra" / node, store_url=store_url, cluster=CLUSTER,
                                          node=node, storage_options=cfg.fs_options(),
                                          state_dir=work / "agent-state" / node), store=store)
                _say(f"  {node}: {agent.run_once()} segments shipped")

            home = work / "airflow"
            home.mkdir(exist_ok=True)
            env = airflow_env(home, kafka_bootstrap=broker.bootstrap, s3=s3)
            _say("airflow db migrate (SQLite) ...")
            airflow_db_migrate(env)
            conf = {"store_url": store_url, "cluster": CLUSTER, "schema_file": str(schema_file), "now": now,
                    "max_segments": max_segments}
            log_path = work / "airflow-dags-test.log"
            timings = []
            for run in range(1, 20):
                if not store.list(f"incoming/{CLUSTER}/"):
                    break
                _say(f"airflow dags test cassandra_cdc (run {run}) ...")
                timings.append(dags_test("cassandra_cdc", env, conf, log_path))
                _say(f"  done in {timings[-1]:.1f} s; {len(store.list(f'incoming/{CLUSTER}/'))} segments left")
            # An hour later every TTL has run out: the maintenance DAG requests the sweep, the next run does it.
            _say("airflow dags test cassandra_cdc_maintenance (TTL sweep request, Delta compact/vacuum) ...")
            dags_test("cassandra_cdc_maintenance", env, {**conf, "now": now + 4000}, log_path)
            _say("airflow dags test cassandra_cdc (the expiry sweep batch) ...")
            timings.append(dags_test("cassandra_cdc", env, {**conf, "now": now + 4000}, log_path))

            summary = summarize(store, cw)
            summary["metrics"] = read_metrics(cfg).get("totals", {})
            summary["dags_test_seconds"] = [round(t, 1) for t in timings]
            _print_summary(summary, store_url)
            _say("a few events from Kafka:")
            for topic, key, value in consume_some(broker.bootstrap, cfg.topic_prefix, n=2):
                after = value and (value.get("after") or value.get("before")) or {}
                short = {k: v for k, v in list(after.items())[:4]}
                print(f"    {topic} key={json.dumps(key)} op={value and value['op']} "
                      f"expired={value and value['source']['expired']} row={json.dumps(short, default=str)[:140]}")
            root = store.url
            count, df = query_delta(root, cfg.delta_options(), "shop", "orders")
            _say(f"Polars over the Delta state table shop.orders ({root}/delta/state/shop.orders): "
                 f"{count} visible rows; first {len(df)}:")
            print(df)
            summary["orders_rows"] = count
            _say(f"stopping kafka (pid {broker.pid}) and s3 (pid {s3.pid})")
        summary["seconds"] = round(time.monotonic() - t_start, 1)
        _say(f"done in {summary['seconds']} s")
        return summary
    finally:
        if owned and not keep:
            shutil.rmtree(work, ignore_errors=True)


def _print_summary(s: dict, store_url: str) -> None:
    _say("summary")
    print(f"    generated mutations          {s['generated_mutations']}")
    print(f"    commit-log entries (3 nodes) {s['commit_log_entries']}")
    print(f"    replica copies dropped       {s['replica_copies_dropped']}")
    print(f"    batches / segments           {s['batches']} / {s['segments']} (archived {s['archived']}, "
          f"sweep batches {s['sweep_batches']}, with {s['expiry_events']} TTL expiry events)")
    print(f"    events published             {s['events']} (produced {s['published']}, already in Kafka "
          f"{s['already_in_kafka']})")
    print(f"    events by op                 {json.dumps(s['by_op'], sort_keys=True)}")
    print(f"    events by table              {json.dumps(s['by_table'], sort_keys=True)}")
    print(f"    quarantined entries          {s['quarantined']}")
    print(f"    counters                     {store_url}/checkpoints/metrics.json")


def demo_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="cassandra-cdc demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--mutations", type=int, default=2000, help="generated writes (each on 3 replicas)")
    p.add_argument("--workdir", type=Path, help="keep everything here (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="do not delete the temporary directory")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--max-segments", type=int, default=16, help="segments per batch (DAG param)")
    a = p.parse_args(argv)
    try:
        run_demo(a.mutations, a.workdir, a.keep, a.seed, a.max_segments)
    except KeyboardInterrupt:
        _say("interrupted: everything started was stopped")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(demo_main())
