"""The demo's DAG runs in one Airflow process: ``DAG.test()``, what ``airflow dags test`` runs, once per run.

Each ``airflow dags test`` is a new process that imports Airflow, parses the DAG folder and starts the in-process
execution API before its first task: 15 s on a quiet 2-core machine, 35-45 s under load. The demo runs its DAGs
five times or more, so it keeps one process (``python -m cdc_lib.demo.dag_runner``) that pays that once and runs
the same DAG objects with the same ``DAG.test(run_conf=...)`` call the command makes.

The parent (``DagRunner``) sends one JSON request per line on the child's stdin and reads one JSON reply per line
on a pipe of its own; the child's stdout and stderr (Airflow's task logs) go to the log file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


class DagRunFailed(RuntimeError):
    """A DAG run ended in a state other than success, or the Airflow process stopped; the message has the log."""


def _log_tail(log_path: Path, start: int, lines: int = 40) -> str:
    with open(log_path, "rb") as f:
        f.seek(start)
        return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])


class DagRunner:
    """``with DagRunner(env, log_path) as r: r.run("cassandra_cdc", conf)``: one Airflow process for many runs.

    ``env`` is the Airflow environment (``AIRFLOW_HOME``, the DAG folder, the database, connections as
    ``AIRFLOW_CONN_*``); the database must be migrated before the first run.
    """

    def __init__(self, env: dict, log_path: Path, start_timeout_s: float = 300.0):
        self.env, self.log_path, self.start_timeout_s = env, Path(log_path), start_timeout_s
        self.proc = None
        self._replies = None

    def __enter__(self) -> "DagRunner":
        read_fd, write_fd = os.pipe()
        self._log = open(self.log_path, "ab")
        self._start = self.log_path.stat().st_size
        self.proc = subprocess.Popen([sys.executable, "-m", "cdc_lib.demo.dag_runner", str(write_fd)],
                                     env=self.env, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                     pass_fds=(write_fd,), text=True)
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "r")
        self.parse_s = self._reply("starting Airflow and parsing the DAG folder")["seconds"]
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _reply(self, doing: str) -> dict:
        line = self._replies.readline()
        if not line:
            code = self.proc.wait(timeout=30)
            raise DagRunFailed(f"the Airflow process stopped (exit {code}) while {doing}; log {self.log_path}:\n"
                               + _log_tail(self.log_path, self._start))
        reply = json.loads(line)
        if reply.get("error"):
            raise DagRunFailed(f"{doing}: {reply['error']}; log {self.log_path}:\n"
                               + _log_tail(self.log_path, self._start))
        return reply

    def run(self, dag_id: str, conf: dict) -> float:
        """One run of ``dag_id`` with ``conf`` as its params; returns the seconds it took. A failed run raises
        ``DagRunFailed`` with the end of the task log."""
        t0 = time.monotonic()
        self._start = self.log_path.stat().st_size
        self.proc.stdin.write(json.dumps({"dag_id": dag_id, "conf": conf}) + "\n")
        self.proc.stdin.flush()
        reply = self._reply(f"running {dag_id}")
        if reply["state"] != "success":
            raise DagRunFailed(f"DAG run {dag_id} ended {reply['state']}; log {self.log_path}:\n"
                               + _log_tail(self.log_path, self._start))
        return time.monotonic() - t0

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()             # end of requests: the child returns
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self._replies.close()
            self._log.close()


def _warm_up() -> None:
    """Build now what the first task would build: the in-process execution API ``DAG.test()`` talks to (its
    FastAPI app, its event-loop thread and lifespan, and whatever its first request sets up: 7 s on a quiet machine,
    over 25 s under load) and the pipeline's own modules. The demo starts this process while Cassandra takes its
    writes, so the first DAG run does not pay for them."""
    import importlib
    for module in ("cdc_lib.pipeline.steps", "cdc_lib.sinks.kafka", "cdc_lib.sinks.delta"):
        importlib.import_module(module)
    try:
        from airflow.sdk.execution_time.supervisor import in_process_api_server
    except ImportError:         # another Airflow's internals: the first run builds it, only later
        return
    import httpx
    api = in_process_api_server()
    httpx.Client(transport=api.transport, base_url="http://in-process").get("/health/ping")


def _serve(reply_fd: int) -> None:
    replies = os.fdopen(reply_fd, "w", buffering=1)

    def reply(**kw) -> None:
        replies.write(json.dumps(kw) + "\n")

    t0 = time.monotonic()
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        reply(error="the DAG folder does not import: " + json.dumps(bag.import_errors))
        return
    _warm_up()
    reply(seconds=round(time.monotonic() - t0, 1), dags=sorted(bag.dag_ids))
    for line in sys.stdin:
        request = json.loads(line)
        dag = bag.get_dag(request["dag_id"])
        if dag is None:
            reply(error=f"no DAG {request['dag_id']!r} in the DAG folder")
            continue
        run = dag.test(run_conf=request["conf"])
        reply(state=str(getattr(run.state, "value", run.state)))


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
    # Every run has committed what it wrote before its reply; what an orderly interpreter exit would still do
    # (the execution API's loop, clients' finalizers) protects nothing and took 12 s under load.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
