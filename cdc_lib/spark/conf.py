"""The Spark properties a batch runs with, for an in-process session and for ``spark-submit`` alike.

* **Jars** (``spark_jars``): Delta Lake for Spark (``delta-spark_4.2_2.13`` + ``delta-storage`` 4.4.0) and s3a
  (``hadoop-aws`` 3.5.0 with the AWS SDK modules it uses). The ``spark_jars`` setting lists jar files or
  directories, comma-separated; without it, the jars ``scripts/setup.sh`` fetched into ``.jvm/lib/delta`` and
  ``.jvm/lib/s3a`` of this checkout. A cluster that has the jars installed can set ``spark_jars`` to ``none``.
* **Delta** (``DELTA_SESSION_CONF``): the SQL extension and catalog, and tables that stay at reader/writer protocol
  1/2 without deletion vectors, so that delta-rs, Polars and DuckDB (through Arrow) read what Spark writes; Parquet
  compressed with zstd, as delta-rs writes it (``sinks.delta.PARQUET_COMPRESSION``).
* **S3** (``s3a_properties``): the store's endpoint, region and credentials as ``fs.s3a.*`` Hadoop settings, and
  back (``s3_settings_from_spark``): the job derives the options of fsspec and delta-rs from the same properties, so
  the credentials are handed over once. ``s3_timeout_s`` bounds s3a's requests as it bounds fsspec's and delta-rs's
  (``S3A_TIMEOUT_FLOOR_S``, ``s3a_timeouts``) and rides along as ``S3_TIMEOUT_PROPERTY`` for the job's fsspec and
  delta-rs (in the driver and in the executors' Python workers): a store that stops answering fails the job
  instead of hanging it (s3a's defaults wait 200 s per read and retry for minutes, times Spark's task retries).
* **Secrets never on a command line**: ``ps`` shows every process's arguments, and Spark's launcher turns every
  property into a ``--conf`` argument. ``split_secrets`` puts the properties whose name Spark itself redacts
  (``secret``, ``password``, ``token``, ``access.key``: ``SECRET_PROPERTY``) apart; they go to a properties file
  readable by the owner only (``write_properties``), which ``spark-submit --properties-file`` reads.
"""
from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Mapping, Optional

from cdc_lib.errors import ConfigError
from cdc_lib.sinks.delta import PARQUET_COMPRESSION, PARQUET_COMPRESSION_LEVEL

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG4J2_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"
DEFAULT_JAR_DIRS = (REPO_ROOT / ".jvm" / "lib" / "delta", REPO_ROOT / ".jvm" / "lib" / "s3a")

#: What Spark's own ``spark.redaction.regex`` hides in its UI and logs: the same names are kept out of argv here.
SECRET_PROPERTY = re.compile(r"(?i)secret|password|token|access[.]?key")

DELTA_SESSION_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # New tables without deletion vectors (reader/writer protocol 1/2): delta-rs 1.6 cannot read deletion vectors
    # and would read column-mapped tables as all-NULL columns without an error, so neither is ever enabled.
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    # Delta's catalog makes Spark create its warehouse directory, by default ./spark-warehouse in whatever
    # directory the driver runs in (an Airflow worker's). No managed table is ever kept: a fixed private place.
    "spark.sql.warehouse.dir": str(Path(tempfile.gettempdir()) / "cassandra-cdc-spark-warehouse"),
    # Parquet as delta-rs writes it here (zstd at level 1, not Spark's snappy)
    "spark.sql.parquet.compression.codec": PARQUET_COMPRESSION.lower(),
    f"spark.hadoop.parquet.compression.codec.{PARQUET_COMPRESSION.lower()}.level": str(PARQUET_COMPRESSION_LEVEL),
}


def spark_jars(setting: Optional[str]) -> list[str]:
    """The jar files of the ``spark_jars`` setting (see the module docstring); ConfigError when one is missing."""
    if setting is not None and setting.strip().lower() == "none":
        return []
    if setting is None or not setting.strip():
        items, where = [str(d) for d in DEFAULT_JAR_DIRS], "the default (.jvm/lib/delta, .jvm/lib/s3a)"
    else:
        items, where = [s.strip() for s in setting.split(",") if s.strip()], f"spark_jars {setting!r}"
    jars: list[str] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(str(p) for p in path.glob("*.jar"))
            if not found:
                raise ConfigError(f"{where}: no jar in {path}")
            jars += found
        elif path.is_file():
            jars.append(str(path))
        else:
            hint = " (bash scripts/setup.sh fetches them from Maven Central)" if setting is None else ""
            raise ConfigError(f"{where}: {path} does not exist{hint}")
    return jars


