"""Soak with faults (a script, not a timed test): the pipeline on a real local Cassandra 5.0 node under a steady
write load for ``--minutes``, while its processes are killed at seeded random moments; then the load stops,
everything drains, and the end state is checked.

    nice .venv/bin/python benchmarks/soak.py [--minutes 20] [--seed 1] [--rate 50] [--fault-every 60]
                                             [--faults agent,cassandra,kafka,task,spark-worker] [--work DIR] [--keep]
                                             [--spark-cluster] [--airflow]

What runs, each as its own process: Cassandra 5.0 (``demo.cassandra.LocalCassandra``, one node: the machine this
was written on has 2 cores), Apache Kafka (one KRaft broker, ``demo.servers.run_kafka_broker``), the agent
(``python -m cdc_lib.cli agent``) and the pipeline, claim -> transform -> publish -> archive, run after run. The
store is a local directory. The load is cassandra-driver writes at ``--rate`` per second: inserts (text of 0.5-3
KB), updates of a column and of a set, row and partition deletes, over 400 partitions of 8 rows. Cassandra's
commit-log segments are 1 MiB (the smallest it takes), so at 50 writes/s one closes about every 20 s: that period
is most of the end-to-end lag.

How the pipeline runs; by default, the cheapest that still kills a task mid-batch:

* **default**: one process per batch calling ``run_once`` (what one DAG run's tasks do), started again as soon as
  it ends; the batches of a steady load are small and run in that process without Spark (the ``driver``
  transform, what production uses for batches under ``driver_batch_max_bytes``; ``max_bytes`` is set to that so
  a backlog after an outage does not switch a batch to Spark).
* ``--spark-cluster``: every batch's transform goes through ``spark-submit`` (the pipeline's ``spark_submit``
  mode) to a standalone Spark master and one worker (1 core, one 512 MiB executor; ``demo.servers
  .run_spark_cluster``), the job reading the segments from the store and writing Delta with delta-spark; the
  ``spark-worker`` fault joins the others. One worker: on 2 cores a second would only take CPU from Cassandra.
* ``--airflow``: the pipeline runs as the real ``cassandra_cdc`` DAG's tasks, configured as in production (the
  settings file named by ``CASSANDRA_CDC_CONFIG``, the Kafka connection), with the DAG's own retries: its runs one
  after the other in one Airflow process, ``demo.dag_runner`` (``DAG.test()``, what ``airflow dags test`` runs;
  its tasks run in that process). The ``task`` fault SIGKILLs that process while it runs a task, which is killing
  the running Airflow task (and, under ``--spark-cluster``, its spark-submit job, which dies with its parent);
  the process is started again for the next run (Airflow's imports and the DAG folder parsed: the figures print
  how long each start took). Why not a real scheduler (api-server, dag-processor, scheduler, as
  ``tests/test_airflow_scheduler.py`` starts them): measured in the README's 20-minute run, the one Airflow process
  took 260-570 MiB and 27-58 s per start, and a spark-submit batch alone 1-4 minutes of the 2 cores beside
  Cassandra, Kafka, a Spark master, worker, driver and executor; a scheduler is three Airflow processes of the
  kind (not measured here) polling their database all the time. The DAG file, the task code, the retries and the
  kill are the same; what a scheduler adds (a run queued every minute, a killed task found as a zombie) is that
  test's subject.

Faults, one at a time, in a seeded random order (every kind once per round), at seeded random intervals (0.5 to
1.5 times ``--fault-every`` seconds):

* ``agent``: SIGKILL, started again 1-5 s later;
* ``cassandra``: SIGKILL (no shutdown hook, no last sync of the commit log), started again on its data;
* ``kafka``: SIGKILL, started again on the same data and ports;
* ``task``: SIGKILL of the running pipeline task (or of the Airflow process running it) 1 s to 0.8 times the last
  batch's run time into a run that has segments to process (the next run resumes its batch);
* ``spark-worker`` (``--spark-cluster`` only): SIGKILL of the Worker JVM while one of its executors runs a batch's
  job (when one does within two minutes), started again 3-10 s later on its work directory. Its executors lose
  their worker and exit; the job gets an executor on the new worker (Spark retries the lost tasks) or fails, and
  then the pipeline's retry (the DAG's task retry, or the next run) finishes the batch: exactly once, as the
  checks below say.

At the end: the load stops, Cassandra's rows are read (``SELECT *``), ``nodetool drain`` closes the live segment,
the agent ships what is left, the pipeline runs until idle (in this process, as configured: under
``--spark-cluster`` with spark-submit); then the checks, each printed with its figures:

* the Delta state equals ``SELECT *`` (``demo.compare``: typed values and the driver's own);
* every event in Kafka has a unique id, and replaying the topics (``after`` of the last event per key, none after
  a delete) gives exactly ``SELECT *``: each change once, none lost;
* nothing is left in ``incoming/`` and every batch is archived;
* and, that the soak meant something, writes were acknowledged again within a minute after each fault.

Writes Cassandra acknowledged but lost when SIGKILLed (its periodic commit-log sync acknowledges before the bytes
are durable: up to 10 s) are Cassandra's loss: the checks compare with what Cassandra returns after its restarts,
as ``tests/test_real_faults.py`` does; the count of acknowledged writes is printed beside it for scale.

Figures over time, every ``--sample-every`` seconds: writes/s acknowledged, events/s published, end-to-end lag
p50/p95 of the segments published in the window (exact: the segment's close time from the batch manifest to its
batch's ledger marker, not the histogram's buckets), segments waiting in ``incoming/``, and the RSS of each
process (under ``--spark-cluster`` also the master, the worker, a batch's spark-submit job (driver JVM and its
Python) and the executor (JVM and its Python workers), each summed). Printed as a table, written to
``<work>/soak.json`` and plotted to ``<work>/soak.svg`` (``--plot``). Exit status 0 when every check passed, 1
otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from cdc_lib import pipeline as P  # noqa: E402
from cdc_lib.agent.cdc_raw import holds_data, scan_cdc_raw  # noqa: E402
from cdc_lib.agent.shipper import Agent  # noqa: E402
from cdc_lib.cql.schema_from_ddl import load_cql_schema  # noqa: E402
from cdc_lib.demo.cassandra import LocalCassandra, describe  # noqa: E402
from cdc_lib.demo.compare import (Comparison, compare_native, compare_table, delta_live_rows,  # noqa: E402
                                  select_json, select_native, select_rows)
from cdc_lib.demo.run import airflow_db_migrate, airflow_env, consume_all  # noqa: E402
from cdc_lib.demo.servers import run_kafka_broker, run_spark_cluster  # noqa: E402
from cdc_lib.pipeline.batches import batch_id_for, read_batch, read_pointer  # noqa: E402
from cdc_lib.settings import AgentConfig  # noqa: E402
from cdc_lib.storage.layout import Layout  # noqa: E402

KS, TABLE, CLUSTER, NODE = "soak", "t", "soak", "node1"
PARTITIONS, ROWS = 400, 8
FAULTS = ("agent", "cassandra", "kafka", "task", "spark-worker")

# One batch, in a process of its own: what one run of the cassandra_cdc DAG does (its tasks call these steps).
TASK = """
import json, sys
from cdc_lib import pipeline as P
batch = P.run_once(P.PipelineConfig(**json.loads(sys.argv[1])), run_id=sys.argv[2])
print(json.dumps({"batch": batch.batch_id, "empty": batch.empty}))
"""


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------ processes

class Kafka:
    """The broker, killed with SIGKILL and started again on the same data and ports."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self._cm = None
        self.broker = None

    def start(self) -> None:
        self._cm = run_kafka_broker(self.workdir, timeout=180)
        self.broker = self._cm.__enter__()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.broker.pid, signal.SIGKILL)
        self.stop()

    def stop(self) -> None:
        if self._cm is not None:
            self._cm.__exit__(None, None, None)       # reaps it (stops it first if still running)
            self._cm = None

    @property
    def pid(self):
        return self.broker.pid if self._cm is not None else None


