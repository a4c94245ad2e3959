"""Latency on a schedule (not a test): a steady write rate on 3 nodes (RF 3), each node's commit-log segments
closing at the pace the load fills them and shipped by the real agents, and the pipeline run as the
``cassandra_cdc`` DAG's one-minute schedule runs it; prints segment-upload -> event-in-Kafka p50/p95/max and
events/s of each way of running side by side.

    CASSANDRA_CDC_NATIVE=1 .venv/bin/python benchmarks/bench_latency.py [--rate 2000] [--seconds 300]

The segments are generated before the timed part (the generator's CPU would compete with the pipeline): the
workload's writes at ``--rate`` per second, every write on all 3 nodes, in real segment files of
``--segment-mib`` (Cassandra's default 32 MiB). Write i is taken at ``i / rate`` s, and a segment closes when the
writes up to its last byte have been taken. The nodes' segment boundaries fall a third of a segment apart in the
write stream (a cluster's nodes did not start their commit logs together: node k's log starts with a segment that
closed before the timed part, ``write_cluster_segments(skip=...)``), so each arriving segment holds new writes and
replica copies of writes another node shipped; ``--lockstep`` puts the boundaries at the same writes on every
node instead (one segment of new writes, then two of copies, together: the worst case). At its close time each segment and its
``_cdc.idx`` (COMPLETED) are moved into the node's ``cdc_raw``, where the node's agent (``Agent.run_forever``, one
thread each, polling every second) ships it to the store; the upload time is when the agent finished uploading.
The last, partly filled segment of each node is left out: it would close after the timed part.

The runs: one every wall-clock minute (the default schedule ``* * * * *``), one at a time (``max_active_runs=1``:
a run due while another is running starts when it ends, as the latest due run, ``catchup=False``), each a fresh
Python process (so a run pays its imports, store and Kafka clients and, if a batch runs on Spark, the session
start) that calls what the DAG's tasks call (``steps.run_once``, then ``steps.run_for`` for the ``follow`` task)
without Airflow's own task processes. Two ways, one after the other on the same segments, each into its own store
prefix and topics (the embedded SeaweedFS S3 server and Apache Kafka broker):

* ``follow``: this repository's DAG: the run's batch, then batches until ``follow_margin_s`` before the next run is
  due, each within ``driver_batch_max_bytes`` (in the process);
* ``one batch per run``: the DAG before ``follow``: one batch per run, with claim's sizing before this change
  (``max_bytes``, 256 MiB: a batch of several 32 MiB segments runs on Spark ``local[2]``).

Latency: Kafka's record timestamp of each event minus the time the agent finished uploading the segment the event
came from (as ``bench_pipeline.py``). Events/s: the events published over the time from the first upload to the
last event in Kafka. The load average is printed with the figures (the machine is shared).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# Only what a DAG task imports at the top: a run's own process (--scheduled-run) pays no more than a task would;
# the benchmark's machinery is imported where it is used.
from cdc_lib import pipeline as P  # noqa: E402
from cdc_lib.storage.layout import Layout  # noqa: E402

MODES = ("follow", "one batch per run")


@dataclasses.dataclass
class Closing:
    """One generated segment and when its node closes it (seconds after the timed part starts)."""
    node: str
    path: Path
    at: float


def _used_bytes(path) -> int:
    """The bytes of a closed segment that hold entries (its ``_cdc.idx`` offset)."""
    return int(Path(str(path)[:-4] + "_cdc.idx").read_text().split()[0])


def _skips(schema, nodes: int, segment_size: int, lockstep: bool) -> dict:
    """{node: writes left out of its log's start}: node k's segment boundaries fall ``k / nodes`` of a segment
    later in the write stream than node 1's (none with ``lockstep``). A segment's writes are counted on a small
    sample of the same workload."""
    if lockstep:
        return {}
    with tempfile.TemporaryDirectory() as d:
        from cdc_lib.demo.workload import write_cluster_segments
        sample = write_cluster_segments(d, schema, 20_000, nodes=1, rf=1, seed=2, segment_size=segment_size)
        per_write = _used_bytes(sample.segments["node1"][0]) / 20_000
    return {f"node{k + 1}": round(k * segment_size / per_write / nodes) for k in range(nodes)}


def _closings(segments: dict, skip: dict, writes: int, rate: int) -> list:
    """Each node's full segments with their close times, in close order: write i is taken at ``i / rate`` s, and
    a node's bytes grow steadily over its writes (``skip[node]`` onwards), so a segment closes when the writes up
    to its last byte have been taken. The last segment of each node (partly filled) is left out."""
    out = []
    for node in sorted(segments):
        used = [_used_bytes(p) for p in segments[node]]
        first = skip.get(node, 0)
        per_write = sum(used) / (writes - first)
        done = 0
        for path, size in zip(segments[node][:-1], used[:-1]):
            done += size
            out.append(Closing(node, Path(path), (first + done / per_write) / rate))
    return sorted(out, key=lambda c: c.at)


class Placer(threading.Thread):
    """Moves each segment (its idx first, COMPLETED, then the log: the agent never sees it half there) into its
    node's cdc_raw at its close time, with the close time as the files' modification time (the agent's
    ``closed_at``)."""

    def __init__(self, closings: list, staging: Path, cdc_raw: Path, t0: float):
        super().__init__(daemon=True)
        self.closings, self.staging, self.cdc_raw, self.t0 = closings, staging, cdc_raw, t0

    def run(self) -> None:
        for c in self.closings:
            time.sleep(max(0.0, self.t0 + c.at - time.time()))
            now = time.time()
            for src in (self.staging / c.node / (c.path.stem + "_cdc.idx"), self.staging / c.node / c.path.name):
                os.utime(src, (now, now))
                os.rename(src, self.cdc_raw / c.node / src.name)


def _next_minute(t: float) -> float:
    return (int(t) // 60 + 1) * 60.0


def _schedule(spec: dict, store, placer: Placer, segments: int, log_path: Path) -> list:
    """Start a run (a fresh process) at each wall-clock minute, one at a time, until every segment is placed and
    archived; returns each run's (run_after, started, ended, its summary)."""
    runs = []
    due = _next_minute(time.time())
    incoming = Layout.area_prefix(Layout.INCOMING, spec["config"]["cluster"])
    archived = Layout.area_prefix(Layout.ARCHIVED, spec["config"]["cluster"])
    with open(log_path, "ab") as log:
        while True:
            if time.time() < due:
                time.sleep(min(1.0, due - time.time()))
            if len(store.list(archived)) >= segments:
                return runs
            if time.time() < due:
                continue
            run_after = max(due, _next_minute(time.time()) - 60)   # catchup=False: the latest due run
            started = time.time()
            proc = subprocess.Popen([sys.executable, __file__, "--scheduled-run",
                                     json.dumps({**spec, "run_after": run_after,
                                                 "run_id": f"scheduled__{int(run_after)}"})],
                                    stdout=log, stderr=log)
            while proc.poll() is None:
                if not placer.is_alive() and len(store.list(archived)) >= segments and not store.list(incoming):
                    proc.terminate()              # idle in its follow window and nothing is left: stop waiting
                    break
                time.sleep(1.0)
            proc.wait()
            runs.append((run_after, started, time.time(), _run_summary(store, f"scheduled__{int(run_after)}")))
            due = _next_minute(run_after)


def _run_summary(store, run_id: str) -> dict:
    """What the run did, from the manifests of the batches it claimed."""
    done = [b for b in (P.Batch.from_dict(store.get_json(k)) for k in store.list(f"{Layout.LEDGER}/batches/"))
            if b.claimed_by == run_id]
    return {"batches": len(done), "segments": sum(len(b.segments) for b in done),
            "modes": sorted({b.steps.get("transform", {}).get("mode") or "?" for b in done}),
            "events": sum(b.steps.get("publish", {}).get("events", 0) for b in done)}


def _scheduled_run(spec: dict) -> None:
    """One DAG run in this (fresh) process: what its tasks call."""
    from cdc_lib.pipeline import steps
    from cdc_lib.pipeline.follow import follow_seconds
    cfg = P.PipelineConfig(**spec["config"])
    if spec["mode"] == "one batch per run":
        steps.batch_max_bytes = lambda config: config.max_bytes       # claim's sizing before run_for
    run_after = datetime.fromtimestamp(spec["run_after"], timezone.utc)
    steps.run_once(cfg, spec["run_id"])
    if spec["mode"] == "follow":
        steps.run_for(cfg, follow_seconds(cfg, run_after, datetime.now(timezone.utc)), spec["run_id"])
    P.stop_spark()


def _timed_part(mode: str, closings: list, pristine: Path, work: Path, cfg: P.PipelineConfig) -> dict:
    """Place, ship and run on the schedule; the latencies and counters of this way of running."""
    staging, raw = work / f"staging-{mode[:6]}", work / f"cdc_raw-{mode[:6]}"
    for c in closings:                        # hard links: the agents delete what they ship
        (staging / c.node).mkdir(parents=True, exist_ok=True)
        (raw / c.node).mkdir(parents=True, exist_ok=True)
        for name in (c.path.name, c.path.stem + "_cdc.idx"):
            os.link(pristine / c.node / name, staging / c.node / name)
    from bench_pipeline import _kafka_timestamps, upload_to_kafka_seconds

    from cdc_lib.agent.shipper import Agent
    from cdc_lib.settings import AgentConfig
    store = P.open_store(cfg)
    uploaded: dict = {}
    stop = threading.Event()
    agents = []
    for node in sorted({c.node for c in closings}):
        agent = Agent(AgentConfig(cdc_raw=raw / node, store_url=cfg.store_url, cluster=cfg.cluster, node=node,
                                  state_dir=work / f"agent-{mode[:6]}" / node), store=P.open_store(cfg),
                      hooks={"after_upload": lambda name, node=node: uploaded.__setitem__((node, name), time.time())})
        agents.append(threading.Thread(target=agent.run_forever, args=(stop,), daemon=True))
    for a in agents:
        a.start()
    t0 = time.time() + 2
    placer = Placer(closings, staging, raw, t0)
    placer.start()
    spec = {"mode": mode, "config": dataclasses.asdict(cfg)}
    runs = _schedule(spec, store, placer, len(closings), work / f"runs-{mode[:6]}.log")
    stop.set()
    for a in agents:
        a.join()
    stamps = _kafka_timestamps(cfg.kafka_bootstrap, cfg.topic_prefix)
    lat = upload_to_kafka_seconds(stamps, uploaded)
    first_upload = min(uploaded.values())
    last_event = max(ts for _, _, ts in stamps) / 1000
    return {"mode": mode, "lat": lat, "events": len(stamps), "wall_s": last_event - first_upload, "runs": runs,
            "load": os.getloadavg()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=2000, help="writes per second (each on all 3 nodes)")
    p.add_argument("--seconds", type=int, default=300, help="how long the load lasts")
    p.add_argument("--segment-mib", type=int, default=32)
    p.add_argument("--lockstep", action="store_true", help="all nodes close their segments together")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    p.add_argument("--scheduled-run", help=argparse.SUPPRESS)       # a run's own process (see _scheduled_run)
    a = p.parse_args(argv)
    if a.scheduled_run:
        _scheduled_run(json.loads(a.scheduled_run))
        return 0
    from bench_pipeline import percentile

    from cdc_lib.demo.servers import run_kafka_broker, run_s3_server
    from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, Workload, sample_schema, write_cluster_segments
    modes = [m.strip() for m in a.modes.split(",")]
    assert set(modes) <= set(MODES), modes

    work = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    schema = sample_schema()
    t = time.perf_counter()
    skip = _skips(schema, 3, a.segment_mib << 20, a.lockstep)
    cw = write_cluster_segments(work / "generated", schema, a.rate * a.seconds, seed=1,
                                workload=Workload(schema, seed=1), segment_size=a.segment_mib << 20, skip=skip)
    closings = _closings(cw.segments, skip, a.rate * a.seconds, a.rate)
    print(f"generated {a.rate * a.seconds} writes ({a.rate}/s for {a.seconds} s) -> {cw.replica_copies} "
          f"commit-log entries in {len(closings)} full {a.segment_mib} MiB segments on {len(cw.segments)} nodes "
          f"(+{len(cw.segments)} partly filled, left out) in {time.perf_counter() - t:.0f} s; a segment closes "
          f"every {closings[-1].at / len(closings):.1f} s on average, "
          f"{'all nodes together' if a.lockstep else 'nodes a third of a segment apart'}", flush=True)
    schema_file = work / "schema.cql"
    schema_file.write_text(SAMPLE_SCHEMA_CQL)
    results = []
    with run_kafka_broker(work / "kafka") as broker, run_s3_server(work / "weed", bucket="bench") as s3:
        for i, mode in enumerate(modes):
            cfg = P.PipelineConfig(store_url=f"s3://bench/run{i}", s3_endpoint_url=s3.endpoint_url,
                                   s3_access_key=s3.access_key, s3_secret_key=s3.secret_key, cluster="bench",
                                   schema_file=str(schema_file), kafka_bootstrap=broker.bootstrap,
                                   topic_prefix=f"run{i}")
            print(f"{mode}: running ...", flush=True)
            results.append(_timed_part(mode, closings, work / "generated", work, cfg))
            r = results[-1]
            print(f"  {len(r['runs'])} runs; each: when due, how late it started, how long it took, its batches/"
                  f"segments/events, where its batches ran:")
            for run_after, started, ended, summary in r["runs"]:
                print(f"    due {datetime.fromtimestamp(run_after, timezone.utc):%H:%M:%S} started +"
                      f"{started - run_after:.0f} s, took {ended - started:5.1f} s: {summary.get('batches', '?')}/"
                      f"{summary.get('segments', '?')}/{summary.get('events', '?')} "
                      f"{','.join(summary.get('modes', []))}")
    print(f"segment uploaded -> event in Kafka, {a.rate} writes/s on 3 nodes (RF 3), {a.segment_mib} MiB segments, "
          f"runs every minute, one at a time, each a fresh process:")
    print(f"  {'way':20s} {'events':>8s} {'events/s':>9s} {'p50 s':>6s} {'p95 s':>6s} {'max s':>6s}  load average "
          "(1, 5, 15 min) at the end")
    for r in results:
        lat = r["lat"]
        print(f"  {r['mode']:20s} {r['events']:8d} {r['events'] / r['wall_s']:9.0f} {statistics.median(lat):6.1f} "
              f"{percentile(lat, 0.95):6.1f} {lat[-1]:6.1f}  {', '.join(f'{x:.1f}' for x in r['load'])}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
