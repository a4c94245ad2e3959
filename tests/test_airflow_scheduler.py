"""The DAGs under a real Airflow: api-server, dag-processor and scheduler as separate processes (LocalExecutor,
SQLite) on 127.0.0.1, against the embedded Kafka broker and S3 server, set up the way the README's "Running it in
production" says and configured only through it: a settings file (``CASSANDRA_CDC_CONFIG``), ``CASSANDRA_CDC_*``
environment variables, the Airflow Variable ``cassandra_cdc_settings`` and Airflow connections. No trigger conf.

Agents ship generated segments (dated now, so TTLs run out while the test runs) in two waves; each wave is
processed by a *scheduled* run. Then ``airflow dags trigger`` asks for a backfill snapshot and a TTL sweep, which
the next scheduled runs perform. Checked: every run succeeded; each event is in Kafka exactly once and the topics
hold what the batch manifests say was published; replayed in order, the events give what the reference model says
Cassandra shows at the last batch's processing time; the transform tasks' logs hold no error-level line and no
loopback warning, and start with the step's summary; each follow task took batches for what was left of its run's
interval when it started (less the margin); nothing was written to the scheduler's working directory.
Last, a run whose spark-submit job fails (the Variable sets a driver memory the JVM refuses): the transform's task
log, as Airflow stored it, holds the job's output lines and the error with their tail. The test prints the run
table (run, state, seconds per task).
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import psutil
import pytest
from reference_model import json_table
from reference_model import visible_table as model_table
from servers import ServerProcess, consume_topic, free_port

from cdc_lib import pipeline as P
from cdc_lib.agent.shipper import Agent
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, Workload, clock_start_us, sample_schema, write_cluster_segments
from cdc_lib.settings import AgentConfig
from cdc_lib.sinks.kafka import table_topic
from cdc_lib.storage.layout import Layout

REPO = Path(__file__).resolve().parents[1]
AIRFLOW = Path(sys.executable).parent / "airflow"
DAG_IDS = ("cassandra_cdc", "cassandra_cdc_backfill", "cassandra_cdc_maintenance")
CLUSTER = "prod"
SCHEDULE_S = 20           # the main DAG's schedule (a setting): short, so the test sees several scheduled runs
SCHEDULE = f"{SCHEDULE_S}s"


class Airflow:
    """An Airflow deployment in ``home``: three server processes, the CLI and the REST API (all admins).
    Every process starts in ``cwd``, which must stay empty."""

    def __init__(self, home: Path, cwd: Path, env: dict, port: int):
        self.home, self.cwd, self.env, self.port = home, cwd, env, port
        self.processes: list[ServerProcess] = []
        self.children: dict[int, psutil.Process] = {}

    def cli(self, *args: str, timeout: float = 180) -> str:
        done = subprocess.run([str(AIRFLOW), *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=self.cwd)
        assert done.returncode == 0, f"airflow {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
        return done.stdout

    def start(self, *commands: str) -> None:
        for command in commands:
            log_path = self.home / f"{command}.log"
            with open(log_path, "ab") as log:
                popen = subprocess.Popen([str(AIRFLOW), command], env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.cwd,
                                         start_new_session=True)
            self.processes.append(ServerProcess(command, popen, log_path))

    def api(self, path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v2/{path}", timeout=10) as r:
            return json.loads(r.read())

    def runs(self, dag_id: str) -> list:
        return self.api(f"dags/{dag_id}/dagRuns?order_by=run_after&limit=100")["dag_runs"]

    def tasks(self, dag_id: str, run_id: str) -> list:
        run = urllib.parse.quote(run_id, safe="")
        return self.api(f"dags/{dag_id}/dagRuns/{run}/taskInstances")["task_instances"]

    def wait(self, what: str, ready, timeout: float = 480):
        """Poll ``ready()`` until it returns something true; fail with the servers' log tails if it does not.
        (A hang guard, not a speed check: at load 17 on 2 cores the first Spark batch alone passed 240 s.)"""
        deadline = time.monotonic() + timeout
        while True:
            for proc in self.processes:
                assert proc.alive(), f"{proc.name} died while waiting for {what}:\n{proc.log_tail(40)}"
                self._remember_children(proc)
            try:
                got = ready()
            except OSError:           # the api-server is not listening yet
                got = None
            if got:
                return got
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {p.name}\n{p.log_tail(25)}" for p in self.processes)
                pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
            time.sleep(1)

    def _remember_children(self, proc: ServerProcess) -> None:
        try:
            for child in psutil.Process(proc.pid).children(recursive=True):
                self.children.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def stop(self) -> None:
        """SIGTERM each server by PID (scheduler first), then any child process of theirs still running."""
        for proc in self.processes:
            self._remember_children(proc)
        for proc in reversed(self.processes):
            proc.stop(timeout=30)
        for child in self.children.values():
            try:
                if child.is_running():
                    child.terminate()
                    child.wait(10)
            except psutil.NoSuchProcess:
                pass
            except psutil.TimeoutExpired:
                child.kill()


def _deployment_env(home: Path, port: int, settings_file: Path, kafka_bootstrap: str, s3) -> dict:
    """What an operator sets up: Airflow's own configuration, the connections, the CASSANDRA_CDC_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "CASSANDRA_CDC_"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "3",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p]),
        # the README's setup: connections for Kafka and S3, the settings file, the schedules
        "AIRFLOW_CONN_CASSANDRA_CDC_KAFKA": json.dumps({"conn_type": "generic", "host": kafka_bootstrap}),
        "AIRFLOW_CONN_CASSANDRA_CDC_S3": json.dumps({
            "conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
            "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region}}),
        "CASSANDRA_CDC_CONFIG": str(settings_file),
        "CASSANDRA_CDC_SCHEDULE": SCHEDULE,
        "CASSANDRA_CDC_MAINTENANCE_SCHEDULE": "none",     # triggered by hand here (hourly by default)
    })
    return env


