"""End-to-end benchmark of the pipeline (not a test): N generated writes on 3 nodes (RF 3) -> agents -> S3 ->
claim -> Spark job -> Kafka -> archive, on the embedded servers (SeaweedFS, Apache Kafka) and local Spark.

    .venv/bin/python benchmarks/bench_pipeline.py [--mutations 5000] [--max-segments 64] [--no-overlap]
        [--airflow] [--cluster] [--s3-volume-mb 1024]
    .venv/bin/python benchmarks/bench_pipeline.py --driver-memory 2000,8000

Prints events/s end to end, the share of each step (Spark start-up, the Spark job, publish, archive), the
Spark job's own stages (``spark.merge_job.LAST_TIMINGS`` summed over batches: where it ran, driver or Spark
tasks, and parse / group / reconcile / outbox / state MERGE seconds; in-process runs only), a single-process
profile of the Spark job's three phases (decode, reconcile, Delta write: the same functions the executors
run, timed without Spark), this process's CPU time and page faults during the run and its peak resident size
(in-process runs), and the latency from "segment uploaded" to "event in Kafka" (Kafka's record timestamp minus
the time the agent finished uploading the segment the event came from).

The steps run as a scheduled run's ``follow`` task runs them (``pipeline.run_until_idle``): with
``overlap_batches``, a batch is published and archived while the next one is claimed and transformed;
``--no-overlap`` turns that off, one batch after the other (the baseline to compare with). The step shares are
each step's own seconds from the batch manifests.

``--airflow`` runs the pipeline through ``airflow dags test cassandra_cdc`` instead of calling the steps in
process (the task boundaries and Spark start-up in the DAG process are then part of the time; the step shares
come from the batch manifests).

``--cluster`` then runs the same segments again with ``spark-submit`` on a Spark standalone cluster
(``demo.servers.run_spark_cluster``) of 1 and then 2 workers (1 core each), each into a fresh store prefix and
topics, and prints events/s of the three runs side by side (the in-process run is the baseline), with the job's
stages as the job reported them: delta-spark's MERGE (``state_merge`` on the cluster) beside deltalake's (the
in-process run on a local master writes with delta-rs when the batch is small, else with delta-spark locally).

``--driver-memory N1,N2,...`` runs only this: for each number of writes, the whole workload as ONE batch with
``spark-submit`` on a 2-worker standalone cluster, and prints the peak resident memory of the job's driver (its JVM
and its Python process) beside that of the executors' processes, one row per batch size. The executors parse,
reconcile and write; the driver only plans and commits, so its peak should not grow with the batch. Peaks are the
kernel's high-water marks (``VmHWM`` in ``/proc/<pid>/status``: Linux), read every 0.1 s until each process ends.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cdc_lib import pipeline as P  # noqa: E402
from cdc_lib.agent.shipper import Agent  # noqa: E402
from cdc_lib.demo.servers import run_kafka_broker, run_s3_server, run_spark_cluster  # noqa: E402
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, Workload, sample_schema, write_cluster_segments  # noqa: E402
from cdc_lib.settings import AgentConfig  # noqa: E402
from cdc_lib.spark import merge_job  # noqa: E402


def _profile_phases(paths: list, schema, now: int, work: Path) -> dict:
    """Decode, reconcile and Delta write of the same segments in one process (no Spark), with the state engine
    ``CASSANDRA_CDC_NATIVE`` picks: reconcile is the batch's time outside the store's writes."""
    from cdc_lib.celllog.reader import read_cell_log
    from cdc_lib.sinks.delta import DeltaRsStateStore, run_store_batch
    t0 = time.perf_counter()
    cells = list(read_cell_log(paths, schema, on_damage=lambda d: None))
    t1 = time.perf_counter()
    store = DeltaRsStateStore(str(work / "profile-delta"))
    writing = [0.0]

    def timed(write):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return write(*args, **kwargs)
            finally:
                writing[0] += time.perf_counter() - start
        return run
    store.write_outbox, store.commit = timed(store.write_outbox), timed(store.commit)
    run_store_batch(store, schema, cells, batch_id="profile", batch_seq=1, now=now)
    t2 = time.perf_counter()
    return {"decode": t1 - t0, "reconcile": t2 - t1 - writing[0], "delta_write": writing[0]}


def _kafka_timestamps(bootstrap: str, prefix: str) -> list:
    """[(segment, node, kafka timestamp ms)] of every event in the prefix's topics."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient
    topics = [t for t in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
              if t.startswith(prefix + ".")]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                  "enable.partition.eof": True, "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    out = []
    try:
        for topic in topics:
            c.assign([TopicPartition(topic, 0, 0)])
            while True:
                m = c.poll(5)
                if m is None or (m.error() and m.error().code() == KafkaError._PARTITION_EOF):
                    break
                if m.error():
                    raise RuntimeError(m.error())
                src = json.loads(m.value())["source"]
                out.append((src.get("segment"), src.get("node"), m.timestamp()[1]))
    finally:
        c.close()
    return out