#: hadoop-aws 3.5 raises every connection timeout below this to it (``Constants.MINIMUM_NETWORK_OPERATION_DURATION``;
#: ``fs.s3a.connection.*timeout`` are read with ``getTimeDuration``: a number is milliseconds, ``30s`` seconds).
S3A_TIMEOUT_FLOOR_S = 15.0
#: The pipeline's ``s3_timeout_s`` as a Spark property: the job's fsspec and delta-rs take it from there.
S3_TIMEOUT_PROPERTY = "spark.cassandra_cdc.s3_timeout_s"


def s3a_timeouts(timeout_s: float) -> dict:
    """``fs.s3a.*`` settings that give up on a store that stopped answering the way ``PipelineConfig.delta_options``
    does for delta-rs: one request after ``timeout_s`` (at least ``S3A_TIMEOUT_FLOOR_S``; connecting after at most
    5 s of it), one operation after two requests (a batch that fails is retried whole by the next run). s3a's own
    defaults wait 200 s for a read, 60 s per request, and retry an operation 7 times with growing pauses on top of
    5 SDK attempts: minutes per operation, and again for each Spark task attempt."""
    ms = lambda s: f"{int(max(s, S3A_TIMEOUT_FLOOR_S) * 1000)}ms"  # noqa: E731
    return {
        "fs.s3a.connection.establish.timeout": ms(min(5.0, timeout_s)),
        "fs.s3a.connection.timeout": ms(timeout_s),            # a socket read that gets no byte
        # the whole request, the SDK's quick retries of a reset connection included (apiCallTimeout); part
        # uploads of big files have their own (fs.s3a.connection.part.upload.timeout)
        "fs.s3a.connection.request.timeout": ms(timeout_s),
        "fs.s3a.connection.acquisition.timeout": ms(timeout_s),   # waiting for a pooled connection
        "fs.s3a.attempts.maximum": "2",                         # SDK retries, inside the request timeout
        "fs.s3a.retry.limit": "1",                              # s3a's retries of an operation that failed
        "fs.s3a.retry.interval": "500ms",
    }


def s3a_properties(config) -> dict:
    """``spark.hadoop.fs.s3a.*`` properties for the store of ``config`` (a ``PipelineConfig``), and its
    ``s3_timeout_s`` (``S3_TIMEOUT_PROPERTY``); empty for a local store. Credentials only when the settings have
    them (else s3a's own chain: environment, instance profile)."""
    if not config.remote:
        return {}
    props = {"fs.s3a.endpoint.region": config.s3_region, **s3a_timeouts(config.s3_timeout_s)}
    if config.s3_endpoint_url:
        props.update({"fs.s3a.endpoint": config.s3_endpoint_url, "fs.s3a.path.style.access": "true",
                      "fs.s3a.connection.ssl.enabled": str(config.s3_endpoint_url.startswith("https:")).lower()})
    if config.s3_access_key or config.s3_secret_key:
        props.update({"fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                      "fs.s3a.access.key": config.s3_access_key or "", "fs.s3a.secret.key": config.s3_secret_key or ""})
    return {**{f"spark.hadoop.{k}": v for k, v in props.items()}, S3_TIMEOUT_PROPERTY: str(config.s3_timeout_s)}


def s3_settings_from_spark(conf: Mapping[str, str]) -> dict:
    """The ``PipelineConfig`` S3 settings that ``s3a_properties`` turned into ``conf`` (a Spark conf as a dict)."""
    get = lambda key: conf.get(f"spark.hadoop.fs.s3a.{key}") or None  # noqa: E731
    out = {"s3_endpoint_url": get("endpoint"), "s3_access_key": get("access.key"),
           "s3_secret_key": get("secret.key")}
    if get("endpoint.region"):
        out["s3_region"] = get("endpoint.region")
    if conf.get(S3_TIMEOUT_PROPERTY):
        out["s3_timeout_s"] = float(conf[S3_TIMEOUT_PROPERTY])
    return {k: v for k, v in out.items() if v is not None}


def split_secrets(props: Mapping[str, str]) -> tuple[dict, dict]:
    """(public, secret) properties: a property is secret when its name matches ``SECRET_PROPERTY``."""
    public, secret = {}, {}
    for k, v in props.items():
        (secret if SECRET_PROPERTY.search(k) else public)[k] = str(v)
    return public, secret


def java_options(props: Mapping[str, str], key: str, *options: str) -> str:
    """``props[key]`` (``spark.driver.extraJavaOptions`` and the like) with ``options`` put first."""
    return " ".join([*options, props.get(key, "")]).strip()


def write_properties(path: Path, props: Mapping[str, str]) -> Path:
    """A Java properties file only its owner can read (mode 0600 from the start, never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for k, v in props.items():
            f.write(f"{_escape(k, key=True)}={_escape(str(v))}\n")
    return path


def _escape(text: str, key: bool = False) -> str:
    """``java.util.Properties`` escaping: backslashes, line breaks, a leading blank; ``=``/``:``/blanks in keys."""
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if key:
        out = re.sub(r"([=: \t])", r"\\\1", out)
    elif out[:1] in (" ", "\t"):
        out = "\\" + out
    return out