def _ship(workload: Workload, schema, root: Path, wave: int, n: int, store) -> list:
    """One wave: ``n`` writes dated now, as every replica's segments, shipped by each node's agent."""
    workload.clock_us = max(workload.clock_us, clock_start_us())
    cw = write_cluster_segments(root / f"wave{wave}", schema, n, seed=wave, workload=workload,
                                segment_size=64 * 1024, segment_id_base=1_763_000_000_000 + wave * 10_000_000)
    shipped = 0
    for node in sorted(cw.segments):
        agent = Agent(AgentConfig(cdc_raw=root / f"wave{wave}" / node, store_url=store.url, cluster=CLUSTER,
                                  node=node, state_dir=root / "agent-state" / node), store=store)
        shipped += agent.run_once()
    assert shipped == sum(len(v) for v in cw.segments.values())
    return cw.mutations


def _manifests(store) -> list:
    return [P.Batch.from_dict(store.get_json(k)) for k in store.list(f"{Layout.LEDGER}/batches/")]


def _idle(store) -> list:
    """The batch manifests once nothing is left to do (nothing in incoming/, no request, every batch archived)."""
    if store.list(Layout.area_prefix(Layout.INCOMING, CLUSTER)) or store.exists(P.SWEEP_REQUEST_KEY) \
            or store.exists(P.SNAPSHOT_REQUEST_KEY):
        return []
    batches = _manifests(store)
    return batches if batches and all(b.state == "archived" for b in batches) else []


def _task_log(home: Path, dag_id: str, run_id: str, task_id: str) -> list:
    path = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}" / "attempt=1.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_table(airflow: Airflow, store) -> tuple[str, list]:
    """The runs of the three DAGs, oldest first: state, seconds per task, the batch a cassandra_cdc run did."""
    by_run = {b.claimed_by: b for b in _manifests(store)}
    rows, lines = [], []
    for dag_id in DAG_IDS:
        for run in airflow.runs(dag_id):
            tis = {t["task_id"]: t for t in airflow.tasks(dag_id, run["dag_run_id"])}
            rows.append((run["start_date"] or "", dag_id, run, tis))
    rows.sort(key=lambda r: r[0])
    for _, dag_id, run, tis in rows:
        batch = by_run.get(run["dag_run_id"])
        what = ("" if dag_id != "cassandra_cdc" else "nothing to do" if batch is None else
                f"{batch.batch_id}: " + ("snapshot" if batch.snapshot else "TTL sweep" if batch.sweep
                                         else f"{len(batch.segments)} segments")
                + f", {batch.steps.get('publish', {}).get('events', 0)} events")
        steps = "  ".join(f"{t}={'%.1f' % ti['duration'] if ti.get('duration') is not None else ti['state']}"
                          for t, ti in tis.items())
        lines.append(f"{dag_id:26} {run['dag_run_id']:46} {run['run_type']:9} {run['state']:8} {steps}"
                     + (f"   [{what}]" if what else ""))
    return "\n".join(lines), rows