def upload_to_kafka_seconds(stamps: list, uploaded: dict) -> list:
    """Sorted seconds from "segment uploaded" to "event in Kafka" of each event: ``stamps`` as
    ``_kafka_timestamps`` gives them, ``uploaded`` {(node, segment): unix time its upload finished}."""
    lat = []
    for seg, node, ts_ms in stamps:
        up = uploaded.get((node, seg))
        if up is None:   # the event's source names one replica's segment; any node's copy is fine
            ups = [v for (n, s), v in uploaded.items() if s == seg]
            up = min(ups) if ups else None
        if up is not None:
            lat.append(ts_ms / 1000 - up)
    return sorted(lat)


def percentile(ordered: list, q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, nearest rank below."""
    return ordered[int(q * (len(ordered) - 1))]


def _stages_text(stages: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in stages.items() if k not in ("mode",) and isinstance(v, float))


def _cluster_run(workers: int, cfg, pristine: Path, work: Path) -> dict:
    """Ship ``pristine``'s segments into a fresh prefix of the store and run the pipeline with spark-submit on a
    standalone cluster of ``workers`` workers; events, wall seconds and the job's stages summed over batches."""
    import dataclasses
    import os
    import shutil
    raw = work / f"cassandra-w{workers}"
    shutil.copytree(pristine, raw)
    with run_spark_cluster(work / f"spark-w{workers}", workers=workers) as cluster:
        os.environ.update(cluster.env)      # spark-submit's environment: loopback only, this Python
        run_cfg = dataclasses.replace(
            cfg, store_url=f"s3://bench/cdc-w{workers}", topic_prefix=f"bench-w{workers}", spark_submit=True,
            spark_master=cluster.master_url, spark_submit_bin=str(Path(sys.executable).parent / "spark-submit"),
            spark_conf={"spark.executor.memory": "768m", "spark.sql.shuffle.partitions": str(2 * workers),
                        "spark.databricks.delta.snapshotPartitions": "2"})
        store = P.open_store(run_cfg)
        for node in sorted(p.name for p in raw.iterdir()):
            Agent(AgentConfig(cdc_raw=raw / node, store_url=run_cfg.store_url, cluster=run_cfg.cluster, node=node,
                              state_dir=work / f"agent-w{workers}" / node), store=store).run_once()
        t0 = time.perf_counter()
        batches = P.run_until_idle(run_cfg)
        wall = time.perf_counter() - t0
    stages: dict = {}
    for b in batches:
        for k, v in b.steps.get("transform", {}).get("job_stages_s", {}).items():
            if isinstance(v, (int, float)):
                stages[k] = stages.get(k, 0.0) + float(v)
    return {"workers": workers, "wall_s": wall, "stages": stages,
            "events": sum(b.steps.get("publish", {}).get("events", 0) for b in batches)}


class PeakMemory:
    """Peak resident memory of the Spark processes this process starts while the block runs, by role: the driver of
    a ``spark-submit`` job (``driver_jvm``: SparkSubmit; ``driver_python``: the job's Python process, the JVM's
    child), and executor JVMs and their Python workers (``executor_jvm``/``python_worker``: the largest single one).
    Values in MiB; each process's peak is the kernel's high-water mark (VmHWM), read until the process ends."""

    ROLES = ("driver_jvm", "driver_python", "executor_jvm", "python_worker")

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self._peaks: dict = {}          # pid -> (role, KiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def _hwm_kib(pid: int) -> int:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    @staticmethod
    def _roles(procs: list) -> dict:
        """{pid: role} of ``procs`` ((pid, parent pid, command line)): the JVMs by their main class, then Python
        processes by their parent's role."""
        roles = {}
        for pid, _, cmd in procs:
            if "org.apache.spark.deploy.SparkSubmit" in cmd:
                roles[pid] = "driver_jvm"
            elif "CoarseGrainedExecutorBackend" in cmd:
                roles[pid] = "executor_jvm"
        found = True
        while found:            # pyspark.daemon under an executor, the workers it forks under the daemon
            found = False
            for pid, ppid, cmd in procs:
                parent = roles.get(ppid)
                if pid in roles or parent is None:
                    continue
                if parent == "driver_jvm" and "merge_batch.py" in cmd:
                    roles[pid] = "driver_python"
                elif parent in ("executor_jvm", "python_worker"):
                    roles[pid] = "python_worker"
                else:
                    continue
                found = True
        return roles

    def _run(self) -> None:
        import psutil
        me = psutil.Process()
        while not self._stop.is_set():
            procs = []
            for proc in me.children(recursive=True):
                try:
                    procs.append((proc.pid, proc.ppid(), " ".join(proc.cmdline())))
                except psutil.Error:
                    continue
            for pid, role in self._roles(procs).items():
                try:
                    self._peaks[pid] = (role, max(self._hwm_kib(pid), self._peaks.get(pid, (role, 0))[1]))
                except OSError:
                    continue        # ended since the listing: its last reading stands
            self._stop.wait(self.interval_s)

    def peaks_mib(self) -> dict:
        """{role: MiB}: the driver's processes each, the largest executor-side process of each kind."""
        out = dict.fromkeys(self.ROLES, 0.0)
        for role, kib in self._peaks.values():
            out[role] = max(out[role], kib / 1024)
        return out


def _driver_memory(sizes: list, max_segments: int, segment_size: int) -> int:
    """``--driver-memory``: each workload size as one spark-submit batch on a 2-worker cluster; peak memory by role."""
    import os
    work = Path(tempfile.mkdtemp(prefix="bench-driver-memory-"))
    schema = sample_schema()
    schema_file = work / "schema.cql"
    schema_file.write_text(SAMPLE_SCHEMA_CQL)
    rows = []
    with run_kafka_broker(work / "kafka") as broker, run_s3_server(work / "weed", bucket="bench") as s3, \
            run_spark_cluster(work / "spark", workers=2) as cluster:
        os.environ.update(cluster.env)
        for n in sizes:
            workload = Workload(schema, seed=1)
            cw = write_cluster_segments(work / f"cassandra-{n}", schema, n, seed=1, workload=workload,
                                        segment_size=segment_size)
            paths = [x for v in cw.segments.values() for x in v]
            mb = sum(Path(x).stat().st_size for x in paths) / 1e6      # before the agents ship (and delete) them
            cfg = P.PipelineConfig(
                store_url=f"s3://bench/mem-{n}", s3_endpoint_url=s3.endpoint_url, s3_access_key=s3.access_key,
                s3_secret_key=s3.secret_key, cluster="bench", schema_file=str(schema_file),
                kafka_bootstrap=broker.bootstrap, now=workload.clock_us // 1_000_000 + 5, topic_prefix=f"mem-{n}",
                max_segments=max(max_segments, len(paths)), max_bytes=1 << 40, spark_submit=True,
                spark_master=cluster.master_url, spark_submit_bin=str(Path(sys.executable).parent / "spark-submit"),
                spark_conf={"spark.executor.memory": "768m", "spark.sql.shuffle.partitions": "4",
                            "spark.databricks.delta.snapshotPartitions": "2"})
            store = P.open_store(cfg)
            for node in sorted(cw.segments):
                Agent(AgentConfig(cdc_raw=work / f"cassandra-{n}" / node, store_url=cfg.store_url, cluster="bench",
                                  node=node, state_dir=work / f"agent-{n}" / node), store=store).run_once()
            t0 = time.perf_counter()
            with PeakMemory() as peaks:
                batches = P.run_until_idle(cfg)
            wall = time.perf_counter() - t0
            events = sum(b.steps.get("publish", {}).get("events", 0) for b in batches)
            rows.append((n, len(batches), len(paths), mb, events, wall, peaks.peaks_mib()))
    print("peak resident memory of one spark-submit batch (MiB; 2 workers, spark.executor.memory 768m, "
          "driver memory Spark's default):")
    print(f"  {'writes':>7s} {'batches':>7s} {'segments':>8s} {'MB':>6s} {'events':>7s} {'wall s':>7s}  "
          f"{'driver JVM':>10s} {'driver Py':>9s}  {'executor JVM':>12s} {'Py worker':>9s}")
    for n, nb, nseg, mb, events, wall, pk in rows:
        print(f"  {n:7d} {nb:7d} {nseg:8d} {mb:6.1f} {events:7d} {wall:7.1f}  {pk['driver_jvm']:10.0f} "
              f"{pk['driver_python']:9.0f}  {pk['executor_jvm']:12.0f} {pk['python_worker']:9.0f}")
    print("  (driver: the spark-submit JVM and the job's Python process; executor columns: the largest one process)")
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mutations", type=int, default=5000)
    p.add_argument("--max-segments", type=int, default=64)
    p.add_argument("--segment-size", type=int, default=1 << 20)
    p.add_argument("--airflow", action="store_true", help="run through `airflow dags test cassandra_cdc`")
    p.add_argument("--driver-batch-max-mib", type=int, default=None,
                   help="driver_batch_max_bytes in MiB: batches up to this size run in the process, without Spark "
                        "(default: the setting's default)")
    p.add_argument("--s3-volume-mb", type=int, default=1024,
                   help="the embedded S3 server's volume size (demo.servers.run_s3_server): at 64, the tests' size, "
                        "writes wait up to 1 s each time weed grows the bucket's next volume")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="overlap_batches off: each batch published and archived before the next is claimed")
    p.add_argument("--cluster", action="store_true",
                   help="also run with spark-submit on a standalone cluster of 1, then 2 workers")
    p.add_argument("--driver-memory", metavar="N1,N2", default=None,
                   help="only this: peak memory of the spark-submit driver with each number of writes in one batch")
    a = p.parse_args(argv)
    if a.driver_memory:
        return _driver_memory([int(x) for x in a.driver_memory.split(",")], a.max_segments, a.segment_size)

    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        return _measure(a, work)
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)     # ~650 MB at 135,000 writes: segments, copies, the store's data


