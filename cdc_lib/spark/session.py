"""The Spark session a batch runs in: local mode in-process (the embedded default) or a cluster's.

Executors must be able to import ``cdc_lib``: local mode puts the repository on the workers' ``PYTHONPATH``;
on a cluster where the package is not installed, ``ship_cdc_lib`` sends it as a zip.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

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
    """A small local-mode SparkSession whose Python workers can import ``cdc_lib``."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master(f"local[{cores}]").appName(app_name)
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", str(cores))
            .config("spark.ui.enabled", "false")
            .config("spark.driver.memory", driver_memory)
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
            .getOrCreate())


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
