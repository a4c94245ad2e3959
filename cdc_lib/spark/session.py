"""The Spark session a batch runs in: local mode in-process (the embedded default) or a cluster's.

Executors must be able to import ``cdc_lib``: local mode puts the repository on the workers' ``PYTHONPATH``;
on a cluster where the package is not installed, ``ship_cdc_lib`` sends it as a zip.

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
import tempfile
import threading
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG4J2_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"
LOOPBACK = "127.0.0.1"

jvm_log = logging.getLogger("cassandra_cdc.spark.jvm")

# A line of LOG4J2_CONFIG's pattern "%p %c{1}: %m"
_LOG4J_LINE = re.compile(r"^(TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ([^\s:]+): (.*)$")
_LOG4J_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
                 "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
# What the JVM itself prints at every start (Spark's launcher adds the jdk.incubator.vector module): not a warning
# about this run.
_JVM_NOTICES = ("WARNING: Using incubator modules:",)

_SPARK = None


def spark_session(master: str):
    """The process's SparkSession (started once; ``local[N]`` by default, else the given master)."""
    global _SPARK
    if _SPARK is None:
        m = re.fullmatch(r"local\[(\d+|\*)\]", master)
        if m:
            cores = (os.cpu_count() or 2) if m.group(1) == "*" else int(m.group(1))
            _SPARK = local_session(cores=cores)
        else:
            from pyspark.sql import SparkSession
            _SPARK = SparkSession.builder.master(master).appName("cdc-merge-batch").getOrCreate()
            ship_cdc_lib(_SPARK)
    return _SPARK


def stop_spark() -> None:
    global _SPARK
    if _SPARK is not None:
        _SPARK.stop()
        _SPARK = None


def local_session(app_name: str = "cdc-merge-batch", cores: int = 2, driver_memory: str = "2g"):
    """A small local-mode SparkSession on 127.0.0.1 whose Python workers can import ``cdc_lib``; the JVM's
    output goes to Python logging (see the module docstring)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession
    conf = SparkConf().setMaster(f"local[{cores}]").setAppName(app_name).setAll([
        ("spark.driver.bindAddress", LOOPBACK),
        ("spark.driver.host", LOOPBACK),
        ("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"),
        ("spark.sql.shuffle.partitions", "4"),
        ("spark.default.parallelism", str(cores)),
        ("spark.ui.enabled", "false"),
        ("spark.ui.showConsoleProgress", "false"),
        ("spark.driver.memory", driver_memory),
        ("spark.sql.execution.arrow.pyspark.enabled", "true"),
        ("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"]),
    ])
    if SparkContext._gateway is None:       # no JVM yet in this process: start it with its output captured
        gateway = launch_gateway(conf, popen_kwargs={"stdout": subprocess.PIPE, "stderr": subprocess.PIPE})
        forward_jvm_output(gateway.proc.stderr, logging.WARNING)
        forward_jvm_output(gateway.proc.stdout, logging.INFO)
        SparkContext(conf=conf, gateway=gateway)
    return SparkSession.builder.config(conf=conf).getOrCreate()


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
    fd, path = tempfile.mkstemp(suffix=".zip", prefix="cdc_lib-")
    os.close(fd)
    with zipfile.ZipFile(path, "w") as z:
        for p in pkg.rglob("*.py"):
            z.write(p, str(p.relative_to(pkg.parent)))
    spark.sparkContext.addPyFile(path)