class AgentProcess:
    """``cassandra-cdc agent`` in its own process, logging to ``<work>/agent.log``."""

    def __init__(self, config: AgentConfig, log: Path, env: dict):
        self.config, self.log, self.env = config, log, env
        self.proc = None

    def start(self) -> None:
        c = self.config
        argv = [sys.executable, "-m", "cdc_lib.cli", "agent", "--cdc-raw", str(c.cdc_raw), "--store-url", c.store_url,
                "--cluster", c.cluster, "--node", c.node, "--state-dir", str(c.state_dir), "--poll-interval", "1",
                "--max-backoff", "5"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         stdin=subprocess.DEVNULL)

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


class TaskLoop(threading.Thread):
    """Runs the pipeline as one process per batch, again and again, until stopped; counts how runs ended."""

    def __init__(self, cfg: P.PipelineConfig, log: Path, env: dict):
        super().__init__(daemon=True, name="tasks")
        self.cfg_json = json.dumps(dataclasses.asdict(cfg), default=str)
        self.log, self.env = log, env
        self.stop_event = threading.Event()
        self.proc = None
        self.started_at = 0.0
        self.runs = {"batch": 0, "empty": 0, "killed": 0, "failed": 0}
        self.last_batch_s = 10.0                # how long the last run that processed a batch took
        self._n = 0

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self._n += 1
                ended = self.run_one()
                self.runs[ended] += 1
                if ended == "batch":
                    self.last_batch_s = time.monotonic() - self.started_at
                elif ended != "killed":
                    self.stop_event.wait(2.0)   # nothing to do, or a failure (Kafka down): the next run a moment later
        finally:
            self.close()

    def run_one(self) -> str:
        """One run: "batch", "empty", "killed" (SIGKILLed) or "failed" (e.g. Kafka down: the next run retries)."""
        with open(self.log, "ab") as err:
            err.write(f"--- task run {self._n} at {time.strftime('%H:%M:%S')}\n".encode())
            err.flush()
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen([sys.executable, "-c", TASK, self.cfg_json, f"soak-{self._n}"],
                                         stdout=subprocess.PIPE, stderr=err, env=self.env, stdin=subprocess.DEVNULL)
            out, _ = self.proc.communicate()
        rc = self.proc.returncode
        if rc == -signal.SIGKILL:
            return "killed"
        if rc != 0:
            return "failed"
        return "empty" if json.loads(out.decode().strip().splitlines()[-1])["empty"] else "batch"

    def running_pid(self):
        p = self.proc
        return p.pid if p is not None and p.poll() is None else None

    def close(self) -> None:
        """Nothing stays running after the loop (a run under way was let finish)."""


