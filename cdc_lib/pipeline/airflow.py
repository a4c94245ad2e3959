"""Airflow glue: where a DAG run's ``PipelineConfig`` comes from (the DAG files call only these).

Every task loads its settings through ``cdc_lib.settings.load``, the same loader as the agent and the CLI, from,
highest first:

1. **the run's conf** (``airflow dags trigger --conf``, the trigger form): for one manual run. The DAG params
   default to nothing, so a scheduled run is never pinned to a param default;
2. **the Airflow connections** ``cassandra_cdc_kafka``, ``cassandra_cdc_s3``, ``cassandra_cdc_cassandra`` (names
   are settings too), for endpoints and credentials;
3. **the Airflow Variable** ``cassandra_cdc_settings``: a JSON (or YAML) document of settings, the settings file's
   shape (``{"store_url": "s3://cdc/prod", "cluster": "prod", "schema_file": "/etc/cdc/schema.cql"}``);
4. **the environment** of the Airflow workers: ``CASSANDRA_CDC_<SETTING>``;
5. **the settings file** named by ``CASSANDRA_CDC_CONFIG`` (the agent's file works: keys of other consumers are
   skipped);
6. the defaults of ``PipelineConfig``.

Why this order: the narrower and later-bound source wins. A run's conf concerns one run. Connections and the
Variable are Airflow's own stores, edited in the UI or the CLI (or a secrets backend) and read at each task, so
an operator changes them without restarting anything; the environment and the file are fixed when the workers
start and are shared with the agent and the CLI, where the environment already overrides the file.

Secrets (``s3_access_key``, ``s3_secret_key``, ``cassandra_password``) are never DAG params and are refused in
the conf and the Variable: Airflow shows both in its UI and logs. They come from the connections, the environment
or the file. The schedules are read when the DAG files are parsed (``dag_schedule``), so from the environment or
the file only.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import typing
from datetime import timedelta
from typing import Any, Callable, Mapping

from cdc_lib.errors import ConfigError
from cdc_lib.settings import PipelineConfig, load, load_with_sources

log = logging.getLogger("cassandra_cdc.pipeline")

SETTINGS_VARIABLE = "cassandra_cdc_settings"

_FIELDS = dataclasses.fields(PipelineConfig)
SECRET_SETTINGS = tuple(f.name for f in _FIELDS if f.metadata.get("secret"))
PARSE_TIME_SETTINGS = tuple(f.name for f in _FIELDS if f.metadata.get("parse_time"))


def _refuse(where: str, values: Mapping[str, Any]) -> None:
    """Secrets and parse-time settings have no business in a run's conf or the Variable: say where they go."""
    for name, value in values.items():
        if value is None:
            continue
        if name in SECRET_SETTINGS:
            raise ConfigError(f"{name} is a secret and must not be in the {where} (Airflow shows it in the UI "
                              f"and logs): put it in the Airflow connection, CASSANDRA_CDC_{name.upper()} or the "
                              "settings file")
        if name in PARSE_TIME_SETTINGS:
            raise ConfigError(f"{name} is read when the DAG file is parsed, not per run, so the {where} cannot "
                              f"set it: use CASSANDRA_CDC_{name.upper()} or the settings file")


def _variable_document(text: Any) -> Mapping[str, Any]:
    """The Variable's value (JSON or YAML text) as a settings document."""
    if isinstance(text, Mapping):
        return text
    import yaml
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"Airflow Variable {SETTINGS_VARIABLE} is neither JSON nor YAML: {e}") from None
    return {} if data is None else data


def _connection_settings(config: PipelineConfig, connection: Callable[[str], Any]) -> list:
    """(source, settings) of each Airflow connection that is defined, highest first.

    ``connection(conn_id)`` returns an object with ``host``, ``port``, ``login``, ``password``, ``extra_dejson``
    (an Airflow ``Connection``) or None. Kafka: host (or extra ``bootstrap.servers``) = bootstrap servers, extra
    ``schema_registry_url``, every other extra with a dot in its name a librdkafka client setting
    (``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``, ``compression.type``...), login/password =
    ``sasl.username``/``sasl.password``; they become ``kafka_config``, a secret (never shown or logged). S3:
    login/password = access/secret key, extra ``endpoint_url`` (or host), ``region_name``. Cassandra: host =
    comma-separated contact points, port, login, password.
    """
    layers = []
    kafka = connection(config.kafka_conn_id)
    if kafka is not None:
        extra = dict(kafka.extra_dejson or {})
        registry_url = extra.pop("schema_registry_url", None)
        bootstrap = extra.pop("bootstrap.servers", None)     # the layout of Airflow's own Kafka connections
        extra.pop("group.id", None)                            # a consumer's: the pipeline only produces
        if kafka.host:
            bootstrap = kafka.host if (":" in kafka.host or not kafka.port) else f"{kafka.host}:{kafka.port}"
        client = {k: v for k, v in extra.items() if "." in k}  # librdkafka properties
        if kafka.login:
            client.setdefault("sasl.username", kafka.login)
        if kafka.password:
            client.setdefault("sasl.password", kafka.password)
        layers.append((f"Airflow connection {config.kafka_conn_id}",
                       {"kafka_bootstrap": bootstrap, "schema_registry_url": registry_url,
                        "kafka_config": client or None}))
    s3 = connection(config.s3_conn_id)
    if s3 is not None:
        extra = s3.extra_dejson or {}
        layers.append((f"Airflow connection {config.s3_conn_id}", {
            "s3_access_key": s3.login or extra.get("aws_access_key_id"),
            "s3_secret_key": s3.password or extra.get("aws_secret_access_key"),
            "s3_endpoint_url": (extra.get("endpoint_url") or (extra.get("config_kwargs") or {}).get("endpoint_url")
                                or s3.host),
            "s3_region": extra.get("region_name")}))
    cass = connection(config.cassandra_conn_id)
    if cass is not None and cass.host:
        layers.append((f"Airflow connection {config.cassandra_conn_id}", {
            "cassandra_hosts": cass.host, "cassandra_port": cass.port, "cassandra_username": cass.login,
            "cassandra_password": cass.password}))
    return layers


