"""The Spark session a batch runs in, when the transform step runs Spark in its own process (``spark_submit`` off):
local mode (``local[N]``, the embedded default) or a cluster's master. ``spark-submit`` runs are ``submit``'s.

The session has Delta Lake and s3a (``conf``) and the store's S3 settings. Spark's launcher passes every property of
a session it starts as a ``--conf`` argument of the JVM's command line, which ``ps`` shows to every user of the
machine; so the properties go to a properties file only this user can read (``PYSPARK_SUBMIT_ARGS
--properties-file``), which is removed once the JVM has read it.

Executors must be able to import ``cdc_lib``: local mode puts the repository on the workers' ``PYTHONPATH``; on a
cluster where the package is not installed, ``ship_cdc_lib`` sends it as a zip.

Local mode is quiet and stays on the machine: the driver binds 127.0.0.1 (``SPARK_LOCAL_IP``, so Spark does not
look up the host name and warn that it resolves to a loopback address), logs warnings and errors only
(``log4j2.properties``), and everything the JVM writes to stdout/stderr is forwarded to Python logging
(logger ``cassandra_cdc.spark.jvm``) at the level of each line. Without that, the JVM inherits the task's stderr
and Airflow logs every start-up line of Spark as an error.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Mapping, Optional

from cdc_lib import allocator

from . import scratch
from .conf import (DELTA_SESSION_CONF, LOG4J2_CONFIG, REPO_ROOT, java_options, s3a_properties, spark_jars,
                   write_properties)

LOOPBACK = "127.0.0.1"

jvm_log = logging.getLogger("cassandra_cdc.spark.jvm")

# A line of LOG4J2_CONFIG's pattern "%p %c{1}: %m" (or Python logging's "%(levelname)s %(name)s: %(message)s")
_LOG4J_LINE = re.compile(r"^(TRACE|DEBUG|INFO|WARN|WARNING|ERROR|FATAL|CRITICAL) ([^\s:]+): (.*)$")
_LOG4J_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
                 "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL,
                 "CRITICAL": logging.CRITICAL}
# What the JVM itself prints at every start (Spark's launcher adds the jdk.incubator.vector module): not a warning
# about this run.
_JVM_NOTICES = ("WARNING: Using incubator modules:",)

_SPARK = None


def spark_session(config):
    """The process's SparkSession for ``config`` (a ``PipelineConfig``), started once: ``local[N]`` in this
    process, or a driver of ``config.spark_master``'s cluster."""
    global _SPARK
    if _SPARK is None:
        m = re.fullmatch(r"local\[(\d+|\*)\]", config.spark_master)
        cores = ((os.cpu_count() or 2) if m.group(1) == "*" else int(m.group(1))) if m else None
        props = session_properties(config)
        if cores is not None:
            _SPARK = local_session(cores=cores, properties=props)
        else:
            _SPARK = _start_session(config.spark_master, "cdc-merge-batch", props)
            ship_cdc_lib(_SPARK)
    # A session started for another store (one JVM per process) reads and writes this one's: its Hadoop settings
    # are set at run time (not on any command line), and Delta and the executors' writes take them from there.
    hadoop = _SPARK.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_properties(config).items():
        if key.startswith("spark.hadoop."):
            hadoop.set(key[len("spark.hadoop."):], value)
    return _SPARK


def stop_spark() -> None:
    global _SPARK
    if _SPARK is not None:
        _SPARK.stop()
        _SPARK = None


def session_properties(config) -> dict:
    """The Spark properties of a batch for ``config``: its jars, Delta, the store's S3 settings, the allocator
    settings for the executors, then the ``spark_conf`` setting over them (``--conf`` passthrough)."""
    props = {"spark.jars": ",".join(spark_jars(config.spark_jars)), **DELTA_SESSION_CONF, **s3a_properties(config)}
    # Executors a cluster's workers start do not inherit this process's environment: the allocator settings (their
    # values here, the user's if they set them) go with the job, and their pyarrow starts with them.
    props.update({f"spark.executorEnv.{name}": value for name, value in allocator.configure().items()})
    props.update({k: str(v) for k, v in (config.spark_conf or {}).items()})
    if not props["spark.jars"]:
        del props["spark.jars"]
    return props