class AirflowTaskLoop(TaskLoop):
    """The ``cassandra_cdc`` DAG's runs, one after the other, in one Airflow process (``demo.dag_runner``:
    ``DAG.test()``, what ``airflow dags test`` runs; its tasks run in that process, with the DAG's retries). The
    ``task`` fault SIGKILLs that process in the middle of a task; it is started again (Airflow's imports and the
    DAG folder parsed again) for the next run. Whether a run processed a batch: the store's last batch changed."""

    def __init__(self, cfg: P.PipelineConfig, log: Path, env: dict, store):
        super().__init__(cfg, log, env)
        self.store = store
        self.runner = None
        self.starts: list = []                  # seconds each start of the Airflow process took (parse, warm-up)
        self._running = False

    def _progress(self) -> tuple:
        seq = int(read_pointer(self.store).get("batch_seq", 0))
        return seq, read_batch(self.store, batch_id_for(seq)).state if seq else None

    def run_one(self) -> str:
        from cdc_lib.demo.dag_runner import DagRunFailed, DagRunner
        if self.runner is None:
            t0 = time.monotonic()
            try:
                self.runner = DagRunner(self.env, self.log).__enter__()
            except DagRunFailed:
                return "failed"
            self.starts.append(round(time.monotonic() - t0, 1))
        before = self._progress()
        self.started_at = time.monotonic()
        self._running = True
        try:
            self.runner.run("cassandra_cdc", {})
        except DagRunFailed:
            if self.runner.proc.poll() is None:
                return "failed"                 # a task failed after the DAG's retries: the next run resumes
            killed = self.runner.proc.returncode == -signal.SIGKILL
            self.close()
            return "killed" if killed else "failed"
        finally:
            self._running = False
        return "batch" if self._progress() != before else "empty"

    def running_pid(self):
        r = self.runner
        return r.pid if self._running and r is not None and r.proc.poll() is None else None

    def close(self) -> None:
        if self.runner is not None:
            self.runner.__exit__(None, None, None)      # ends it (SIGKILL if it does not stop) and reaps it
            self.runner = None


# ------------------------------------------------------------------------------------------------ the load

class Writer(threading.Thread):
    """cassandra-driver writes at ``rate`` per second (seeded); failures while the node is down are counted."""

    def __init__(self, cluster: LocalCassandra, rate: float, seed: int):
        super().__init__(daemon=True, name="writer")
        from cassandra.cluster import Cluster
        from cassandra.policies import ConstantReconnectionPolicy
        # Reconnect every second, for ever: the default policy backs off to minutes, and a constant one gives up
        # after 64 attempts (a restart of the node takes longer here).
        self.driver = Cluster(cluster.contact_points, port=cluster.native_port, protocol_version=5,
                              connect_timeout=30, control_connection_timeout=30,
                              reconnection_policy=ConstantReconnectionPolicy(1.0, max_attempts=None))
        self.session = self.driver.connect(KS)
        self.session.default_timeout = 30
        s = self.session
        self.stmts = {
            "insert": s.prepare(f"INSERT INTO {TABLE} (k, c, v, n, tags) VALUES (?, ?, ?, ?, ?)"),
            "update_n": s.prepare(f"UPDATE {TABLE} SET n = ? WHERE k = ? AND c = ?"),
            "add_tag": s.prepare(f"UPDATE {TABLE} SET tags = tags + ? WHERE k = ? AND c = ?"),
            "delete_row": s.prepare(f"DELETE FROM {TABLE} WHERE k = ? AND c = ?"),
            "delete_partition": s.prepare(f"DELETE FROM {TABLE} WHERE k = ?"),
        }
        self.rate, self.rng = rate, random.Random(seed)
        self.stop_event = threading.Event()
        self.acked = self.failed = 0

    def _one(self) -> tuple:
        r, k, c = self.rng.random(), self.rng.randrange(PARTITIONS), self.rng.randrange(ROWS)
        if r < 0.55:
            # ~1 KB a write on average: at 50 writes/s a 1 MiB segment closes about every 20 s
            text = "".join(self.rng.choices("abcdefghij ", k=self.rng.randrange(500, 3000)))
            return "insert", (k, c, text, self.rng.getrandbits(40), {f"t{self.rng.randrange(20)}"})
        if r < 0.75:
            return "update_n", (self.rng.getrandbits(40), k, c)
        if r < 0.85:
            return "add_tag", ({f"t{self.rng.randrange(20)}"}, k, c)
        if r < 0.97:
            return "delete_row", (k, c)
        return "delete_partition", (k,)

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            name, values = self._one()
            try:
                self.session.execute(self.stmts[name], values)
                self.acked += 1
            except Exception:  # noqa: BLE001 - the node is down or restarting: not acknowledged, go on
                self.failed += 1
                self.stop_event.wait(0.5)
            next_at = max(next_at + 1.0 / self.rate, time.monotonic() - 1.0)   # no burst after an outage
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def close(self) -> None:
        self.stop_event.set()
        self.join(60)
        self.driver.shutdown()


# ------------------------------------------------------------------------------------------------ faults

