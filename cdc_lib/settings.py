"""The one settings model: what the agent and the pipeline are pointed at, and one way to load it.

``AgentConfig`` (YAML section ``agent:``) and ``PipelineConfig`` (section ``pipeline:``) are the consumers; the
command line, the environment, a YAML file, and for the Airflow DAGs a trigger's conf, an Airflow Variable and
the Airflow connections, all fill them through ``load``.

One rule everywhere: **flags (or a DAG run's conf) > named layers (the Airflow Variable and connections) >
environment > YAML file > defaults**, and a key that names no setting is an error that names the key and where it
came from (a typo must not be silently ignored). A settings class is a dataclass; ``load`` fills it from those
sources and converts each value to the field's type, so every consumer gets typed, validated settings and a
:class:`ConfigError` naming the source of any bad value.

* Flags: a mapping of field name to value (``None`` means "not given", as argparse leaves it).
* Layers: settings documents with a name, highest first, between the flags and the environment (the DAGs pass
  the Airflow connections and the Variable ``cassandra_cdc_settings``; see ``cdc_lib.pipeline.airflow``). A
  document has the YAML file's shape.
* Environment: ``CASSANDRA_CDC_<FIELD>`` (upper case), e.g. ``CASSANDRA_CDC_STORE_URL``. Mapping fields take JSON
  (``CASSANDRA_CDC_STORAGE_OPTIONS='{"endpoint_url": "http://127.0.0.1:8333"}'``). A ``CASSANDRA_CDC_`` variable
  that no consumer has is an error (``CASSANDRA_CDC_CONFIG`` names the file).
* YAML file: given explicitly or by ``CASSANDRA_CDC_CONFIG``. Top-level keys are shared by every consumer (each
  takes the ones it has); a section named after the consumer (``agent:``, ``pipeline:``) overrides them. Other
  consumers' sections are skipped; a key no consumer has is an error (it is almost always a typo).
  Example::

      store_url: s3://cdc-bucket/prod
      cluster: main
      storage_options: {endpoint_url: "http://minio:9000"}
      agent:
        cdc_raw: /var/lib/cassandra/cdc_raw
        cdc_total_space: 4096MiB

* Defaults: the dataclass defaults. A field without a default is required.

A field may carry ``metadata={"parse": fn}`` to convert strings its own way (sizes, for example),
``{"secret": True}`` (masked in ``to_dict``; the DAGs take it only from a connection, the environment or the
file, never from params or a Variable, which Airflow shows in its UI) or ``{"parse_time": True}`` (read when a
DAG file is parsed, not per run: the schedules).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, TypeVar

from .errors import ConfigError
from .storage.layout import Layout

ENV_PREFIX = "CASSANDRA_CDC_"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"
MiB = 1 << 20

T = TypeVar("T")

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
    "t": 1000 ** 4, "tb": 1000 ** 4,
    "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any) -> int:
    """A byte count from ``4096``, ``"4096MiB"``, ``"1.5GiB"`` or ``"10MB"`` (binary and decimal units)."""
    if isinstance(value, bool):
        raise ConfigError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"size must not be negative: {value}")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ConfigError(f"not a size: {value!r}")
        return int(value)
    m = _SIZE_RE.match(str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"not a size: {value!r} (examples: 4096MiB, 2GiB, 1048576)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_bool(value: Any) -> bool:
    """``true/false``, ``yes/no``, ``on/off``, ``1/0`` (case-insensitive) or a real bool."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "y"):
        return True
    if text in ("0", "false", "no", "off", "n", ""):
        return False
    raise ConfigError(f"not a boolean: {value!r}")


