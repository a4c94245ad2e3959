"""Pipeline runs killed for real, each in its own process, without paying an interpreter start for each.

The fault tests kill a pipeline run dozens of times (``os._exit`` at a fault point: no flush, no cleanup, no
exception handler). A fresh ``python -c`` per run spends ~2.5 s importing pyarrow, deltalake and confluent-kafka
before it does anything. Here one warm interpreter imports them once, then ``fork``s a child per run: the child is a
separate process that dies as the fresh one did, and the parent only reports its exit status. The warm parent starts
no thread before forking (a fork copies only the forking thread), and it is stopped by its PID when the block ends.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_WARM_PARENT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from cdc_lib import pipeline as P
import cdc_lib.sinks.delta, cdc_lib.sinks.kafka, cdc_lib.spark.merge_job    # what run_once imports when it runs
print("ready", flush=True)
for line in sys.stdin:
    config, point, nth, loop = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.dup2(2, 1)                # the child's prints go to the log, never into the parent's answers
        seen = {}
        def fault(p):
            seen[p] = seen.get(p, 0) + 1
            if p == point and seen[p] == nth:
                os._exit(9)          # the process dies here: no flush, no cleanup, no exception handler
        try:
            if loop == "run_until_idle":        # batches overlapping (overlap_batches): two threads
                P.run_until_idle(P.PipelineConfig(**config), fault=fault)
            else:
                while not P.run_once(P.PipelineConfig(**config), fault=fault).empty:
                    pass
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class KilledRuns:
    """``run(config, point, nth)``: a pipeline run until idle in a forked child that ``os._exit(9)``s the
    ``nth`` time it reaches fault point ``point`` (in any thread); returns the child's exit status and the log
    tail. ``loop``: ``run_once`` (one batch after the other, as the DAG's tasks) or ``run_until_idle`` (batches
    overlapping, as the follow task)."""

    def __init__(self, proc: subprocess.Popen, log: Path):
        self.proc, self.log = proc, log

    def run(self, config: dict, point: str, nth: int, timeout: float = 300.0, loop: str = "run_once") -> tuple:
        start = self.log.stat().st_size
        self.proc.stdin.write(json.dumps([config, point, nth, loop]) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        with open(self.log, "rb") as f:
            f.seek(start)
            tail = f.read().decode(errors="replace")[-3000:]
        if not line:
            raise TimeoutError(f"the run killed at {point} #{nth} did not end within {timeout:.0f} s:\n{tail}")
        return int(line), tail


@contextmanager
def killed_runs(workdir: Path):
    log = Path(tempfile.mkstemp(prefix="killed-runs-", suffix=".log", dir=workdir)[1])
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-c", _WARM_PARENT, str(REPO)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        if not ready or proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the warm parent did not start:\n{log.read_text()[-3000:]}")
        yield KilledRuns(proc, log)
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
