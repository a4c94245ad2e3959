"""The Airflow 3 DAGs import cleanly and are wired as the pipeline needs (schedule, one run at a time, order)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from cdc_lib.errors import ConfigError
from cdc_lib.pipeline.airflow import dag_schedules, describe_settings, pipeline_config, run_setting_names
from cdc_lib.pipeline.follow import follow_seconds, next_run_due
from cdc_lib.pipeline.backfill import BACKFILL_ARGS
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
    assert _order(dag) == ["claim", "transform", "publish", "archive", "follow"]
    for t in dag.tasks:
        assert t.retries >= 1, t.task_id        # each step is idempotent: retrying is how outages heal
    claim = dag.get_task("claim")
    assert type(claim).__name__.startswith("_ShortCircuit")
    # nothing new skips the batch's steps but not follow, which waits for segments the rest of the interval;
    # a failed step stops the run (follow would only resume the failed batch outside its task's retries)
    assert claim.ignore_downstream_trigger_rules is False
    assert dag.get_task("follow").trigger_rule == "none_failed"
    assert {dag.get_task(t).trigger_rule for t in ("transform", "publish", "archive")} == {"all_success"}


def test_params_are_empty_so_scheduled_runs_take_the_deployments_settings(dagbag):
    """A scheduled run gets the params' defaults: they must be empty, or they would pin every scheduled run."""
    for dag_id in ("cassandra_cdc", "cassandra_cdc_maintenance", "cassandra_cdc_backfill"):
        params = dagbag.dags[dag_id].params
        own = set(BACKFILL_ARGS) if dag_id == "cassandra_cdc_backfill" else set()   # mode and its arguments
        assert set(params.keys()) == set(run_setting_names()) | own, dag_id
        assert all(params[name] is None for name in params.keys()), dag_id
        for secret in ("s3_access_key", "s3_secret_key", "cassandra_password"):
            assert secret not in params, (dag_id, secret)      # the UI shows params
    scheduled = {k: dagbag.dags["cassandra_cdc"].params[k] for k in run_setting_names()}
    cfg, _ = pipeline_config(scheduled, None, lambda conn_id: None, env={"CASSANDRA_CDC_STORE_URL": "s3://b/p"})
    assert cfg.store_url == "s3://b/p"


def test_every_dags_params_as_its_tasks_get_them_make_a_pipeline_config(dagbag):
    """A task builds its config from *all* of its DAG's params: a DAG-only param would fail every run (the
    maintenance DAG's vacuum_retention_hours did, once settings rejected unknown keys)."""
    for dag_id in ("cassandra_cdc", "cassandra_cdc_maintenance", "cassandra_cdc_backfill"):
        params = dagbag.dags[dag_id].params
        settings = {k: params[k] for k in params.keys() if k not in BACKFILL_ARGS}   # what the tasks pass on
        cfg, _ = pipeline_config(settings, None, lambda conn_id: None, env={})
        assert cfg == PipelineConfig()
    with pytest.raises(ConfigError, match="unknown setting 'mode'"):     # so the backfill task must leave them out
        pipeline_config({"mode": "replay"}, None, lambda conn_id: None, env={})
    assert PipelineConfig.from_mapping({"vacuum_retention_hours": 24}).vacuum_retention_hours == 24


def test_maintenance_and_backfill_wiring(dagbag):
    m = dagbag.dags["cassandra_cdc_maintenance"]
    assert m.catchup is False and m.max_active_runs == 1
    assert _order(m) == ["expiry_sweep", "delta_upkeep"]
    b = dagbag.dags["cassandra_cdc_backfill"]
    assert b.timetable.__class__.__name__ == "NullTimetable"     # manual only
    assert _order(b) == ["request_backfill"]