def parse_key_values(items: list[str] | None) -> dict[str, Any]:
    """``["endpoint_url=http://x", "anon=true"]`` -> dict; values that parse as JSON scalars are converted."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
            if isinstance(value, (dict, list)):
                value = raw
        except ValueError:
            value = raw
        out[key.strip()] = value
    return out


def _convert(cls_name: str, field: dataclasses.Field, hint: Any, value: Any, source: str) -> Any:
    """``value`` converted to the field's type; ConfigError names the field and where the value came from."""
    where = f"{cls_name}.{field.name} (from {source})"
    parse = field.metadata.get("parse") if field.metadata else None
    try:
        if value is None:
            return None
        if parse is not None:
            return parse(value)
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            non_none = [a for a in args if a is not type(None)]
            if isinstance(value, str) and value.strip().lower() in ("", "none", "null") and type(None) in args:
                return None
            hint = non_none[0] if len(non_none) == 1 else str
            origin = typing.get_origin(hint)
        if hint is bool:
            return parse_bool(value)
        if hint is int:
            if isinstance(value, bool):
                raise ConfigError("not an integer")
            return int(value)
        if hint is float:
            if isinstance(value, bool):
                raise ConfigError("not a number")
            return float(value)
        if hint is str:
            if isinstance(value, (dict, list)):
                raise ConfigError("expected a string")
            return str(value)
        if hint is Path:
            return Path(str(value)).expanduser()
        if hint is dict or origin is dict:
            if isinstance(value, str):
                value = json.loads(value) if value.strip() else {}
            if not isinstance(value, Mapping):
                raise ConfigError("expected a mapping")
            return dict(value)
        if hint is list or origin is list:
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            return list(value)
        return value
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: bad value {value!r}: {e}") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The YAML file as a mapping (an empty file is an empty mapping)."""
    import yaml  # PyYAML; imported here so that callers without a file do not need it

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    return data