def pipeline_config(conf: Mapping[str, Any] | None, variable: Any, connection: Callable[[str], Any], *,
                    env: Mapping[str, str] | None = None) -> tuple[PipelineConfig, dict[str, str]]:
    """The settings of one DAG run, and where each came from (see the module docstring for the order).

    ``conf``: the run's params (None = not given); ``variable``: the Variable's value or None; ``connection``:
    conn_id -> Airflow connection or None; ``env``: default ``os.environ``.
    """
    given = {k: v for k, v in (conf or {}).items() if v is not None and v != ""}
    _refuse("trigger conf", given)
    layers = []
    if variable is not None:
        where = f"Airflow Variable {SETTINGS_VARIABLE}"
        document = _variable_document(variable)
        if not isinstance(document, Mapping):
            raise ConfigError(f"{where} must hold a mapping of settings, not {type(document).__name__}")
        _refuse(f"Variable {SETTINGS_VARIABLE}", {**document, **(document.get("pipeline") or {})})
        layers.append((where, document))
    # The connection ids are settings themselves: find them first, then read those connections.
    names = load(PipelineConfig, flags=given, flags_source="trigger conf", layers=layers, env=env)
    layers = _connection_settings(names, connection) + layers
    return load_with_sources(PipelineConfig, flags=given, flags_source="trigger conf", layers=layers, env=env)


def describe_settings(config: PipelineConfig, sources: Mapping[str, str]) -> str:
    """One line per setting that is not a default, with its source (secrets masked): for the task log."""
    shown = config.to_dict()
    return "\n".join(f"  {name} = {shown[name]!r}  ({sources[name]})" for name in sorted(sources))


def config_from_airflow_context(*, show: bool = False, ignore: tuple = ()) -> PipelineConfig:
    """The PipelineConfig of the running Airflow task (its run's conf, connections, Variable, env, file);
    ``show``: log each setting that is not a default with its source (the first task of a run does); ``ignore``:
    the DAG's own params that are not settings (the backfill's mode and its arguments)."""
    from airflow.sdk import Variable, get_current_context
    params = {k: v for k, v in get_current_context()["params"].items() if k not in ignore}
    config, sources = pipeline_config(params, Variable.get(SETTINGS_VARIABLE, default=None), airflow_connection)
    if show:
        log.info("settings (defaults not shown):\n%s", describe_settings(config, sources))
    return config


def airflow_connection(conn_id: str):
    """The Airflow connection ``conn_id``, or None when it is not defined."""
    from airflow.sdk import BaseHook
    try:
        return BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - AirflowNotFoundException (or a task-SDK variant): not configured
        return None


def run_setting_names() -> list[str]:
    """The settings a run's conf may override: every PipelineConfig field but secrets and the schedules."""
    return [f.name for f in _FIELDS if f.name not in SECRET_SETTINGS and f.name not in PARSE_TIME_SETTINGS]


def airflow_params() -> dict:
    """The DAGs' ``params``: one per run setting, empty by default (empty = the deployment's setting)."""
    from airflow.sdk import Param
    json_types = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    hints = typing.get_type_hints(PipelineConfig)
    out = {}
    for name in run_setting_names():
        hint = hints[name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if args else hint
        kind = json_types.get(typing.get_origin(base) or base, "string")
        # a list may come comma-separated, a mapping as JSON text
        kinds = ["null", kind] + (["string"] if kind in ("array", "object") else [])
        out[name] = Param(None, type=kinds, description=(
            f"For this run only; empty: the deployment's setting (Variable {SETTINGS_VARIABLE}, "
            f"CASSANDRA_CDC_{name.upper()}, the settings file, else the default)."))
    return out


_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def schedule_value(text: str | None):
    """An Airflow ``schedule`` from a setting: a duration (``30s``, ``5m``) becomes a timedelta; a cron expression
    or a preset (``@hourly``) stays text; None means manual runs only."""
    if text is None:
        return None
    m = _DURATION.match(text)
    if m:
        if int(m.group(1)) == 0:
            raise ConfigError(f"schedule {text!r}: a duration must be > 0")
        return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    return text


def dag_schedules(env: Mapping[str, str] | None = None) -> tuple:
    """(``cassandra_cdc`` schedule, ``cassandra_cdc_maintenance`` schedule), read when the DAG files are parsed:
    from ``CASSANDRA_CDC_SCHEDULE`` / ``CASSANDRA_CDC_MAINTENANCE_SCHEDULE`` or the settings file, else the
    defaults (every minute, hourly). A bad setting fails the parse with a ConfigError naming it, so Airflow shows
    it as the DAG's import error."""
    config, sources = load_with_sources(PipelineConfig, env=env)
    out = []
    for name in PARSE_TIME_SETTINGS:
        text = getattr(config, name)
        value = schedule_value(text)
        if isinstance(value, str) and not value.startswith("@"):
            from airflow.timetables.trigger import CronTriggerTimetable
            try:
                CronTriggerTimetable(value, timezone="UTC").validate()
            except Exception as e:  # noqa: BLE001 - AirflowTimetableInvalid and whatever croniter raises
                raise ConfigError(f"{name} {text!r} (from {sources.get(name, 'the default')}) is not a cron "
                                  f"expression, a preset such as @hourly, a duration such as 30s or 5m, or none: "
                                  f"{e}") from None
        out.append(value)
    return tuple(out)
