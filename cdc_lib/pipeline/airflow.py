"""Airflow glue: DAG params and Airflow connections -> ``PipelineConfig`` (the DAG files call only these)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from cdc_lib.settings import PipelineConfig


def config_from_params(params: dict, connection: Callable[[str], Any]) -> PipelineConfig:
    """A PipelineConfig from DAG params, with Kafka/S3/Cassandra settings from Airflow connections.

    ``connection(conn_id)`` returns an object with ``host``, ``port``, ``login``, ``password``,
    ``extra_dejson`` (an Airflow ``Connection``), or None when that connection is not defined: the params'
    values (the embedded defaults) then stand. Connections: ``kafka_conn_id`` (host = bootstrap servers, extra
    ``schema_registry_url``), ``s3_conn_id`` (login/password = access/secret key, extra ``endpoint_url``,
    ``region_name``), ``cassandra_conn_id`` (host = comma-separated contact points, port, login, password).
    """
    values = dict(params or {})
    kafka = connection(values.get("kafka_conn_id") or "cassandra_cdc_kafka")
    if kafka is not None and kafka.host:
        values["kafka_bootstrap"] = kafka.host if (":" in kafka.host or not kafka.port) \
            else f"{kafka.host}:{kafka.port}"
        extra = kafka.extra_dejson or {}
        if extra.get("schema_registry_url"):
            values["schema_registry_url"] = extra["schema_registry_url"]
    s3 = connection(values.get("s3_conn_id") or "cassandra_cdc_s3")
    if s3 is not None:
        extra = s3.extra_dejson or {}
        values["s3_access_key"] = s3.login or extra.get("aws_access_key_id") or values.get("s3_access_key")
        values["s3_secret_key"] = s3.password or extra.get("aws_secret_access_key") or values.get("s3_secret_key")
        values["s3_endpoint_url"] = (extra.get("endpoint_url") or (extra.get("config_kwargs") or {}).get(
            "endpoint_url") or s3.host or values.get("s3_endpoint_url"))
        values["s3_region"] = extra.get("region_name") or values.get("s3_region")
    cass = connection(values.get("cassandra_conn_id") or "cassandra_cdc_cassandra")
    if cass is not None and cass.host:
        values["cassandra_hosts"] = cass.host
        values["cassandra_port"] = cass.port or values.get("cassandra_port")
        values["cassandra_username"] = cass.login
        values["cassandra_password"] = cass.password
    return PipelineConfig.from_mapping(values)


def default_params() -> dict:
    """The DAG params (and their defaults): every PipelineConfig field, the connection ids included."""
    d = dataclasses.asdict(PipelineConfig())
    d["cassandra_hosts"] = ""
    return d


def airflow_connection(conn_id: str):
    """The Airflow connection ``conn_id``, or None when it is not defined (the DAG params then apply)."""
    from airflow.sdk import BaseHook
    try:
        return BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - AirflowNotFoundException (or a task-SDK variant): not configured
        return None


def config_from_airflow_context() -> PipelineConfig:
    """The PipelineConfig of the running Airflow task (its params + connections)."""
    from airflow.sdk import get_current_context
    return config_from_params(dict(get_current_context()["params"]), airflow_connection)


def airflow_params() -> dict:
    """``default_params`` as Airflow ``Param`` objects (the DAGs' ``params``)."""
    from airflow.sdk import Param
    types = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    out = {}
    for k, v in default_params().items():
        t = types.get(type(v))
        out[k] = Param(v, type=["null", t] if t else ["null", "string", "integer", "number", "boolean"])
    return out