def load(cls: type[T], *, flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
         config_file: str | Path | None = None, section: str | None = None,
         env_prefix: str = ENV_PREFIX, flags_source: str = "flag",
         layers: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> T:
    """An instance of settings class ``cls`` from flags > layers > environment > YAML file > defaults.

    ``env`` defaults to ``os.environ``; ``config_file`` defaults to ``$CASSANDRA_CDC_CONFIG`` if set. ``section``
    names this consumer's YAML section (default: the class's own, ``"agent"`` or ``"pipeline"``).
    ``flags_source`` says where the flags came from in error messages (``"flag"``, ``"trigger conf"``).
    ``layers``: (name, settings document) pairs, highest first; a document has the YAML file's shape.
    """
    return load_with_sources(cls, flags=flags, env=env, config_file=config_file, section=section,
                             env_prefix=env_prefix, flags_source=flags_source, layers=layers)[0]


def load_with_sources(cls: type[T], *, flags: Mapping[str, Any] | None = None,
                      env: Mapping[str, str] | None = None, config_file: str | Path | None = None,
                      section: str | None = None, env_prefix: str = ENV_PREFIX, flags_source: str = "flag",
                      layers: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> tuple[T, dict[str, str]]:
    """``load``, and where each setting that is not a default came from (field name -> source)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    env = os.environ if env is None else env
    section = section or SECTIONS.get(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    values: dict[str, tuple[Any, str]] = {}

    if config_file is None:
        config_file = env.get(CONFIG_FILE_ENV) or None
    if config_file is not None:
        where = f"config file {config_file}"
        for key, value in document_settings(read_yaml(config_file), where, fields, section).items():
            values[key] = (value, where)

    for var in env:
        if not var.startswith(env_prefix) or var == CONFIG_FILE_ENV:
            continue
        name = var[len(env_prefix):].lower()
        if name in fields:
            values[name] = (env[var], f"environment {var}")
        elif name not in _known_keys() and var not in OTHER_ENV:
            raise ConfigError(f"unknown setting in the environment: {var} (no consumer has {name!r}; "
                              f"see cdc_lib.settings)")

    for where, document in reversed(layers):       # lowest first, so that a higher layer overwrites
        for key, value in document_settings(document, where, fields, section).items():
            if value is not None:
                values[key] = (value, where)

    for name, value in (flags or {}).items():
        if name not in fields:
            raise ConfigError(f"{cls.__name__}: unknown setting {name!r} (from {flags_source})")
        if value is not None:
            src = f"flag --{name.replace('_', '-')}" if flags_source == "flag" else f"{flags_source} {name!r}"
            values[name] = (value, src)

    kwargs: dict[str, Any] = {}
    for name, (value, source) in values.items():
        kwargs[name] = _convert(cls.__name__, fields[name], hints.get(name, Any), value, source)
    missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        hint = ", ".join(f"--{m.replace('_', '-')} / {env_prefix}{m.upper()}" for m in missing)
        raise ConfigError(f"{cls.__name__}: missing required setting(s): {hint}")
    try:
        instance = cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{cls.__name__}: {e}") from None
    return instance, {name: source for name, (_, source) in values.items()}


def document_settings(data: Mapping[str, Any], where: str, fields: Mapping[str, Any],
                      section: str | None) -> dict[str, Any]:
    """A consumer's settings from one settings document (the YAML file, an Airflow Variable): its top-level
    keys, then its section over them. ``where`` names the document in errors."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must hold a mapping of settings, not {type(data).__name__}")
    ours: dict[str, Any] = {}
    for key, value in data.items():
        if key in fields:
            ours[key] = value
        elif key in SECTIONS.values() or key in _known_keys():
            continue  # a consumer's section (ours is read below), or another consumer's setting
        else:
            raise ConfigError(f"{where}: unknown setting {key!r} (no consumer has it)")
    if section is not None and section in data:
        sect = data[section] or {}
        if not isinstance(sect, Mapping):
            raise ConfigError(f"{where}: section {section!r} must be a mapping")
        for key, value in sect.items():
            if key not in fields:
                raise ConfigError(f"{where}: unknown setting {section}.{key}")
            ours[key] = value
    return ours


def _known_keys() -> set:
    return {f.name for cls in SECTIONS for f in dataclasses.fields(cls)}


# ---------------------------------------------------------------------------------------------------- consumers


def _relative_local_path(url: str) -> bool:
    """True for a local path (no scheme, or file://) that is not absolute (``~`` counts as absolute)."""
    if "://" in url and not url.startswith("file://"):
        return False
    path = url.removeprefix("file://")
    return not (os.path.isabs(path) or path.startswith("~"))



@dataclass
class AgentConfig:
    """Agent settings (flags > ``CASSANDRA_CDC_*`` environment > YAML ``agent:`` section > defaults)."""

    cdc_raw: Path
    store_url: str
    cluster: str
    node: str = field(default_factory=lambda: socket.gethostname())
    storage_options: dict = field(default_factory=dict)
    poll_interval: float = 1.0
    state_dir: Path | None = None  # default: <cdc_raw>/../cassandra-cdc-agent (never inside cdc_raw)
    ship_live_prefix: bool = False
    cdc_total_space: int | None = field(default=None, metadata={"parse": parse_size})
    warn_usage_fraction: float = 0.5
    rate_window: float = 300.0  # seconds over which arrival and ship rates are compared
    max_backoff: float = 60.0
    # An empty segment link a clean Cassandra shutdown left in cdc_raw is deleted once its last link change is
    # this old (Cassandra itself deletes the link of a CDC-free segment right after the segment: never race it).
    orphan_grace_s: float = 60.0
    log_level: str = "INFO"
    datacenter: str | None = None       # this node's datacenter (for the pipeline's local_datacenter)
    metrics_port: int | None = None     # serve /metrics and /health on this port (0: any free port); None: off
    metrics_host: str = "127.0.0.1"     # the endpoint is unauthenticated: bind wider only behind a firewall

    def __post_init__(self) -> None:
        self.cdc_raw = Path(self.cdc_raw)
        if self.state_dir is None:
            self.state_dir = self.cdc_raw.resolve().parent / "cassandra-cdc-agent"
        self.state_dir = Path(self.state_dir)
        Layout.area_prefix(Layout.INCOMING, self.cluster, self.node)  # validates both names (ConfigError)
        if not self.poll_interval > 0:
            raise ConfigError(f"poll_interval must be > 0, got {self.poll_interval}")
        if not 0 < self.warn_usage_fraction <= 1:
            raise ConfigError(f"warn_usage_fraction must be in (0, 1], got {self.warn_usage_fraction}")
        if self.cdc_total_space is not None and self.cdc_total_space <= 0:
            raise ConfigError(f"cdc_total_space must be > 0, got {self.cdc_total_space}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be a TCP port (0-65535), got {self.metrics_port}")
        if self.orphan_grace_s < 0:
            raise ConfigError(f"orphan_grace_s must be >= 0, got {self.orphan_grace_s}")
        if self.max_backoff < self.poll_interval:
            self.max_backoff = self.poll_interval
        try:
            if self.state_dir.resolve().is_relative_to(self.cdc_raw.resolve()):
                raise ConfigError(f"state_dir {self.state_dir} must not be inside cdc_raw {self.cdc_raw}")
        except OSError:
            pass


SECRET = {"secret": True}           # field metadata: see the module docstring
PARSE_TIME = {"parse_time": True}


@dataclass
class PipelineConfig:
    """Pipeline settings (section ``pipeline:``); the DAGs build one per task (``cdc_lib.pipeline.airflow``).

    Local paths must be absolute: the steps run in Airflow workers whose working directory is nobody's choice.
    """

    store_url: Optional[str] = None            # absolute local directory or s3://bucket/prefix; required to run
    s3_endpoint_url: Optional[str] = None      # S3 endpoint (SeaweedFS, MinIO...); None: AWS / AWS_* env
    s3_access_key: Optional[str] = field(default=None, metadata=SECRET)
    s3_secret_key: Optional[str] = field(default=None, metadata=SECRET)
    s3_region: str = "us-east-1"
    s3_timeout_s: float = 30.0                 # connect/read timeout of one S3 request (fsspec, delta-rs, and s3a
                                               # on Spark: cdc_lib.spark.conf.s3a_timeouts)
    cluster: str = "cluster1"
    schema_source: str = "cql"                 # cql (schema_file) | driver (cassandra_hosts)
    schema_file: Optional[str] = None          # CQL DDL with `ID = ...` table options (DESCRIBE output)
    cassandra_hosts: list = field(default_factory=list)
    cassandra_port: int = 9042
    cassandra_username: Optional[str] = None
    cassandra_password: Optional[str] = field(default=None, metadata=SECRET)
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_format: str = "json"                 # json | avro (Confluent wire format with schema_registry_url,
                                               # Avro single-object encoding without)
    topic_prefix: str = "cdc"
    schema_registry_url: Optional[str] = None
    kafka_partitions: int = 1                  # of the topics the pipeline creates
    kafka_replication_factor: int = -1         # of the topics the pipeline creates; -1: the brokers' default
    kafka_topic_config: dict = field(default_factory=dict)   # topic configs at creation (cleanup.policy=compact...)
    kafka_timeout_s: float = 30.0
    # A Kafka tombstone (the key, a null value) after each delete event, so that log compaction removes deleted
    # keys; None: when kafka_topic_config's cleanup.policy compacts
    kafka_tombstones: Optional[bool] = None
    kafka_transactions: bool = False           # each batch one Kafka transaction (atomic for read_committed readers)
    # librdkafka client settings: security.protocol, sasl.*, ssl.*, compression.type... (the Kafka connection's
    # extras and login/password); secret: may hold passwords
    kafka_config: dict = field(default_factory=dict, metadata=SECRET)
    schema_registry_config: dict = field(default_factory=dict, metadata=SECRET)   # basic.auth.user.info, ssl.*
    max_segments: int = 64                     # per batch
    # per batch (at least one segment is always taken); on a local master (no spark_submit) a batch is also kept
    # within driver_batch_max_bytes, so that it runs in the transform's own process (claim)
    max_bytes: int = 256 * MiB
    # Commit logs encrypted with Cassandra's transparent_data_encryption_options: the node's keystore (JCEKS, JKS
    # or PKCS12) and its passwords from files, or CASSANDRA_CDC_KEYSTORE_PASSWORD / CASSANDRA_CDC_KEY_PASSWORD
    # (the key password defaults to the keystore's, as in Cassandra's JKSKeyProvider); never a setting's value
    keystore: Optional[str] = None
    keystore_password_file: Optional[str] = None
    key_password_file: Optional[str] = None
    spark_master: str = "local[2]"
    spark_submit: bool = False                 # run the job with spark-submit instead of in-process
    spark_submit_bin: str = "spark-submit"
    # A spark-submit job still running after this long is stopped and the transform fails (the next run retries the
    # batch): whatever hangs it (a store that stops answering, a lost cluster), it never holds a batch for ever
    spark_submit_timeout_s: float = 3600.0
    # Delta Lake and s3a jars: jar files or directories, comma-separated; None: .jvm/lib/delta and .jvm/lib/s3a of
    # this checkout (scripts/setup.sh); "none": the cluster has them (cdc_lib.spark.conf)
    spark_jars: Optional[str] = None
    spark_conf: dict = field(default_factory=dict)   # more Spark properties (spark-submit --conf)
    # Batches of at most this many bytes of segments, on a local master, run in the transform step's own process
    # without Spark (no JVM, no task costs; Delta written by delta-rs); 0: always Spark
    driver_batch_max_bytes: int = field(default=32 * MiB, metadata={"parse": parse_size})
    now: Optional[int] = None                  # fixed processing time (seconds) for tests/demo; None: wall clock
    sweep_interval_s: int = 300                # an empty run sweeps TTL expiries this long after the last batch
    # A scheduled run of the cassandra_cdc DAG, after its first batch, keeps taking batches in the same process
    # (steps.run_for) until follow_margin_s before the next run is due, looking for new segments every
    # follow_poll_s while idle: a segment waits seconds for its batch, not the rest of the schedule interval
    follow_schedule: bool = True
    follow_poll_s: float = 2.0
    follow_margin_s: float = 5.0
    # When a process takes several batches (follow, run_until_idle), each is published and archived on a second
    # thread while the next one is claimed and transformed (publishes stay in batch order); false: one at a time
    overlap_batches: bool = True
    warn_no_segments_s: int = 3600             # claim warns when no segment arrived for this long (0: never)
    vacuum_retention_hours: int = 168          # Delta history the maintenance DAG keeps
    # The maintenance DAG deletes the outbox rows of batches published and archived longer ago than this (their
    # events are in Kafka; a re-emit needs them: pipeline.replay); None: keep them for ever
    outbox_retention_hours: Optional[int] = 168
    local_datacenter: Optional[str] = None     # process only segments of nodes whose agent says this datacenter
    # What is captured, besides cdc = true (cql.capture): keyspaces, keyspace.table, keyspace.table.column;
    # a list or a comma-separated string. Empty include lists include everything.
    include_keyspaces: list = field(default_factory=list)
    exclude_keyspaces: list = field(default_factory=list)
    include_tables: list = field(default_factory=list)
    exclude_tables: list = field(default_factory=list)
    exclude_columns: list = field(default_factory=list)
    delta_lock_wait_s: float = 900.0           # how long a transform or the maintenance DAG waits for the other to
                                               # finish writing the Delta tables (storage.lock)
    delta_lock_ttl_s: float = 60.0             # the lock's lease on S3: a holder that died frees it after this long
    app_id: str = "cassandra-cdc"
    kafka_conn_id: str = "cassandra_cdc_kafka"          # Airflow connections the DAG reads (see pipeline.airflow)
    s3_conn_id: str = "cassandra_cdc_s3"
    cassandra_conn_id: str = "cassandra_cdc_cassandra"
    # When the DAG files are parsed (not per run): a cron expression, a preset (@hourly), a duration (30s, 5m,
    # 2h) or none (manual runs only).
    schedule: Optional[str] = field(default="* * * * *", metadata=PARSE_TIME)
    maintenance_schedule: Optional[str] = field(default="@hourly", metadata=PARSE_TIME)

    def __post_init__(self) -> None:
        for name in ("store_url", "schema_file"):
            value = getattr(self, name)
            if value is not None and _relative_local_path(value):
                raise ConfigError(
                    f"{name} {value!r} is a relative path: the pipeline's steps run in worker processes whose "
                    f"working directory is not yours (under Airflow, the scheduler's or worker's), so it would "
                    f"resolve to {os.path.abspath(value.removeprefix('file://'))!r}. Give an absolute path"
                    + (" or a URL such as s3://bucket/prefix" if name == "store_url" else ""))
        if self.schema_source not in ("cql", "driver"):
            raise ConfigError(f"schema_source must be 'cql' or 'driver', got {self.schema_source!r}")
        if self.outbox_retention_hours is not None and self.outbox_retention_hours < 0:
            raise ConfigError(f"outbox_retention_hours must be >= 0 (or none: keep every batch), got "
                              f"{self.outbox_retention_hours}")
        if not self.spark_submit_timeout_s > 0:
            raise ConfigError(f"spark_submit_timeout_s must be > 0, got {self.spark_submit_timeout_s}")
        if self.warn_no_segments_s < 0:
            raise ConfigError(f"warn_no_segments_s must be >= 0 (0: never warn), got {self.warn_no_segments_s}")
        if not 0 < self.follow_poll_s < math.inf:
            raise ConfigError(f"follow_poll_s must be a number of seconds > 0, got {self.follow_poll_s}")
        if not 0 <= self.follow_margin_s < math.inf:
            raise ConfigError(f"follow_margin_s must be a number of seconds >= 0, got {self.follow_margin_s}")

    @classmethod
    def from_mapping(cls, values: dict, source: str = "DAG params") -> "PipelineConfig":
        """From ``values`` (JSON, a script's dict) through ``load``: None and "" keep the default; a key that
        names no setting is an error naming it. The environment and files are not read."""
        given = {k: (None if v == "" else v) for k, v in (values or {}).items()}
        return load(cls, flags=given, env={}, flags_source=source)

    def to_dict(self) -> dict:
        """The settings as a dict, secrets masked (safe to log)."""
        d = dataclasses.asdict(self)
        for f in dataclasses.fields(self):
            if f.metadata.get("secret") and d[f.name]:
                d[f.name] = "***"
        return d

    @property
    def publishes_tombstones(self) -> bool:
        """Whether a tombstone follows each delete event (``kafka_tombstones``; by default on compacted topics)."""
        if self.kafka_tombstones is not None:
            return self.kafka_tombstones
        return "compact" in str(self.kafka_topic_config.get("cleanup.policy", ""))

    @property
    def remote(self) -> bool:
        return "://" in self.store_url and not self.store_url.startswith("file://")

    def fs_options(self) -> dict:
        """fsspec/s3fs options for ``ObjectStore.from_url``."""
        if not self.remote:
            return {}
        opts: dict = {}
        if self.s3_access_key:
            opts["key"] = self.s3_access_key
        if self.s3_secret_key:
            opts["secret"] = self.s3_secret_key
        client = {"region_name": self.s3_region}
        if self.s3_endpoint_url:
            client["endpoint_url"] = self.s3_endpoint_url
        opts["client_kwargs"] = client
        opts["config_kwargs"] = {"connect_timeout": min(5.0, self.s3_timeout_s), "read_timeout": self.s3_timeout_s,
                                 "retries": {"max_attempts": 2}}
        return opts

    def delta_options(self) -> dict:
        """deltalake (object_store crate) ``storage_options``."""
        if not self.remote:
            return {}
        # Delta commits are conditional PUTs (If-None-Match: two writers can never both create a version), which
        # S3 and S3-compatible stores support; said explicitly so that a library default cannot turn it off.
        # A request gives up after s3_timeout_s; retries stop after a few of those (object_store would retry for
        # 3 minutes): a store that stopped answering fails the step, which the next run retries whole.
        opts = {"AWS_REGION": self.s3_region, "conditional_put": "etag",
                "timeout": f"{int(max(1, self.s3_timeout_s))}s",
                "retry_timeout": f"{int(max(1, 3 * self.s3_timeout_s))}s"}
        if self.s3_endpoint_url:
            opts["AWS_ENDPOINT_URL"] = self.s3_endpoint_url
            if self.s3_endpoint_url.startswith("http://"):
                opts["AWS_ALLOW_HTTP"] = "true"
        if self.s3_access_key:
            opts["AWS_ACCESS_KEY_ID"] = self.s3_access_key
        if self.s3_secret_key:
            opts["AWS_SECRET_ACCESS_KEY"] = self.s3_secret_key
        return opts


# Each consumer's YAML section; every key of every consumer is a known key for the others (one shared file).
SECTIONS = {AgentConfig: "agent", PipelineConfig: "pipeline"}
# The passwords of ``cassandra-cdc inspect --keystore`` (see ``secret``).
KEYSTORE_PASSWORD_ENV = ENV_PREFIX + "KEYSTORE_PASSWORD"
KEY_PASSWORD_ENV = ENV_PREFIX + "KEY_PASSWORD"
# CASSANDRA_CDC_ variables that are not settings of a consumer (read where they are used):
# CASSANDRA_CDC_NATIVE (0, 1 or auto) chooses the compiled core or pure Python: the reader (cdc_lib.celllog.native)
# and the state engine (cdc_lib.state.native).
OTHER_ENV = frozenset({KEYSTORE_PASSWORD_ENV, KEY_PASSWORD_ENV, "CASSANDRA_CDC_NATIVE"})


# ---------------------------------------------------------------------------------------------------- secrets
# fsspec storage options that hold credentials (s3fs, gcsfs, adlfs): never taken from a command line, which
# every user of the machine reads in the process list (``ps``).
SECRET_STORAGE_OPTIONS = frozenset({
    "key", "secret", "token", "password", "session_token", "aws_access_key_id", "aws_secret_access_key",
    "aws_session_token", "account_key", "sas_token", "client_secret", "connection_string", "credentials"})


def read_secret_file(path: str | Path, what: str) -> str:
    """A secret kept in a file (the first line, without its line break; the file should be readable by its owner
    only). ConfigError naming the file when it cannot be read or is empty."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} file {p}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    value = text.split("\n", 1)[0].rstrip("\r")
    if not value:
        raise ConfigError(f"{what} file {p} is empty (the secret is its first line)")
    return value


def secret(what: str, *, file: str | Path | None = None, env_var: str | None = None,
           env: Mapping[str, str] | None = None, command_line: str | None = None) -> str | None:
    """A secret from a file, else the environment variable ``env_var``; ``command_line`` is the value of an
    older flag that takes the secret itself (given together with a file it is an error). None when unset."""
    if file is not None and command_line is not None:
        raise ConfigError(f"give the {what} once: in a file or (visible to every user in the process list) on "
                          "the command line, not both")
    if file is not None:
        return read_secret_file(file, what)
    if command_line is not None:
        return command_line
    env = os.environ if env is None else env
    return (env.get(env_var) or None) if env_var else None
