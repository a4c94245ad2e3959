"""End to end: three replicas' segments -> agents -> S3 -> the real ``cassandra_cdc`` DAG -> Kafka.

The DAG runs through ``airflow dags test`` (SQLite, temporary AIRFLOW_HOME, Kafka and S3 given as Airflow
connections), against the real broker (Tansu) and the real S3 server (SeaweedFS). The events consumed from
Kafka, replayed in order, give exactly what the independent reference model says Cassandra shows, and each
event is in Kafka once although every write was logged by three replicas.
"""
from __future__ import annotations

import uuid

from event_invariant import check_events
from reference_model import json_table, published_states
from reference_model import visible_table as model_table
from servers import consume_topic

from cdc_lib import pipeline as P
from cdc_lib.agent.shipper import Agent
from cdc_lib.demo.run import airflow_db_migrate, airflow_env, dags_test
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, Workload, sample_schema, write_cluster_segments
from cdc_lib.settings import AgentConfig
from cdc_lib.sinks.kafka import table_topic
from cdc_lib.storage.layout import Layout


def test_segments_to_kafka_through_the_real_dag(tmp_path, s3_server, s3_bucket, kafka_broker):
    schema = sample_schema()
    workload = Workload(schema, seed=42)
    cw = write_cluster_segments(tmp_path / "cassandra", schema, 200, seed=42, workload=workload,
                                segment_size=32 * 1024)
    assert cw.replica_copies == 3 * len(cw.mutations)
    now = workload.clock_us // 1_000_000 + 30           # some 60 s TTLs have run out, the 3600 s ones not
    schema_file = tmp_path / "schema.cql"
    schema_file.write_text(SAMPLE_SCHEMA_CQL)
    cfg = P.PipelineConfig(store_url=f"s3://{s3_bucket}/cdc", s3_endpoint_url=s3_server.endpoint_url,
                           s3_access_key=s3_server.access_key, s3_secret_key=s3_server.secret_key, cluster="e2e",
                           schema_file=str(schema_file), kafka_bootstrap=kafka_broker, now=now,
                           topic_prefix=f"e2e{uuid.uuid4().hex[:6]}")
    store = P.open_store(cfg)
    shipped = 0
    for node in sorted(cw.segments):
        agent = Agent(AgentConfig(cdc_raw=tmp_path / "cassandra" / node, store_url=cfg.store_url, cluster="e2e",
                                  node=node, state_dir=tmp_path / "agent" / node), store=store)
        shipped += agent.run_once()
    assert shipped == sum(len(v) for v in cw.segments.values())

    # The real DAG, once: Kafka and S3 come from Airflow connections, the rest from params (--conf).
    home = tmp_path / "airflow"
    home.mkdir()
    env = airflow_env(home, kafka_bootstrap=kafka_broker, s3=s3_server)
    airflow_db_migrate(env)
    dags_test("cassandra_cdc", env, {"store_url": cfg.store_url, "cluster": "e2e", "schema_file": str(schema_file),
                                     "now": now, "max_segments": 1000, "topic_prefix": cfg.topic_prefix},
              tmp_path / "dags-test.log")

    assert store.list(Layout.area_prefix(Layout.INCOMING, "e2e")) == []
    assert len(store.list(Layout.area_prefix(Layout.ARCHIVED, "e2e"))) == shipped
    metrics = P.read_metrics(cfg)["totals"]
    assert metrics["archive.archived"] == shipped and metrics["publish.events"] > 0

    total = 0
    for t in schema.tables.values():
        if t.keyspace.startswith("system"):
            continue
        records = consume_topic(kafka_broker, table_topic(cfg.topic_prefix, t.keyspace, t.name))
        ids = [r.event_id for r in records]
        assert len(ids) == len(set(ids)), f"{t.name}: an event is in Kafka twice"
        replayed: dict = {}
        for r in records:
            assert r.value["source"]["table"] == t.name
            if r.value["after"] is None:
                replayed.pop(r.key, None)
            else:
                replayed[r.key] = r.value["after"]
        assert replayed == json_table(t, model_table(t, cw.mutations, now)), t.name
        # one batch saw every mutation: the topic is the table's whole history, mutation after mutation
        check_events([(r.key, r.value) for r in records], published_states(t, [cw.mutations], [now]),
                     complete=True)
        total += len(records)
    assert total == metrics["publish.events"]