class Faults(threading.Thread):
    """One fault at a time, every kind once per round in a seeded order, at seeded random intervals."""

    def __init__(self, soak: "Soak", kinds: list, every: float, until: float, seed: int):
        super().__init__(daemon=True, name="faults")
        self.soak, self.kinds, self.every, self.until = soak, kinds, every, until
        self.rng = random.Random(seed)
        self.log: list = []            # (t, kind, seconds to recover, note)
        self.stop_event = threading.Event()

    def run(self) -> None:
        order: list = []
        while True:
            wait = self.rng.uniform(0.5, 1.5) * self.every
            if time.monotonic() + wait > self.until or self.stop_event.wait(wait):
                return
            if not order:
                order = self.rng.sample(self.kinds, len(self.kinds))
            kind = order.pop()
            t = self.soak.elapsed()
            t0 = time.monotonic()
            try:
                note = getattr(self, "_" + kind.replace("-", "_"))()
            except Exception as e:  # noqa: BLE001 - reported; the soak goes on and the checks decide
                note = f"FAILED: {type(e).__name__}: {e}"
            self.log.append((round(t, 1), kind, round(time.monotonic() - t0, 1), note))
            say(f"fault at {t:.0f} s: {kind} ({note}; back after {time.monotonic() - t0:.1f} s)")

    def _agent(self) -> str:
        pid = self.soak.agent.pid
        self.soak.agent.kill()
        time.sleep(self.rng.uniform(1, 5))
        self.soak.agent.start()
        return f"agent pid {pid} SIGKILLed, started again"

    def _cassandra(self) -> str:
        pid = self.soak.cassandra.node(1).pid
        self.soak.cassandra.kill_node(1)
        time.sleep(self.rng.uniform(1, 5))
        self.soak.cassandra.start_node(1, timeout=600)
        return f"Cassandra pid {pid} SIGKILLed, started again on its data"

    def _kafka(self) -> str:
        pid = self.soak.kafka.pid
        self.soak.kafka.kill()
        time.sleep(self.rng.uniform(1, 5))
        self.soak.kafka.start()
        return f"Kafka pid {pid} SIGKILLed, started again on its data"

    def _task(self) -> str:
        """SIGKILL the running task (the task process, or the Airflow process running the DAG's tasks) at a random
        moment between 1 s (or half the last batch's run time, when that is less than 2 s) and 0.8 times the last
        batch's run time into a run that has segments to process (or a batch to resume): before the end a run of
        the last one's length would reach. On a quiet machine a batch in process takes 3-5 s (a kill 10 s in never
        came); on a fast one a whole run took less than a second, and a kill no sooner than 1 s in never came
        either. A run that ends before is let go and the next one tried."""
        tasks, soak = self.soak.tasks, self.soak
        for _ in range(240):
            pid = tasks.running_pid()
            waiting = len(soak.store.list(Layout.area_prefix(Layout.INCOMING, CLUSTER)))
            if pid is not None and waiting:
                last = tasks.last_batch_s
                earliest = min(1.0, 0.5 * last)
                target = tasks.started_at + self.rng.uniform(earliest, max(earliest, 0.8 * last))
                time.sleep(max(0.0, target - time.monotonic()))
                job = "; its Spark job was running" if soak.spark is not None and _spark_jobs(pid) else ""
                killed_before = tasks.runs["killed"]
                if tasks.running_pid() == pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    into = time.monotonic() - tasks.started_at
                    # the run may have ended on its own just before the signal: then it was not killed, and the
                    # next run is tried (the loop counts how each run ended)
                    deadline = time.monotonic() + 60
                    while tasks.runs["killed"] == killed_before and time.monotonic() < deadline:
                        time.sleep(0.1)
                    if tasks.runs["killed"] > killed_before:
                        what = "Airflow process (DAG.test) running the task" if soak.args.airflow else "task"
                        return (f"{what} pid {pid} SIGKILLed {into:.1f} s into its run ({waiting} segment(s) in "
                                f"incoming/{job})")
            time.sleep(0.5)
        return f"no task ran long enough to be killed (the last batch's run: {tasks.last_batch_s:.1f} s)"

    def _spark_worker(self) -> str:
        """SIGKILL the Spark worker's JVM, while one of its executors runs a batch's job when one does within two
        minutes; started again 3-10 s later. Its executors lose their worker (they exit); the job waits for an
        executor on the new worker or fails, and the pipeline's retry finishes the batch."""
        cluster = self.soak.spark
        executors: list = []
        for _ in range(240):
            executors = _executors(cluster.worker_pid(1))
            if executors:
                break
            time.sleep(0.5)
        pid = cluster.kill_worker(1)
        time.sleep(self.rng.uniform(3, 10))
        left = [e.pid for e in executors if e.is_running()]
        cluster.start_worker(1)
        return (f"Spark worker pid {pid} SIGKILLed " + (f"with {len(executors)} executor(s) of a running job "
                                                         f"({len(left)} still alive when it started again)"
                                                         if executors else "(no job was running)")
                + ", started again")


def _descendants(pid) -> list:
    try:
        return psutil.Process(pid).children(recursive=True) if pid else []
    except psutil.Error:
        return []


def _cmdline(proc) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _spark_jobs(pid) -> list:
    """The spark-submit driver JVMs under process ``pid`` (a task: its transform's job)."""
    return [p for p in _descendants(pid) if "org.apache.spark.deploy.SparkSubmit" in _cmdline(p)]


def _executors(worker_pid) -> list:
    """The executor JVMs the Spark worker ``worker_pid`` runs."""
    return [p for p in _descendants(worker_pid) if "CoarseGrainedExecutorBackend" in _cmdline(p)]


# ------------------------------------------------------------------------------------------------ figures

def _pctl(values: list, q: float):
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


class Sampler(threading.Thread):
    """Every ``every`` seconds: rates, lag of the segments published since, backlog, RSS of each process."""

    def __init__(self, soak: "Soak", every: float):
        super().__init__(daemon=True, name="sampler")
        self.soak, self.every = soak, every
        self.rows: list = []
        self.stop_event = threading.Event()
        self._seen_seq = 0
        self._events = 0
        self._acked = 0
        self.lags: list = []            # (t published, end-to-end lag s) of every segment, for the summary

    def _published_lags(self) -> list:
        """End-to-end lags of the segments of batches published since the last call: the ledger marker's time
        (written when the batch's events are all in Kafka) minus the segment's close time in the manifest."""
        store, root = self.soak.store, self.soak.store_dir
        seq = int(read_pointer(store).get("batch_seq", 0))
        out = []
        while self._seen_seq < seq:
            batch_id = batch_id_for(self._seen_seq + 1)
            marker = root / Layout.ledger(batch_id)
            if not marker.exists():
                break                   # not published yet: looked at again next time
            published = marker.stat().st_mtime
            batch = read_batch(store, batch_id)
            out += [published - s["closed_at"] for s in batch.segments if "closed_at" in s]
            self._seen_seq += 1
        return out

    def sample(self) -> dict:
        soak = self.soak
        metrics = P.read_metrics(soak.cfg) if soak.store.exists("checkpoints/metrics.json") else {}
        events = (metrics.get("totals") or {}).get("publish.events", 0)
        acked = soak.writer.acked if soak.writer else self._acked
        lags = self._published_lags()
        t = soak.elapsed()
        self.lags += [(t, x) for x in lags]
        rss = {}
        for name, procs in soak.processes().items():
            total = 0
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            if total:
                rss[name] = round(total / 2 ** 20, 1)
        row = {"t": round(t, 1), "writes_per_s": round((acked - self._acked) / self.every, 1),
               "events_per_s": round((events - self._events) / self.every, 1),
               "lag_p50_s": _round(_pctl(lags, 0.5)), "lag_p95_s": _round(_pctl(lags, 0.95)),
               "segments_published": len(lags),
               "incoming": len(soak.store.list(Layout.area_prefix(Layout.INCOMING, CLUSTER))),
               "rss_mib": rss}
        self._events, self._acked = events, acked
        return row

    def run(self) -> None:
        while not self.stop_event.wait(self.every):
            try:
                self.rows.append(self.sample())
                r = self.rows[-1]
                say(f"t={r['t']:.0f}s writes/s {r['writes_per_s']} events/s {r['events_per_s']} lag p50/p95 "
                    f"{r['lag_p50_s']}/{r['lag_p95_s']} s incoming {r['incoming']} RSS MiB {r['rss_mib']}")
            except Exception as e:  # noqa: BLE001 - a file caught mid-rename: the next sample
                say(f"sample failed: {type(e).__name__}: {e}")


