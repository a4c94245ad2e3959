"""The one settings model: the agent and the pipeline read one YAML file, the environment and their own flags or
a DAG run's conf the same way, and a key that names no setting is an error naming it, whatever the source."""
from __future__ import annotations

from pathlib import Path

import pytest

from cdc_lib import settings
from cdc_lib.errors import ConfigError
from cdc_lib.pipeline.airflow import pipeline_config, run_setting_names
from cdc_lib.settings import AgentConfig, PipelineConfig

SHARED = """\
store_url: s3://bucket/prod
cluster: main
cdc_raw: /var/lib/cassandra/cdc_raw      # the agent's; the pipeline skips it
max_segments: 8                          # the pipeline's; the agent skips it
agent:
  node: cass-1
pipeline:
  topic_prefix: prod-cdc
"""


def test_one_file_serves_the_agent_and_the_pipeline(tmp_path):
    yml = tmp_path / "cdc.yaml"
    yml.write_text(SHARED)
    agent = settings.load(AgentConfig, env={}, config_file=yml)
    pipe = settings.load(PipelineConfig, env={}, config_file=yml)
    assert (agent.store_url, agent.cluster, agent.node, agent.cdc_raw) == \
        ("s3://bucket/prod", "main", "cass-1", Path("/var/lib/cassandra/cdc_raw"))
    assert (pipe.store_url, pipe.cluster, pipe.max_segments, pipe.topic_prefix) == \
        ("s3://bucket/prod", "main", 8, "prod-cdc")


@pytest.mark.parametrize("consumer, yaml_text, env, message", [
    (AgentConfig, SHARED + "max_segment: 3\n", {}, "unknown setting 'max_segment'"),
    (PipelineConfig, SHARED + "max_segment: 3\n", {}, "unknown setting 'max_segment'"),
    (PipelineConfig, SHARED.replace("topic_prefix", "topic_prefx"), {}, "pipeline.topic_prefx"),
    (AgentConfig, SHARED.replace("node: cass-1", "nod: cass-1"), {}, "agent.nod"),
    (AgentConfig, SHARED, {"CASSANDRA_CDC_STORE_ULR": "s3://x"}, "CASSANDRA_CDC_STORE_ULR"),
    (PipelineConfig, SHARED, {"CASSANDRA_CDC_STORE_ULR": "s3://x"}, "CASSANDRA_CDC_STORE_ULR"),
])
def test_a_key_no_consumer_has_is_an_error_naming_it(tmp_path, consumer, yaml_text, env, message):
    yml = tmp_path / "cdc.yaml"
    yml.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        settings.load(consumer, env=env, config_file=yml)


@pytest.mark.parametrize("consumer", [AgentConfig, PipelineConfig])
def test_the_native_switch_is_no_setting_but_no_error_either(tmp_path, consumer):
    """CASSANDRA_CDC_NATIVE chooses the compiled core (cdc_lib.celllog.native): not a consumer setting."""
    yml = tmp_path / "cdc.yaml"
    yml.write_text(SHARED)
    got = settings.load(consumer, env={"CASSANDRA_CDC_NATIVE": "1"}, config_file=yml)
    assert got.cluster == "main" and not hasattr(got, "native")


def test_another_consumers_section_is_its_own_business(tmp_path):
    yml = tmp_path / "cdc.yaml"
    yml.write_text(SHARED.replace("topic_prefix", "topic_prefx"))
    assert settings.load(AgentConfig, env={}, config_file=yml).node == "cass-1"


def test_dag_conf_and_flags_follow_the_same_rule():
    with pytest.raises(ConfigError, match="unknown setting 'store_uri' \\(from trigger conf\\)"):
        pipeline_config({"store_uri": "s3://b/p"}, None, lambda conn_id: None, env={})
    with pytest.raises(ConfigError, match="unknown setting 'poll_intervall'"):
        settings.load(AgentConfig, flags={"cdc_raw": "/x", "store_url": "/s", "cluster": "c",
                                          "poll_intervall": 1}, env={})


def test_every_dag_param_is_a_pipeline_setting_but_secrets_and_schedules():
    assert set(run_setting_names()) == set(PipelineConfig.__dataclass_fields__) - {
        "s3_access_key", "s3_secret_key", "cassandra_password", "kafka_config", "schema_registry_config",
        "schedule", "maintenance_schedule"}


@pytest.mark.parametrize("setting", ["store_url", "schema_file"])
@pytest.mark.parametrize("value", ["cdc-data", "./cdc-data", "file://cdc-data"])
def test_a_relative_local_path_is_refused_naming_the_setting(setting, value):
    """A worker's working directory is nobody's choice: ./cdc-data under Airflow landed in the scheduler's cwd."""
    with pytest.raises(ConfigError, match=f"{setting} '{value}' is a relative path"):
        settings.load(PipelineConfig, env={f"CASSANDRA_CDC_{setting.upper()}": value})


def test_absolute_paths_and_urls_are_accepted():
    for url in ("/data/cdc", "file:///data/cdc", "s3://bucket/cdc", "memory://x", "~/cdc"):
        assert PipelineConfig(store_url=url).store_url == url


def test_load_with_sources_names_where_each_setting_came_from(tmp_path):
    yml = tmp_path / "cdc.yaml"
    yml.write_text("store_url: s3://bucket/prod\ncluster: main\npipeline: {max_segments: 8}\n")
    cfg, sources = settings.load_with_sources(
        PipelineConfig, config_file=yml, env={"CASSANDRA_CDC_CLUSTER": "from-env", "CASSANDRA_CDC_MAX_BYTES": "5"},
        layers=[("layer A", {"max_bytes": 7}), ("layer B", {"max_bytes": 9, "topic_prefix": "b"})],
        flags={"topic_prefix": "flag"})
    assert (cfg.store_url, cfg.cluster, cfg.max_segments, cfg.max_bytes, cfg.topic_prefix) == \
        ("s3://bucket/prod", "from-env", 8, 7, "flag")
    assert sources == {"store_url": f"config file {yml}", "max_segments": f"config file {yml}",
                       "cluster": "environment CASSANDRA_CDC_CLUSTER", "max_bytes": "layer A",
                       "topic_prefix": "flag --topic-prefix"}


def test_a_layer_is_a_settings_document_with_the_same_unknown_key_rule():
    with pytest.raises(ConfigError, match="layer A: unknown setting 'max_segment'"):
        settings.load(PipelineConfig, env={}, layers=[("layer A", {"max_segment": 3})])
    with pytest.raises(ConfigError, match=r"layer A: unknown setting pipeline\.cdc_raw"):
        settings.load(PipelineConfig, env={}, layers=[("layer A", {"pipeline": {"cdc_raw": "/x"}})])
    # the agent's keys in a shared document are the agent's business
    assert settings.load(PipelineConfig, env={}, layers=[("A", {"cdc_raw": "/x", "cluster": "c"})]).cluster == "c"