CONNECTIONS = {
    "cassandra_cdc_kafka": SimpleNamespace(host="k1:9092,k2:9092", port=None, login=None, password=None,
                                           extra_dejson={"schema_registry_url": "http://sr:8081"}),
    "cassandra_cdc_s3": SimpleNamespace(host=None, port=None, login="AK", password="SK",
                                        extra_dejson={"endpoint_url": "http://minio:9000", "region_name": "eu-west-1"}),
    "cassandra_cdc_cassandra": SimpleNamespace(host="c1,c2", port=9142, login="u", password="p", extra_dejson={}),
}


def test_connections_give_endpoints_and_credentials():
    cfg, sources = pipeline_config({"store_url": "s3://b/p", "max_segments": "5"}, None, CONNECTIONS.get, env={})
    assert cfg.kafka_bootstrap == "k1:9092,k2:9092"
    assert cfg.schema_registry_url == "http://sr:8081"
    assert (cfg.s3_access_key, cfg.s3_secret_key, cfg.s3_endpoint_url, cfg.s3_region) == \
        ("AK", "SK", "http://minio:9000", "eu-west-1")
    assert cfg.cassandra_hosts == ["c1", "c2"] and cfg.cassandra_port == 9142
    assert cfg.max_segments == 5
    assert sources["s3_secret_key"] == "Airflow connection cassandra_cdc_s3"
    delta = cfg.delta_options()
    assert delta["AWS_ENDPOINT_URL"] == "http://minio:9000" and delta["AWS_ALLOW_HTTP"] == "true"
    assert cfg.fs_options()["client_kwargs"]["endpoint_url"] == "http://minio:9000"
    assert "SK" not in json.dumps(cfg.to_dict()) and "'p'" not in describe_settings(cfg, sources)
    # without connections, the defaults stand
    plain, _ = pipeline_config({}, None, lambda c: None, env={})
    assert plain.kafka_bootstrap == "127.0.0.1:9092" and plain.s3_access_key is None


def test_precedence_conf_connections_variable_env_file_defaults(tmp_path):
    """Each source overrides the ones below it, setting by setting; the report names each setting's source."""
    settings_file = tmp_path / "cdc.yaml"
    settings_file.write_text("store_url: /from/file\ncluster: file\ntopic_prefix: file\nmax_segments: 1\n"
                             "max_bytes: 1\nkafka_bootstrap: file:1\ncdc_raw: /agent/only\n")
    env = {"CASSANDRA_CDC_CONFIG": str(settings_file), "CASSANDRA_CDC_CLUSTER": "env",
           "CASSANDRA_CDC_TOPIC_PREFIX": "env", "CASSANDRA_CDC_MAX_SEGMENTS": "2", "CASSANDRA_CDC_KAFKA_BOOTSTRAP": "env:1"}
    variable = json.dumps({"topic_prefix": "variable", "max_segments": 3, "kafka_bootstrap": "variable:1"})
    conf = {"max_segments": 4, "store_url": None, "cluster": ""}            # None and "" are "not given"
    cfg, sources = pipeline_config(conf, variable, CONNECTIONS.get, env=env)
    assert (cfg.store_url, cfg.max_bytes) == ("/from/file", 1)
    assert cfg.cluster == "env"
    assert cfg.topic_prefix == "variable"
    assert cfg.kafka_bootstrap == "k1:9092,k2:9092"                         # the connection over the Variable
    assert cfg.max_segments == 4
    assert cfg.sweep_interval_s == PipelineConfig().sweep_interval_s
    assert sources["max_segments"] == "trigger conf 'max_segments'"
    assert sources["topic_prefix"] == "Airflow Variable cassandra_cdc_settings"
    assert sources["cluster"] == "environment CASSANDRA_CDC_CLUSTER"
    assert sources["store_url"] == f"config file {settings_file}"
    assert "sweep_interval_s" not in sources


def test_the_variable_may_be_yaml_and_name_the_connections():
    variable = "store_url: s3://b/p\npipeline:\n  kafka_conn_id: other_kafka\n"
    conns = {"other_kafka": SimpleNamespace(host="other:9092", port=None, login=None, password=None,
                                            extra_dejson={})}
    cfg, _ = pipeline_config({}, variable, conns.get, env={})
    assert (cfg.store_url, cfg.kafka_bootstrap) == ("s3://b/p", "other:9092")


