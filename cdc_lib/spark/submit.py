"""The transform's Spark job through ``spark-submit`` (the pipeline's ``spark_submit`` mode).

The command line holds what anybody may see (``ps`` shows it to every user of the machine): the master, the jars,
the job's arguments, and every Spark property whose name is not a secret's (``conf.split_secrets``: ``--conf``,
including the ``spark_conf`` setting). The secrets (the store's credentials for s3a, which the job also hands to
fsspec and delta-rs) go to a properties file in a private temporary directory, mode 0600, removed when the job
ends; ``--load-spark-defaults`` keeps the cluster's own ``spark-defaults.conf``, which ``--properties-file``
would otherwise replace.

The job's output (its driver's log4j lines and Python logging) is forwarded line by line to the logger
``cassandra_cdc.spark.job`` at each line's level, so the Airflow task log shows the job as it runs; when the job
fails, the error names the exit status and repeats the last lines of its output. ``spark-submit`` dies with the
process that started it (``PR_SET_PDEATHSIG``): a killed Airflow task does not leave its job writing on.

A job still running after ``spark_submit_timeout_s`` is stopped (SIGTERM: Spark's shutdown hooks stop the
application and its Python processes; ``STOP_GRACE_S`` later SIGKILL to its whole process group, which it leads,
so that no child keeps its output open) and the transform fails with ``SparkJobTimeout``: a batch is never held for
ever by a job that hangs (on a store that stopped answering, s3a gives up by itself: ``conf.s3a_timeouts``).
Stopping a job between its Delta commits is safe: a rerun skips the tables that hold the batch (their app
transaction says so).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

from cdc_lib.errors import CdcError

from . import scratch
from .conf import LOG4J2_CONFIG, REPO_ROOT, java_options, split_secrets, write_properties
from .merge_job import RESULT_PREFIX
from .session import _LOG4J_LEVELS, _LOG4J_LINE, session_properties

JOB = REPO_ROOT / "spark_jobs" / "merge_batch.py"
TAIL_LINES = 60          # lines of the job's output repeated in the error when it fails
STOP_GRACE_S = 30.0      # a job stopped for running too long: how long its shutdown may take before SIGKILL

log = logging.getLogger("cassandra_cdc.spark.submit")
job_log = logging.getLogger("cassandra_cdc.spark.job")


class SparkJobError(CdcError):
    """The Spark job failed (``spark-submit`` exited with an error, or said nothing about its result)."""


class SparkJobTimeout(SparkJobError):
    """The Spark job ran longer than ``spark_submit_timeout_s`` and was stopped."""


def _die_with_parent() -> None:      # runs in the child between fork and exec
    import ctypes
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _level_of(line: str, previous: int) -> int:
    """The logging level of a line of the job's output: a log4j line's own level (``LOG4J2_CONFIG``'s pattern, which
    the job's Python logging uses too), an error from a Python traceback on, else the level of the record the
    line continues (a stack trace)."""
    m = _LOG4J_LINE.match(line)
    if m:
        return _LOG4J_LEVELS[m.group(1)]
    if line.startswith("Traceback (most recent call last)"):
        return logging.ERROR
    return previous


def _stop_when_overdue(proc: subprocess.Popen, timeout_s: float, overdue: threading.Event) -> None:
    """Wait for ``proc``; after ``timeout_s`` stop it (SIGTERM, SIGKILL ``STOP_GRACE_S`` later) and set ``overdue``."""
    try:
        proc.wait(timeout_s)
        return
    except subprocess.TimeoutExpired:
        overdue.set()
    log.error("transform: spark-submit still runs after spark_submit_timeout_s (%g s): stopping it", timeout_s)
    proc.terminate()
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc)      # the job's children too (they would keep its output open)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def submit_command(config, job_args: list, properties_file: Path) -> list:
    """The ``spark-submit`` command line for ``config`` (a ``PipelineConfig``): everything but the secrets, which
    the caller writes to ``properties_file``."""
    props = session_properties(config)
    jars = props.pop("spark.jars", "")
    props["spark.driver.extraJavaOptions"] = java_options(
        props, "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}")
    public, _ = split_secrets(props)
    argv = [config.spark_submit_bin, "--master", config.spark_master, "--deploy-mode", "client",
            "--properties-file", str(properties_file), "--load-spark-defaults"]
    if jars:
        argv += ["--jars", jars]
    for k, v in public.items():
        argv += ["--conf", f"{k}={v}"]
    return argv + [str(JOB), *map(str, job_args)]


def run_job(config, job_args: list) -> dict:
    """Run ``spark_jobs/merge_batch.py job_args`` with spark-submit; returns its result (the BatchResult as a dict).

    Raises SparkJobError with the exit status and the last ``TAIL_LINES`` lines of the job's output;
    SparkJobTimeout when it ran longer than ``config.spark_submit_timeout_s`` (it is stopped).
    """
    _, secret = split_secrets(session_properties(config))
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)       # the driver's Python: this one, which has cdc_lib
    env.setdefault("PYSPARK_DRIVER_PYTHON", env["PYSPARK_PYTHON"])
    with scratch.private_dir("spark-submit") as private:      # mode 0700
        argv = submit_command(config, job_args, write_properties(Path(private) / "secret.properties", secret))
        log.info("transform: %s", shlex.join(argv))
        tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        result = None
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, preexec_fn=_die_with_parent, start_new_session=True)
        overdue = threading.Event()
        watchdog = threading.Thread(target=_stop_when_overdue, args=(proc, config.spark_submit_timeout_s, overdue),
                                    name="spark-submit-watchdog", daemon=True)
        watchdog.start()
        try:
            level = logging.INFO
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                if line.startswith(RESULT_PREFIX):
                    result = json.loads(line[len(RESULT_PREFIX):])
                elif line:
                    tail.append(line)
                    level = _level_of(line, level)
                    job_log.log(level, "%s", line)
            code = proc.wait()
        except BaseException:
            _kill_group(proc)
            proc.wait()
            raise
        finally:
            watchdog.join()
    if overdue.is_set() and (code != 0 or result is None):     # (not a job that ended as it was stopped)
        raise SparkJobTimeout(
            f"spark-submit ran longer than spark_submit_timeout_s ({config.spark_submit_timeout_s:g} s) and was "
            f"stopped (exit status {code}); the batch is retried whole by the next run. The last {len(tail)} lines "
            "of the job's output:\n" + "\n".join(tail))
    if code != 0:
        raise SparkJobError(f"spark-submit failed (exit status {code}); the last {len(tail)} lines of the job's "
                            "output:\n" + "\n".join(tail))
    if result is None:
        raise SparkJobError("spark-submit ended without the job's result line; the last lines of its output:\n"
                            + "\n".join(tail))
    return result