# a task instance the executor has or will run: a paused DAG's scheduler schedules no other
_WORKING = ("queued", "running", "restarting")


def _pause_between_runs(airflow: Airflow, dag_id: str, attempts: int = 5) -> None:
    """Pause ``dag_id`` with every run of it finished. The scheduler neither starts nor goes on with a paused DAG's
    runs: a run it created or started just before the pause would stay queued, or running with its next tasks
    never scheduled (a wait for every run to finish once timed out so, every run in the scheduler's log a success).
    Such a run is let finish: unpaused until it has, then paused again."""
    for _ in range(attempts):
        airflow.cli("dags", "pause", dag_id)

        def unfinished_runs_once_no_task_works():
            runs = [r for r in airflow.runs(dag_id) if r["state"] not in ("success", "failed")]
            if any(ti["state"] in _WORKING for r in runs for ti in airflow.tasks(dag_id, r["dag_run_id"])):
                return None
            return (runs,)
        (left,) = airflow.wait(f"{dag_id}'s running tasks to end after the pause", unfinished_runs_once_no_task_works)
        if not left:
            return
        ids = {r["dag_run_id"] for r in left}
        airflow.cli("dags", "unpause", dag_id)
        airflow.wait(f"{dag_id} runs the pause held back to finish: {sorted(ids)}", lambda: all(
            r["state"] in ("success", "failed") for r in airflow.runs(dag_id) if r["dag_run_id"] in ids))
    pytest.fail(f"{dag_id}: no pause between runs in {attempts} attempts")