@pytest.mark.parametrize("where", ["conf", "variable"])
@pytest.mark.parametrize("name", ["s3_secret_key", "s3_access_key", "cassandra_password"])
def test_secrets_are_refused_where_airflow_shows_them(where, name):
    conf, variable = ({name: "x"}, None) if where == "conf" else ({}, json.dumps({"pipeline": {name: "x"}}))
    with pytest.raises(ConfigError, match=f"{name} is a secret"):
        pipeline_config(conf, variable, lambda c: None, env={})


def test_schedules_come_from_the_environment_or_the_file(tmp_path):
    assert dag_schedules({}) == ("* * * * *", "@hourly")
    assert dag_schedules({"CASSANDRA_CDC_SCHEDULE": "20s", "CASSANDRA_CDC_MAINTENANCE_SCHEDULE": "none"}) == \
        (timedelta(seconds=20), None)
    f = tmp_path / "cdc.yaml"
    f.write_text("pipeline: {schedule: '*/5 * * * *'}\n")
    assert dag_schedules({"CASSANDRA_CDC_CONFIG": str(f)})[0] == "*/5 * * * *"
    with pytest.raises(ConfigError, match="schedule is read when the DAG file is parsed"):
        pipeline_config({"schedule": "5m"}, None, lambda c: None, env={})


def test_the_schedule_setting_reaches_the_parsed_dag(tmp_path):
    """What the dag-processor does: parse the DAG file with CASSANDRA_CDC_SCHEDULE in its environment."""
    code = ("from airflow.dag_processing.dagbag import DagBag; import sys; "
            f"b = DagBag({str(REPO / 'dags')!r}); assert not b.import_errors, b.import_errors; "
            "print(repr(b.dags['cassandra_cdc'].timetable), repr(b.dags['cassandra_cdc_maintenance'].timetable))")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/airflow.db",
           "CASSANDRA_CDC_SCHEDULE": "20s", "CASSANDRA_CDC_MAINTENANCE_SCHEDULE": "*/7 * * * *",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "timedelta(seconds=20)" in out.stdout and "*/7 * * * *" in out.stdout, out.stdout
    env["CASSANDRA_CDC_SCHEDULE"] = "soon"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0       # a bad setting is the DAG's import error (the UI shows it), not a default
    assert "soon" in bad.stderr and "(from environment CASSANDRA_CDC_SCHEDULE) is not a cron expression" in bad.stderr


def test_a_run_follows_until_shortly_before_the_next_run_is_due():
    """follow's window: the next run by the schedule setting as Airflow computes it, less follow_margin_s."""
    at = datetime(2026, 11, 24, 11, 20, tzinfo=timezone.utc)
    assert next_run_due("* * * * *", at) == at + timedelta(minutes=1)
    assert next_run_due("* * * * *", at + timedelta(seconds=30)) == at + timedelta(minutes=1)   # a manual run
    assert next_run_due("20s", at) == at + timedelta(seconds=20)
    assert next_run_due("@hourly", at) == datetime(2026, 11, 24, 12, tzinfo=timezone.utc)
    assert next_run_due(None, at) is None and next_run_due("@once", at) is None
    cfg = PipelineConfig()
    assert follow_seconds(cfg, at, at + timedelta(seconds=12)) == 60 - 12 - cfg.follow_margin_s
    assert follow_seconds(cfg, at, at + timedelta(seconds=70)) == 0.0     # overran: the next run is waiting
    assert follow_seconds(PipelineConfig(follow_schedule=False), at, at) == 0.0
    assert follow_seconds(PipelineConfig(schedule=None), at, at) == 0.0
    for bad in ({"follow_poll_s": 0}, {"follow_poll_s": float("nan")}, {"follow_margin_s": -1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            PipelineConfig(**bad)