def _round(v):
    return None if v is None else round(v, 1)


def write_svg(path: Path, rows: list, faults: list, title: str, load_end: float | None = None) -> None:
    """Three stacked charts over time (rates, lag, RSS), fault moments (and the end of the load) as labelled
    vertical lines; no library."""
    w, h, pad, gap = 900, 190, 50, 40
    panels = [("writes/s and events/s", [("writes/s", "writes_per_s", "#888"), ("events/s", "events_per_s", "#1565c0")]),
              ("end-to-end lag (s), segments published in each window",
               [("p50", "lag_p50_s", "#2e7d32"), ("p95", "lag_p95_s", "#c62828")]),
              ("RSS (MiB)", [(name, ("rss_mib", name), color) for name, color in
                             zip(sorted({n for r in rows for n in r["rss_mib"]}),
                                 ["#6a1b9a", "#ef6c00", "#00838f", "#5d4037", "#1565c0", "#9e9d24"])])]
    t_max = max([r["t"] for r in rows] + [f[0] for f in faults] + [1])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{len(panels) * (h + gap) + 40}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="{pad}" y="20" font-size="14">{_esc(title)}</text>']

    def value(r, key):
        return r[key[0]].get(key[1]) if isinstance(key, tuple) else r.get(key)

    for i, (name, series) in enumerate(panels):
        top = 40 + i * (h + gap)
        vals = [value(r, k) for r in rows for _, k, _ in series if value(r, k) is not None]
        y_max = max(vals + [1e-9]) * 1.1
        sx = lambda t: pad + t / t_max * (w - 2 * pad)                         # noqa: E731
        sy = lambda v: top + h - v / y_max * h                                 # noqa: E731
        out.append(f'<text x="{pad}" y="{top - 6}">{_esc(name)}</text>')
        out.append(f'<rect x="{pad}" y="{top}" width="{w - 2 * pad}" height="{h}" fill="none" stroke="#ccc"/>')
        out.append(f'<text x="4" y="{top + 10}">{y_max:.0f}</text><text x="4" y="{top + h}">0</text>')
        marks = [(t, kind, "#f0a") for t, kind, _, _ in faults]
        if load_end is not None:
            marks.append((load_end, "load stops, drain", "#555"))
        for n, (t, label, color) in enumerate(marks):
            right = sx(t) > w - pad - 100            # near the right edge: the label goes left of its line
            out.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top}" y2="{top + h}" stroke="{color}" '
                       f'stroke-dasharray="3,3"/><text x="{sx(t) + (-2 if right else 2):.1f}" '
                       f'y="{top + 10 + 11 * (n % 2)}" text-anchor="{"end" if right else "start"}" '
                       f'fill="{color}">{_esc(label)}</text>')
        for j, (label, key, color) in enumerate(series):
            pts = [(sx(r["t"]), sy(value(r, key))) for r in rows if value(r, key) is not None]
            if pts:
                out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="'
                           + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
                out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{color}"/>' for x, y in pts]
            out.append(f'<text x="{w - pad - 120}" y="{top + 14 + 12 * j}" fill="{color}">{_esc(label)}</text>')
        out.append(f'<text x="{pad}" y="{top + h + 14}">0 s</text>'
                   f'<text x="{w - pad - 30}" y="{top + h + 14}">{t_max:.0f} s</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def _esc(s: str) -> str:
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ------------------------------------------------------------------------------------------------ the soak

class Soak:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work or tempfile.mkdtemp(prefix="cdc-soak-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.store_dir = self.work / "store"
        self.store_dir.mkdir(exist_ok=True)
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.cassandra = LocalCassandra(self.work / "cassandra", 1, cluster_name="soak")
        self.kafka = Kafka(self.work / "kafka")
        self.agent = self.tasks = self.writer = self.faults = self.cfg = self.store = self.spark = None
        self._servers = contextlib.ExitStack()          # the Spark cluster
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def processes(self) -> dict:
        """{name: [psutil processes]} whose memory the figures show, summed per name."""
        pids = {"cassandra": self.cassandra.node(1).pid if self.cassandra.node(1).running() else None,
                "kafka": self.kafka.pid, "agent": self.agent.pid if self.agent else None,
                "soak (load, sampler)": os.getpid()}
        if self.args.airflow:
            pids["airflow (DAG.test)"] = self.tasks.runner.pid if self.tasks and self.tasks.runner else None
        else:
            pids["task"] = self.tasks.running_pid() if self.tasks else None
        if self.spark is not None:
            pids["spark master"], pids["spark worker"] = self.spark.pids[0], self.spark.worker_pid(1)
        out = {}
        for name, pid in pids.items():
            with contextlib.suppress(psutil.Error):
                if pid is not None:
                    out[name] = [psutil.Process(pid)]
        if self.spark is not None:
            # a batch's spark-submit job (driver JVM and its Python: under a task, or this process in the drain)
            # and the worker's executors (JVM and Python workers): each the sum of its processes
            jobs = _spark_jobs(os.getpid())
            out["spark job (driver)"] = [q for j in jobs for q in [j, *_descendants(j.pid)]]
            out["spark executor"] = [q for e in _executors(self.spark.worker_pid(1))
                                     for q in [e, *_descendants(e.pid)]]
        return {k: v for k, v in out.items() if v}

    def _start_beside_cassandra(self) -> None:
        """What starts while Cassandra starts (none of it needs the node): Kafka, the Spark cluster, the Airflow
        database."""
        self.kafka.start()
        if self.args.spark_cluster:
            self.spark = self._servers.enter_context(run_spark_cluster(self.work / "spark", workers=1))
            self.env.update(self.spark.env)           # spark-submit's: loopback only, quiet logs, this Python
            os.environ.update(self.spark.env)         # the drain's batches run in this process
        if self.args.airflow:
            self.airflow_home = self.work / "airflow"
            self.airflow_home.mkdir(exist_ok=True)
            airflow_db_migrate(airflow_env(self.airflow_home, kafka_bootstrap="", s3=None))

    def start(self) -> None:
        more = (["a Spark master and worker"] if self.args.spark_cluster else []) + \
            (["the Airflow database"] if self.args.airflow else [])
        say(f"starting Cassandra 5.0 (1 node), Kafka{''.join(', ' + m for m in more)} under {self.work} ...")
        t0 = time.monotonic()
        errors: list = []
        k = threading.Thread(target=lambda: _catch(self._start_beside_cassandra, errors))
        k.start()
        self.cassandra.start(timeout=600)
        k.join()
        if errors:
            raise errors[0]
        say(f"  up in {time.monotonic() - t0:.0f} s: Cassandra pid {self.cassandra.node(1).pid}, "
            f"Kafka {self.kafka.broker.bootstrap} pid {self.kafka.pid}"
            + (f", Spark {self.spark.master_url} pids {self.spark.pids}" if self.spark else ""))
        session = self.cassandra.session()
        session.execute(f"CREATE KEYSPACE {KS} WITH replication = {{'class': 'SimpleStrategy', "
                        "'replication_factor': 1}")
        session.execute(f"CREATE TABLE {KS}.{TABLE} (k int, c int, v text, n bigint, tags set<text>, "
                        "PRIMARY KEY (k, c)) WITH cdc = true")
        schema_cql = describe(session, KS)
        self.cassandra.close_driver()
        (self.work / "schema.cql").write_text(schema_cql)
        self.schema = load_cql_schema(schema_cql)
        settings = dict(store_url=str(self.store_dir), cluster=CLUSTER, schema_file=str(self.work / "schema.cql"),
                        kafka_bootstrap=self.kafka.broker.bootstrap, topic_prefix=f"soak{uuid.uuid4().hex[:6]}",
                        kafka_timeout_s=10, max_bytes=P.PipelineConfig.driver_batch_max_bytes)
        if self.spark is not None:
            # every batch through spark-submit on the cluster (at most one executor of 512 MiB: 2 cores)
            settings.update(spark_submit=True, spark_master=self.spark.master_url,
                            spark_submit_bin=str(Path(sys.executable).parent / "spark-submit"),
                            spark_conf={"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2",
                                        "spark.databricks.delta.snapshotPartitions": "2"})
        self.cfg = P.PipelineConfig(**settings)
        self.store = P.open_store(self.cfg)
        self.agent_config = AgentConfig(cdc_raw=self.cassandra.node(1).cdc_raw, store_url=str(self.store_dir),
                                        cluster=CLUSTER, node=NODE, state_dir=self.work / "agent")
        self.agent = AgentProcess(self.agent_config, self.work / "agent.log", self.env)
        self.agent.start()
        if self.args.airflow:
            # The DAG's tasks read their settings as in production: the settings file (CASSANDRA_CDC_CONFIG) and
            # the Kafka connection; no trigger conf.
            settings_file = self.work / "cassandra-cdc.yaml"
            settings_file.write_text(json.dumps({"pipeline": settings}, indent=2))      # JSON is YAML
            env = {**airflow_env(self.airflow_home, kafka_bootstrap=self.kafka.broker.bootstrap, s3=None),
                   **(self.spark.env if self.spark else {}), "CASSANDRA_CDC_CONFIG": str(settings_file)}
            self.tasks = AirflowTaskLoop(self.cfg, self.work / "airflow.log", env, self.store)
        else:
            self.tasks = TaskLoop(self.cfg, self.work / "tasks.log", self.env)
        self.tasks.start()

    def run(self) -> dict:
        args = self.args
        self.start()
        self.writer = Writer(self.cassandra, args.rate, args.seed)
        self.t0 = time.monotonic()
        load_until = self.t0 + args.minutes * 60
        sampler = Sampler(self, args.sample_every)
        faults = self.faults = Faults(self, args.faults, args.fault_every, load_until, args.seed + 1)
        say(f"load: {args.rate:g} writes/s for {args.minutes:g} min; faults {','.join(args.faults)} every "
            f"{args.fault_every:g} s on average (seed {args.seed})")
        self.writer.start()
        sampler.start()
        faults.start()
        while time.monotonic() < load_until:
            time.sleep(1)
        faults.stop_event.set()
        faults.join()                                   # a fault under way ends with its process back
        self.writer.close()
        acked, failed = self.writer.acked, self.writer.failed
        say(f"load stopped at {self.elapsed():.0f} s: {acked} writes acknowledged, {failed} failed")
        result = self.drain_and_check()
        sampler.stop_event.set()
        sampler.join()
        sampler.rows.append(sampler.sample())           # the drain's batches
        result.update(writes_acked=acked, writes_failed=failed, faults=faults.log, samples=sampler.rows,
                      task_runs=self.tasks.runs, seconds=round(self.elapsed(), 1), mode=mode_of(args))
        if args.airflow:
            result["airflow_starts_s"] = self.tasks.starts
        result["checks"]["load_resumed_after_every_fault"] = _load_resumed(sampler.rows, faults.log,
                                                                           args.minutes * 60)
        all_lags = [x for _, x in sampler.lags]
        load_lags = [x for t, x in sampler.lags if t <= args.minutes * 60]
        result["lag_s"] = {"segments": len(all_lags), "p50": _round(_pctl(all_lags, 0.5)),
                           "p95": _round(_pctl(all_lags, 0.95)), "max": _round(max(all_lags, default=None)),
                           "p50_during_load": _round(_pctl(load_lags, 0.5)),
                           "p95_during_load": _round(_pctl(load_lags, 0.95))}
        hist = (P.read_metrics(self.cfg).get("histograms") or {}).get("end_to_end_lag_seconds") or {}
        result["end_to_end_lag_histogram_count"] = hist.get("count", 0)
        result["rss_max_mib"] = {name: max(r["rss_mib"].get(name, 0) for r in sampler.rows)
                                 for name in {n for r in sampler.rows for n in r["rss_mib"]}}
        return result

    def drain_and_check(self) -> dict:
        c = self.cassandra
        session = c.session(KS)
        table = self.schema.by_name(KS, TABLE)
        selected = select_rows(session, table, "ONE")
        native = select_native(session, table, "ONE")
        expected_json = select_json(session, table, "ONE")
        c.close_driver()
        say(f"{len(selected)} rows in Cassandra after the load; nodetool drain, then ship and process the rest")
        c.nodetool(1, "drain")
        self.agent.kill(signal.SIGTERM)
        agent = Agent(self.agent_config)
        deadline = time.monotonic() + 300
        while True:
            agent.run_once()
            left = [s.name for s in scan_cdc_raw(self.agent_config.cdc_raw).segments
                    if s.complete or (not s.orphaned and holds_data(s.path))]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(1)
        self.tasks.stop_event.set()
        self.tasks.join()
        done = P.run_until_idle(self.cfg)
        say(f"drained: {len(done)} more batch(es); cdc_raw still holds {left or 'no segment with data'}")
        checks = {}
        cmp = Comparison()
        compare_table(table, selected, delta_live_rows(P.delta_root(self.cfg, self.store), table), cmp)
        compare_native(table, native, delta_live_rows(P.delta_root(self.cfg, self.store), table), cmp)
        checks["delta_equals_select"] = (cmp.equal, cmp.summary())
        events = consume_all(self.kafka.broker.bootstrap, self.cfg.topic_prefix)
        ids = [v["id"] for _, _, v in events]
        dupes = len(ids) - len(set(ids))
        checks["event_ids_unique"] = (dupes == 0, f"{len(ids)} events in Kafka, {dupes} duplicate ids")
        replayed: dict = {}
        for _, key, value in events:            # per key, events are in one partition, in order
            k = _canon(key)
            if value["after"] is None:
                replayed.pop(k, None)
            else:
                replayed[k] = _canon(value["after"])
        expected = {_canon(json.loads(k)): _canon(v) for k, v in expected_json.items()}
        wrong = sorted(k for k in set(expected) | set(replayed) if expected.get(k) != replayed.get(k))
        checks["replay_equals_select"] = (not wrong, f"replaying the topics gives {len(replayed)} rows, SELECT * "
                                                     f"{len(expected)}; {len(wrong)} keys differ"
                                          + (f" (first: {wrong[:3]})" if wrong else ""))
        incoming = self.store.list(Layout.area_prefix(Layout.INCOMING, CLUSTER))
        checks["incoming_empty"] = (not incoming and not left, f"{len(incoming)} objects left in incoming/, "
                                                               f"{len(left)} segments with data in cdc_raw")
        seq = int(read_pointer(self.store).get("batch_seq", 0))
        states = [read_batch(self.store, batch_id_for(s)).state for s in range(1, seq + 1)]
        unarchived = [s for s in states if s != "archived"]
        checks["every_batch_archived"] = (not unarchived, f"{seq} batches, {len(unarchived)} not archived")
        return {"rows": len(selected), "events": len(ids), "batches": seq,
                "checks": {k: {"ok": ok, "detail": d} for k, (ok, d) in checks.items()}}

    def stop(self) -> None:
        """Everything this soak started, by PID (also after Ctrl-C: a fault under way ends first, so the process it
        is starting again is known)."""
        if self.faults is not None:
            self.faults.stop_event.set()
            self.faults.join(600)
        for stop in (lambda: self.tasks and self.tasks.stop_event.set(),
                     lambda: self.agent and self.agent.kill(signal.SIGTERM),
                     lambda: self.cassandra.stop(graceful=False), self.kafka.stop):
            with contextlib.suppress(Exception):
                stop()
        if self.tasks is not None and self.tasks.is_alive():
            with contextlib.suppress(Exception):
                pid = self.tasks.running_pid()
                if pid:
                    os.kill(pid, signal.SIGKILL)
            self.tasks.join(60)
        with contextlib.suppress(Exception):
            self._servers.close()                       # the Spark workers, then the master


def _load_resumed(rows: list, faults: list, load_end: float, within: float = 60.0) -> dict:
    """The soak means something only if the load went on: writes acknowledged again within ``within`` seconds of
    each fault's end (a fault that ended later than that before the end of the load is not judged)."""
    stalled = []
    for t, kind, took, _ in faults:
        back = t + took
        if back + within > load_end:
            continue
        if not any(back < r["t"] <= back + within and r["writes_per_s"] > 0 for r in rows):
            stalled.append(f"{kind} at {t:.0f} s")
    return {"ok": not stalled, "detail": f"{len(faults)} faults; no write acknowledged within {within:.0f} s "
                                         f"after: {', '.join(stalled)}" if stalled else
            f"{len(faults)} faults; writes acknowledged again within {within:.0f} s after each"}


def _canon(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _catch(fn, errors: list) -> None:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - handed to the main thread
        errors.append(e)


def mode_of(args) -> str:
    """How the pipeline ran, in words."""
    where = "spark-submit on a standalone Spark cluster" if args.spark_cluster else "in the task process, no Spark"
    how = "the cassandra_cdc DAG's tasks under Airflow (DAG.test)" if args.airflow else "one process per batch"
    return f"{how}; transform {where}"


def report(result: dict, args) -> bool:
    print()
    print(f"soak ({result['mode']}): {args.minutes:g} min of load at {args.rate:g} writes/s, faults every "
          f"{args.fault_every:g} s on average (seed {args.seed}); {result['seconds']:.0f} s in all")
    print(f"{'t s':>7} {'writes/s':>9} {'events/s':>9} {'lag p50':>8} {'lag p95':>8} {'segs':>5} {'incoming':>8}  "
          "RSS MiB")
    for r in result["samples"]:
        rss = " ".join(f"{k.split(' (')[0].replace(' ', '-')}={v:.0f}" for k, v in sorted(r["rss_mib"].items()))
        print(f"{r['t']:7.0f} {r['writes_per_s']:9.1f} {r['events_per_s']:9.1f} {_fmt(r['lag_p50_s']):>8} "
              f"{_fmt(r['lag_p95_s']):>8} {r['segments_published']:5d} {r['incoming']:8d}  {rss}")
    print("faults:")
    for t, kind, took, note in result["faults"]:
        print(f"  at {t:7.1f} s  {kind:9s} back after {took:5.1f} s  {note}")
    runs = result["task_runs"]
    print(f"pipeline task runs: {runs['batch']} batches, {runs['empty']} found nothing, {runs['killed']} killed, "
          f"{runs['failed']} failed (and were run again)"
          + (f"; the Airflow process started {len(result['airflow_starts_s'])} times, in "
             f"{', '.join(f'{x:g}' for x in result['airflow_starts_s'])} s" if "airflow_starts_s" in result else ""))
    lag = result["lag_s"]
    print(f"end-to-end lag (segment closed -> its batch's events in Kafka) over {lag['segments']} segments: p50 "
          f"{_fmt(lag['p50'])} s, p95 {_fmt(lag['p95'])} s, max {_fmt(lag['max'])} s (during the load: p50 "
          f"{_fmt(lag['p50_during_load'])} s, p95 {_fmt(lag['p95_during_load'])} s); the pipeline's "
          f"end_to_end_lag_seconds histogram counted {result['end_to_end_lag_histogram_count']}")
    print("RSS max (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(result["rss_max_mib"].items())))
    print(f"{result['writes_acked']} writes acknowledged ({result['writes_failed']} failed while a process was down); "
          f"{result['rows']} rows in Cassandra at the end; {result['events']} events in Kafka over "
          f"{result['batches']} batches")
    ok = True
    for name, c in result["checks"].items():
        print(f"  {'PASS' if c['ok'] else 'FAIL'} {name}: {c['detail']}")
        ok = ok and c["ok"]
    return ok


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0, help="minutes of write load (20)")
    p.add_argument("--rate", type=float, default=50.0, help="writes per second (50)")
    p.add_argument("--fault-every", dest="fault_every", type=float, default=60.0,
                   help="mean seconds between two faults (60)")
    p.add_argument("--faults", type=lambda s: [f for f in s.split(",") if f],
                   help="kinds of fault, comma-separated: " + ",".join(FAULTS) + " (default: each that applies; "
                        "spark-worker needs --spark-cluster)")
    p.add_argument("--spark-cluster", dest="spark_cluster", action="store_true",
                   help="run every batch with spark-submit on a standalone Spark master and one worker")
    p.add_argument("--airflow", action="store_true",
                   help="run the pipeline as the cassandra_cdc DAG's tasks under Airflow (DAG.test, one process)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sample-every", dest="sample_every", type=float, default=10.0,
                   help="seconds between two samples of the figures (10)")
    p.add_argument("--work", help="working directory (default: a new temporary one; the servers' data in it is "
                                  "removed after a passing run unless --keep or --work)")
    p.add_argument("--plot", help="SVG to write (default: <work>/soak.svg)")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    args = p.parse_args(argv)
    if args.faults is None:
        args.faults = [f for f in FAULTS if f != "spark-worker" or args.spark_cluster]
    unknown = set(args.faults) - set(FAULTS)
    if unknown:
        p.error(f"unknown fault {sorted(unknown)}: use {','.join(FAULTS)}")
    if "spark-worker" in args.faults and not args.spark_cluster:
        p.error("the spark-worker fault needs --spark-cluster (without it no batch runs on Spark)")
    soak = Soak(args)
    keep = args.keep or args.work is not None
    try:
        result = soak.run()
    finally:
        soak.stop()
    (soak.work / "soak.json").write_text(json.dumps(result, indent=2, default=str))
    plot = Path(args.plot) if args.plot else soak.work / "soak.svg"
    write_svg(plot, result["samples"], result["faults"],
              f"cassandra-cdc soak ({mode_of(args)}): {args.minutes:g} min, {args.rate:g} writes/s, seed {args.seed}",
              load_end=args.minutes * 60)
    ok = report(result, args)
    if not keep and ok:                 # the servers' data; the figures and the plot stay
        for sub in ("cassandra", "kafka", "store", "spark", "airflow"):
            shutil.rmtree(soak.work / sub, ignore_errors=True)
    print(f"figures: {soak.work / 'soak.json'}; plot: {plot}; logs: {soak.work}/agent.log, "
          + ("airflow.log" if args.airflow else "tasks.log") + (", spark/logs" if args.spark_cluster else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
