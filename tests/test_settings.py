"""The one settings model: the agent and the pipeline read one YAML file, the environment and their own flags or
DAG params the same way, and a key that names no setting is an error naming it, whatever the source."""
from __future__ import annotations

from pathlib import Path

import pytest

from cdc_lib import settings
from cdc_lib.errors import ConfigError
from cdc_lib.pipeline.airflow import config_from_params, default_params
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


def test_another_consumers_section_is_its_own_business(tmp_path):
    yml = tmp_path / "cdc.yaml"
    yml.write_text(SHARED.replace("topic_prefix", "topic_prefx"))
    assert settings.load(AgentConfig, env={}, config_file=yml).node == "cass-1"


def test_dag_params_and_flags_follow_the_same_rule():
    with pytest.raises(ConfigError, match="unknown setting 'store_uri' \\(from DAG params\\)"):
        config_from_params({**default_params(), "store_uri": "s3://b/p"}, lambda conn_id: None)
    with pytest.raises(ConfigError, match="unknown setting 'poll_intervall'"):
        settings.load(AgentConfig, flags={"cdc_raw": "/x", "store_url": "/s", "cluster": "c",
                                          "poll_intervall": 1}, env={})


def test_every_dag_param_is_a_pipeline_setting():
    assert set(default_params()) == {f for f in PipelineConfig.__dataclass_fields__}