@pytest.mark.timeout(1500)
def test_scheduled_runs_under_a_real_airflow(tmp_path, kafka_broker, s3_server, s3_bucket):
    t_start = time.monotonic()
    timings = {}
    schema = sample_schema()
    schema_file = tmp_path / "schema.cql"
    schema_file.write_text(SAMPLE_SCHEMA_CQL)
    store_url = f"s3://{s3_bucket}/cdc"
    topic_prefix = f"sched{uuid.uuid4().hex[:6]}"
    settings_file = tmp_path / "cassandra-cdc.yaml"          # the agents' file too: their keys are skipped
    settings_file.write_text(f"store_url: {store_url}\ncluster: {CLUSTER}\n"
                             f"agent:\n  poll_interval: 5\npipeline:\n  schema_file: {schema_file}\n")
    home, cwd = tmp_path / "airflow", tmp_path / "scheduler-cwd"
    home.mkdir()
    cwd.mkdir()
    port = free_port()
    airflow = Airflow(home, cwd, _deployment_env(home, port, settings_file, kafka_broker, s3_server), port)
    store = P.open_store(P.PipelineConfig(store_url=store_url, s3_endpoint_url=s3_server.endpoint_url,
                                          s3_access_key=s3_server.access_key, s3_secret_key=s3_server.secret_key))
    try:
        airflow.cli("db", "migrate")
        airflow.start("api-server", "dag-processor", "scheduler")
        # driver_batch_max_bytes 0: every stream batch on Spark, whose JVM output the logs check
        variable = {"topic_prefix": topic_prefix, "max_segments": 100, "warn_no_segments_s": 900,
                    "driver_batch_max_bytes": 0}
        airflow.cli("variables", "set", P.SETTINGS_VARIABLE, json.dumps(variable))     # while the servers start
        airflow.wait("the three DAGs parsed and served",
                     lambda: set(DAG_IDS) <= {d["dag_id"] for d in airflow.api("dags")["dags"]})
        assert all(d["is_paused"] for d in airflow.api("dags")["dags"])      # every DAG is created paused
        timings["airflow up"] = time.monotonic() - t_start

        # many TTLs: the sweep must find 60 s TTLs still alive at the last batch, whatever the random stream
        workload = Workload(schema, seed=11, start_us=clock_start_us(), ttl_fraction=1.0)
        mutations = _ship(workload, schema, tmp_path / "cassandra", 1, 150, store)
        shipped = len(store.list(Layout.area_prefix(Layout.INCOMING, CLUSTER)))
        airflow.cli("dags", "unpause", "--treat-dag-id-as-regex", "-y", "^cassandra_cdc")
        airflow.wait("a scheduled run to process wave 1", lambda: _idle(store))
        timings["wave 1 processed"] = time.monotonic() - t_start
        mutations += _ship(workload, schema, tmp_path / "cassandra", 2, 150, store)
        shipped += len(store.list(Layout.area_prefix(Layout.INCOMING, CLUSTER)))
        batches = airflow.wait("scheduled runs to process wave 2",
                               lambda: sum(len(b.segments) for b in _idle(store)) == shipped and _idle(store))
        timings["wave 2 processed"] = time.monotonic() - t_start

        airflow.cli("dags", "trigger", "cassandra_cdc_backfill")
        # The sweep comes once every 60 s TTL alive at the last batch has run out, so that it has expiries.
        time.sleep(max(0.0, max(b.now for b in batches) + 62 - time.time()))
        airflow.cli("dags", "trigger", "cassandra_cdc_maintenance")
        airflow.wait("the backfill and maintenance runs", lambda: all(
            [r["state"] for r in airflow.runs(d)] == ["success"] for d in DAG_IDS[1:]))

        def snapshot_and_sweep_done():
            batches = _idle(store)
            return batches if any(b.snapshot for b in batches) and any(b.sweep for b in batches) else None
        batches = airflow.wait("the snapshot and sweep batches", snapshot_and_sweep_done, 360)
        timings["snapshot and sweep processed"] = time.monotonic() - t_start
        _pause_between_runs(airflow, "cassandra_cdc")
        batches = _idle(store)      # with any batch a run took after the snapshot and the sweep
        assert batches, "a cassandra_cdc run left a batch unfinished"

        table, rows = _run_table(airflow, store)
        print("\nruns (seconds per task):\n" + table)
        assert all(run["state"] == "success" for _, _, run, _ in rows), table
        retried = [(run["dag_run_id"], t, ti["try_number"]) for _, _, run, tis in rows for t, ti in tis.items()
                   if ti["try_number"] > 1]
        assert retried == [], f"tasks that failed before they succeeded (see their attempt=1.log): {retried}"
        with_segments = [b for b in batches if b.segments]
        assert len(with_segments) >= 2 and sum(len(b.segments) for b in with_segments) == shipped
        for b in batches:                           # no trigger conf: every batch was a scheduled run's
            assert b.claimed_by.startswith("scheduled__"), (b.batch_id, b.claimed_by)
        assert {r[2]["run_type"] for r in rows if r[1] != "cassandra_cdc"} == {"manual"}

        # Kafka: each event exactly once, each batch's events what its manifest says it published, and the
        # stream replayed in order what Cassandra shows at the last batch's processing time.
        in_kafka: dict = {}                          # batch id -> [event values]
        for t in (t for t in schema.tables.values() if not t.keyspace.startswith("system")):
            records = consume_topic(kafka_broker, table_topic(topic_prefix, t.keyspace, t.name))
            ids = [r.event_id for r in records]
            assert len(ids) == len(set(ids)), f"{t.name}: an event is in Kafka twice"
            replayed: dict = {}
            for r in records:
                in_kafka.setdefault(r.batch, []).append(r.value)
                if r.value["after"] is None:
                    replayed.pop(r.key, None)
                else:
                    replayed[r.key] = r.value["after"]
            assert replayed == json_table(t, model_table(t, mutations, max(b.now for b in batches))), t.name
        assert {b.batch_id: b.steps["publish"]["events"] for b in batches if b.steps["publish"]["events"]} == \
            {batch: len(events) for batch, events in in_kafka.items()}
        # TTL expiries: every sweep batch publishes expiries only, and together they publish some. (On a slow machine
        # a scheduled run may sweep before the maintenance DAG asks, leaving the asked-for sweep nothing to do.)
        sweeps = [b for b in batches if b.sweep]
        assert sweeps and any(in_kafka.get(b.batch_id) for b in sweeps), [b.batch_id for b in sweeps]
        for b in batches:
            events = in_kafka.get(b.batch_id, [])
            if b.sweep:
                assert all(e["source"]["expired"] for e in events), b.batch_id
            if b.snapshot:
                assert events and all(e["op"] == "r" for e in events), b.batch_id

        # Logs: a successful transform logs nothing at error level, no loopback warning, its summary first; nor
        # does a follow task, which runs batches of its own in the rest of the run's interval.
        with_spark, windows = 0, []
        for _, dag_id, run, tis in rows:
            for task_id in ("transform", "follow"):
                if tis.get(task_id, {}).get("state") != "success":
                    continue                          # skipped: the run had nothing to do
                log = _task_log(home, dag_id, run["dag_run_id"], task_id)
                errors = [e["event"] for e in log if e.get("level") == "error"]
                assert errors == [], f"{run['dag_run_id']}: error-level lines on success:\n" + "\n".join(errors)
                assert not any("loopback address" in str(e.get("event")) for e in log)
                ours = [e for e in log if str(e.get("logger", "")).startswith("cassandra_cdc")]
                first = {"transform": "transform: batch ", "follow": "follow: taking batches for "}[task_id]
                assert ours[0]["event"].startswith(first), ours[:3]
                if task_id == "follow":
                    windows.append((run, tis[task_id], ours[0]))
                with_spark += any(e["logger"] == "cassandra_cdc.spark.jvm" for e in ours)  # the JVM's output, routed
        assert with_spark >= 2
        # A scheduled run follows until follow_margin_s (default) before the next run is due, SCHEDULE_S after it
        # was: its follow task's window is what was left of that at a moment between the task's start and its first
        # line (0 where the run's own batch took longer, as on a slow CI machine: a positive window is not asked for).
        assert windows and all(run["run_type"] == "scheduled" for run, _, _ in windows)
        for run, ti, line in windows:
            assert not line["event"].endswith("none in a manual run"), line
            window = float(line["event"].split()[4])
            ends = datetime.fromisoformat(run["run_after"]) + timedelta(
                seconds=SCHEDULE_S - P.PipelineConfig.follow_margin_s)
            at_most, at_least = ((ends - datetime.fromisoformat(at)).total_seconds()
                                 for at in (ti["start_date"], line["timestamp"]))
            assert max(0.0, at_least) - 0.05 <= window <= max(0.0, at_most) + 0.05, (run, ti, line)
        # Where the settings came from, as the first task of a run logs them; a healthy store, no warning.
        claim_log = "\n".join(str(e.get("event"))
                              for e in _task_log(home, "cassandra_cdc", batches[0].claimed_by, "claim"))
        for source in (f"config file {settings_file}", "Airflow Variable cassandra_cdc_settings",
                       "Airflow connection cassandra_cdc_s3", "environment CASSANDRA_CDC_SCHEDULE"):
            assert source in claim_log, source
        assert store.get_json(P.METRICS_KEY)["last"]["claim"]["warnings"] == []
        assert os.listdir(cwd) == [], "something was written to the scheduler's working directory"
        timings["checked"] = time.monotonic() - t_start

        # A spark-submit job that fails: its output is in the transform's task log as Airflow stored it. The
        # Variable turns spark_submit on with a driver memory the JVM refuses (it exits at once, naming it); the
        # next scheduled run claims a third wave.
        airflow.cli("variables", "set", P.SETTINGS_VARIABLE, json.dumps({
            **variable, "spark_submit": True, "spark_submit_bin": str(Path(sys.executable).parent / "spark-submit"),
            "spark_conf": {"spark.driver.memory": "bogus"}}))
        _ship(workload, schema, tmp_path / "cassandra", 3, 20, store)
        airflow.cli("dags", "unpause", "cassandra_cdc")
        run_id = airflow.wait("a transform attempt to fail", lambda: next(
            (r["dag_run_id"] for r in airflow.runs("cassandra_cdc")
             if any(t["task_id"] == "transform" and t["state"] in ("up_for_retry", "failed")
                    for t in airflow.tasks("cassandra_cdc", r["dag_run_id"]))), None))
        log = _task_log(home, "cassandra_cdc", run_id, "transform")
        job_lines = [e["event"] for e in log if e.get("logger") == "cassandra_cdc.spark.job"]
        assert "Invalid maximum heap size: -Xmxbogus" in job_lines, job_lines     # the job's output, line by line
        errors = "\n".join(json.dumps(e) for e in log if e.get("level") == "error")
        assert "SparkJobError" in errors and "spark-submit failed (exit status 1)" in errors, errors
        assert "Invalid maximum heap size: -Xmxbogus" in errors, errors    # the tail, in the task's error
        timings["failed submit logged"] = time.monotonic() - t_start
        print("timings (s since the test started): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    finally:
        airflow.stop()
    for proc in airflow.processes:
        assert not proc.alive(), proc.name