def local_session(app_name: str = "cdc-merge-batch", cores: int = 2, driver_memory: str = "2g",
                  properties: Optional[Mapping[str, str]] = None):
    """A local-mode SparkSession on 127.0.0.1 with Delta Lake, whose Python workers can import ``cdc_lib``; the
    JVM's output goes to Python logging (see the module docstring). ``properties`` (``session_properties``) come
    on top of the defaults here; without them, the jars come from the default ``spark_jars``."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    props = {
        "spark.driver.bindAddress": LOOPBACK,
        "spark.driver.host": LOOPBACK,
        "spark.sql.shuffle.partitions": str(max(2, cores)),
        "spark.default.parallelism": str(cores),
        # Delta rebuilds a table's state (its log) with 50 tasks by default, even for a table of one file.
        "spark.databricks.delta.snapshotPartitions": str(max(2, cores)),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": driver_memory,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
    }
    if properties is None:
        props.update({"spark.jars": ",".join(spark_jars(None)), **DELTA_SESSION_CONF})
    props.update(properties or {})
    return _start_session(f"local[{cores}]", app_name, props)


def _start_session(master: str, app_name: str, props: Mapping[str, str]):
    """The SparkSession of this process: a new JVM started with ``props`` read from a 0600 properties file (never
    from its command line), its output forwarded to Python logging; or the session already running."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession
    if SparkContext._gateway is None:       # no JVM yet in this process: start it with its output captured
        props = dict(props)
        props["spark.driver.extraJavaOptions"] = java_options(
            props, "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}")
        props.update({"spark.master": master, "spark.app.name": app_name})
        path = write_properties(scratch.process_file("spark-properties", ".properties"), props)
        before = os.environ.get("PYSPARK_SUBMIT_ARGS")
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {path} pyspark-shell"
        try:
            gateway = launch_gateway(SparkConf(loadDefaults=False),
                                     popen_kwargs={"stdout": subprocess.PIPE, "stderr": subprocess.PIPE})
        finally:
            path.unlink(missing_ok=True)
            if before is None:
                os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
            else:
                os.environ["PYSPARK_SUBMIT_ARGS"] = before
        forward_jvm_output(gateway.proc.stderr, logging.WARNING)
        forward_jvm_output(gateway.proc.stdout, logging.INFO)
        SparkContext(gateway=gateway)      # its conf: what SparkSubmit read from the file (the JVM's properties)
    return SparkSession.builder.getOrCreate()


def forward_jvm_output(stream, unformatted_level: int) -> threading.Thread:
    """Log each line of ``stream`` (a pipe from the JVM) on ``jvm_log``, at the level its log4j prefix names.

    A line without a prefix continues the record before it (an exception and its stack trace, which log4j writes
    on the lines after the message); before the first record it is logged at ``unformatted_level``, except the
    JVM's own start-up notices (info).
    """
    def pump() -> None:
        level = None
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip()
                if not line:
                    continue
                m = _LOG4J_LINE.match(line)
                if m:
                    level = _LOG4J_LEVELS[m.group(1)]
                    jvm_log.log(level, "%s: %s", m.group(2), m.group(3))
                elif level is not None:
                    jvm_log.log(level, "%s", line)
                else:
                    jvm_log.log(logging.INFO if line.startswith(_JVM_NOTICES) else unformatted_level, "%s", line)

    thread = threading.Thread(target=pump, name="spark-jvm-output", daemon=True)
    thread.start()
    return thread


def ship_cdc_lib(spark) -> None:
    """Send ``cdc_lib`` to the executors as a zip (for clusters where it is not installed)."""
    import cdc_lib
    pkg = Path(cdc_lib.__file__).resolve().parent
    path = str(scratch.process_file("cdc_lib", ".zip"))   # served to executors while the session lives
    with zipfile.ZipFile(path, "w") as z:
        for p in pkg.rglob("*.py"):
            z.write(p, str(p.relative_to(pkg.parent)))
    spark.sparkContext.addPyFile(path)