def _usage_since(before) -> str:
    """This process's CPU and page faults since the ``getrusage`` reading ``before``, and its peak resident size.
    Faults count the pages the kernel mapped in (and zeroed, for fresh memory): see ``cdc_lib.allocator``."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return (f"user {now.ru_utime - before.ru_utime:.2f} s, system {now.ru_stime - before.ru_stime:.2f} s, "
            f"{now.ru_minflt - before.ru_minflt:,} page faults, peak resident {now.ru_maxrss >> 10:,} MiB")


def _measure(a, work: Path) -> int:
    """The run ``main`` prints, in ``work`` (generated segments, the embedded servers' data)."""
    schema = sample_schema()
    workload = Workload(schema, seed=1)
    t = time.perf_counter()
    cw = write_cluster_segments(work / "cassandra", schema, a.mutations, seed=1, workload=workload,
                                segment_size=a.segment_size)
    gen_s = time.perf_counter() - t
    paths = [str(x) for v in cw.segments.values() for x in v]
    n_segments = len(paths)
    now = workload.clock_us // 1_000_000 + 5
    schema_file = work / "schema.cql"
    schema_file.write_text(SAMPLE_SCHEMA_CQL)
    print(f"generated {a.mutations} writes -> {cw.replica_copies} commit-log entries in {n_segments} segments "
          f"({sum(Path(x).stat().st_size for x in paths) / 1e6:.1f} MB) in {gen_s:.1f} s")
    profile = _profile_phases(paths, schema, now, work)

    import shutil
    pristine = work / "cassandra-copy"          # the agents delete what they ship: the cluster runs ship a copy
    shutil.copytree(work / "cassandra", pristine)

    with run_kafka_broker(work / "kafka") as broker, \
            run_s3_server(work / "weed", bucket="bench", volume_size_mb=a.s3_volume_mb) as s3:
        cfg = P.PipelineConfig(store_url="s3://bench/cdc", s3_endpoint_url=s3.endpoint_url,
                               s3_access_key=s3.access_key, s3_secret_key=s3.secret_key, cluster="bench",
                               schema_file=str(schema_file), kafka_bootstrap=broker.bootstrap, now=now,
                               max_segments=a.max_segments, max_bytes=1 << 40, topic_prefix="bench",
                               **({} if a.driver_batch_max_mib is None else
                                  {"driver_batch_max_bytes": a.driver_batch_max_mib << 20}))
        store = P.open_store(cfg)
        uploaded: dict = {}
        t_ship = time.perf_counter()
        for node in sorted(cw.segments):
            hooks = {"after_upload": lambda name, node=node: uploaded.__setitem__((node, name), time.time())}
            Agent(AgentConfig(cdc_raw=work / "cassandra" / node, store_url=cfg.store_url, cluster="bench",
                              node=node, state_dir=work / "agent" / node), store=store, hooks=hooks).run_once()
        ship_s = time.perf_counter() - t_ship

        steps = {"spark_start": 0.0, "claim": 0.0, "spark_job": 0.0, "publish": 0.0, "archive": 0.0}
        job_stages: dict = {}       # merge_job.LAST_TIMINGS summed over batches (in-process runs)
        modes: list = []
        t_run = time.perf_counter()
        if a.airflow:
            from cdc_lib.demo.run import airflow_db_migrate, airflow_env, dags_test
            home = work / "airflow"
            home.mkdir()
            env = airflow_env(home, kafka_bootstrap=broker.bootstrap, s3=s3)
            airflow_db_migrate(env)
            t_run = time.perf_counter()
            conf = {"store_url": cfg.store_url, "cluster": "bench", "schema_file": str(schema_file), "now": now,
                    "max_segments": a.max_segments, "max_bytes": 1 << 40, "topic_prefix": "bench"}
            while store.list("incoming/bench/"):
                dags_test("cassandra_cdc", env, conf, work / "dags-test.log")
            batches = [P.Batch.from_dict(store.get_json(k)) for k in store.list("ledger/batches/")]
        else:
            run_batch = merge_job.run_batch

            def summed_run_batch(*args, **kwargs):     # each batch's job stages, summed
                res = run_batch(*args, **kwargs)
                for k, v in merge_job.LAST_TIMINGS.items():
                    if k == "mode":
                        modes.append(v)
                    else:
                        job_stages[k] = job_stages.get(k, 0.0) + v
                return res
            merge_job.run_batch = summed_run_batch
            used = resource.getrusage(resource.RUSAGE_SELF)
            try:            # the product's own loop: what a scheduled run's follow task does
                batches = P.run_until_idle(dataclasses.replace(cfg, overlap_batches=a.overlap))
            finally:
                merge_job.run_batch = run_batch
            process_use = _usage_since(used)
        run_s = time.perf_counter() - t_run
        for b in batches:       # each step's own duration, from the batch manifests
            s = b.steps
            steps["spark_start"] += s.get("transform", {}).get("spark_start_s", 0.0)
            steps["claim"] += s.get("claim", {}).get("duration_s", 0.0)
            steps["spark_job"] += s.get("transform", {}).get("duration_s", 0.0)
            steps["publish"] += s.get("publish", {}).get("duration_s", 0.0)
            steps["archive"] += s.get("archive", {}).get("duration_s", 0.0)
        steps["spark_job"] -= steps["spark_start"]
        events = sum(b.steps.get("publish", {}).get("events", 0) for b in batches)
        lat = upload_to_kafka_seconds(_kafka_timestamps(broker.bootstrap, "bench"), uploaded)
        cluster_runs = []
        if a.cluster:
            P.stop_spark()        # the in-process session's JVM would compete with the cluster for the cores
            for workers in (1, 2):
                cluster_runs.append(_cluster_run(workers, cfg, pristine, work))
    P.stop_spark()

    total = sum(steps.values())
    print(f"pipeline: {len(batches)} batches, {events} events in {run_s:.1f} s -> {events / run_s:.0f} events/s "
          f"end to end ({cw.replica_copies / run_s:.0f} commit-log entries/s); agents shipped in {ship_s:.1f} s"
          + (" [airflow dags test]" if a.airflow else
             " [steps in process, run_until_idle, overlap_batches %s]" % ("on" if a.overlap else "off")))
    overlapped = not a.airflow and a.overlap
    print("step shares" + (" (steps' own seconds: a batch's publish and archive overlap the next one's claim and "
                           "transform, so they add up to more than the run)" if overlapped else "") + ":")
    for k, v in steps.items():
        print(f"  {k:12s} {v:8.2f} s  {100 * v / total:5.1f} %")
    if job_stages:
        print(f"Spark job stages (run_batch, summed over batches; ran in: "
              f"{', '.join(f'{m} x{modes.count(m)}' for m in sorted(set(modes)))}):")
        jtotal = job_stages.get("total", 0.0)
        for k, v in job_stages.items():
            if k != "total":
                print(f"  {k:16s} {v:8.2f} s  {100 * v / jtotal if jtotal else 0:5.1f} %")
        print(f"  {'total':16s} {jtotal:8.2f} s (run_batch; the rest of spark_job is staging and bookkeeping)")
    ptotal = sum(profile.values())
    print("Spark job phases, single-process profile of the same functions (no Spark):")
    for k, v in profile.items():
        print(f"  {k:12s} {v:8.2f} s  {100 * v / ptotal:5.1f} %")
    if cluster_runs:
        baseline = events / run_s
        print("scale-out (same segments; events/s end to end, claim -> spark job -> publish -> archive):")
        print(f"  {'run':34s} {'events/s':>9s} {'x base':>7s} {'wall s':>7s}  job stages (s, summed over batches)")
        print(f"  {'in process, ' + ', '.join(sorted(set(modes))) + ' (baseline)':34s} {baseline:9.0f} "
              f"{1.0:7.2f} {run_s:7.1f}  " + _stages_text(job_stages))
        for r in cluster_runs:
            rate = r["events"] / r["wall_s"]
            print(f"  {'spark-submit, %d worker(s)' % r['workers']:34s} {rate:9.0f} {rate / baseline:7.2f} "
                  f"{r['wall_s']:7.1f}  " + _stages_text(r["stages"]))
        print("  (a spark-submit batch pays a new driver and executors: JVM start-up is part of its wall time)")
    if not a.airflow:
        print(f"this process during the run: {process_use}")
    if lat:
        print(f"segment uploaded -> event in Kafka: median {statistics.median(lat):.1f} s, "
              f"p95 {percentile(lat, 0.95):.1f} s, max {lat[-1]:.1f} s over {len(lat)} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
