"""The Airflow 3 DAGs import cleanly and are wired as the pipeline needs (schedule, one run at a time, order)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from cdc_lib.pipeline.airflow import config_from_params, default_params
from cdc_lib.settings import PipelineConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    env = {"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from airflow.dag_processing.dagbag import DagBag
        yield DagBag(str(REPO / "dags"))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _order(dag) -> list:
    """Task ids in dependency order (the DAGs here are chains)."""
    roots = [t for t in dag.tasks if not t.upstream_task_ids]
    assert len(roots) == 1, [t.task_id for t in roots]
    out, t = [], roots[0]
    while True:
        out.append(t.task_id)
        down = sorted(t.downstream_task_ids)
        if not down:
            return out
        assert len(down) == 1, (t.task_id, down)
        t = dag.get_task(down[0])


def test_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert {"cassandra_cdc", "cassandra_cdc_maintenance", "cassandra_cdc_backfill"} <= set(dagbag.dag_ids)


def test_main_dag_schedule_and_task_order(dagbag):
    dag = dagbag.dags["cassandra_cdc"]
    assert getattr(dag.timetable, "expression", None) == "* * * * *" or "* * * * *" in repr(dag.timetable)
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    assert _order(dag) == ["claim", "transform", "publish", "archive"]
    for t in dag.tasks:
        assert t.retries >= 1, t.task_id        # each step is idempotent: retrying is how outages heal
    assert type(dag.get_task("claim")).__name__.startswith("_ShortCircuit")


def test_params_are_the_pipeline_settings_with_defaults(dagbag):
    for dag_id in ("cassandra_cdc", "cassandra_cdc_maintenance", "cassandra_cdc_backfill"):
        params = dagbag.dags[dag_id].params
        for name, value in default_params().items():
            assert name in params, (dag_id, name)
            assert params[name] == value, (dag_id, name)
    # the defaults give the embedded setup's config
    dag_params = {k: dagbag.dags["cassandra_cdc"].params[k] for k in default_params()}
    assert config_from_params(dag_params, lambda conn_id: None) == PipelineConfig()


def test_every_dags_params_as_its_tasks_get_them_make_a_pipeline_config(dagbag):
    """A task builds its config from *all* of its DAG's params: a DAG-only param would fail every run (the
    maintenance DAG's vacuum_retention_hours did, once settings rejected unknown keys)."""
    for dag_id in ("cassandra_cdc", "cassandra_cdc_maintenance", "cassandra_cdc_backfill"):
        params = dagbag.dags[dag_id].params
        assert config_from_params({k: params[k] for k in params.keys()}, lambda conn_id: None) == PipelineConfig()
    assert PipelineConfig.from_mapping({"vacuum_retention_hours": 24}).vacuum_retention_hours == 24


def test_maintenance_and_backfill_wiring(dagbag):
    m = dagbag.dags["cassandra_cdc_maintenance"]
    assert m.catchup is False and m.max_active_runs == 1
    assert _order(m) == ["expiry_sweep", "delta_upkeep"]
    b = dagbag.dags["cassandra_cdc_backfill"]
    assert b.timetable.__class__.__name__ == "NullTimetable"     # manual only
    assert _order(b) == ["request_snapshot"]


def test_connections_override_params():
    """Kafka, S3 and Cassandra come from Airflow connections when they exist; params otherwise."""
    conns = {
        "cassandra_cdc_kafka": SimpleNamespace(host="k1:9092,k2:9092", port=None, login=None, password=None,
                                               extra_dejson={"schema_registry_url": "http://sr:8081"}),
        "cassandra_cdc_s3": SimpleNamespace(host=None, port=None, login="AK", password="SK",
                                            extra_dejson={"endpoint_url": "http://minio:9000",
                                                          "region_name": "eu-west-1"}),
        "cassandra_cdc_cassandra": SimpleNamespace(host="c1,c2", port=9142, login="u", password="p",
                                                   extra_dejson={}),
    }
    cfg = config_from_params({**default_params(), "store_url": "s3://b/p", "max_segments": "5"}, conns.get)
    assert cfg.kafka_bootstrap == "k1:9092,k2:9092"
    assert cfg.schema_registry_url == "http://sr:8081"
    assert (cfg.s3_access_key, cfg.s3_secret_key, cfg.s3_endpoint_url, cfg.s3_region) == \
        ("AK", "SK", "http://minio:9000", "eu-west-1")
    assert cfg.cassandra_hosts == ["c1", "c2"] and cfg.cassandra_port == 9142
    assert cfg.max_segments == 5
    delta = cfg.delta_options()
    assert delta["AWS_ENDPOINT_URL"] == "http://minio:9000" and delta["AWS_ALLOW_HTTP"] == "true"
    assert cfg.fs_options()["client_kwargs"]["endpoint_url"] == "http://minio:9000"
    assert "SK" not in json.dumps(cfg.to_dict())          # secrets never reach logs via to_dict
    # without connections, the params stand
    plain = config_from_params({**default_params(), "kafka_bootstrap": "127.0.0.1:1234"}, lambda c: None)
    assert plain.kafka_bootstrap == "127.0.0.1:1234" and plain.s3_access_key is None
