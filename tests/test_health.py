"""No silent green: settings that cannot work fail the claim at once, naming what is missing; a store where agents
ship nothing, or ship another cluster, makes the claim warn in its log and in ``checkpoints/metrics.json``.

Under a real scheduler, 43 runs were green while doing nothing: no store, no schema, and a ``./cdc-data`` store
created in the scheduler's working directory. Each test here is one way that happened.
"""
from __future__ import annotations

import logging
import os

import pytest

from cdc_lib import pipeline as P
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US
from cdc_lib.errors import ConfigError
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import ObjectStore, sha256_bytes

NOW = START_US // 1_000_000 + 10
HOUR = 3600


def _ship(store: ObjectStore, cluster: str, node: str, seg_id: int) -> str:
    key = Layout.incoming(cluster, node, f"CommitLog-7-{seg_id}.log")
    data = bytes([seg_id % 251]) * 64
    store.put_bytes(key, data, checksum=sha256_bytes(data))
    return key


@pytest.fixture
def cfg(tmp_path) -> P.PipelineConfig:
    (tmp_path / "schema.cql").write_text(SAMPLE_SCHEMA_CQL)
    (tmp_path / "store").mkdir()
    return P.PipelineConfig(store_url=str(tmp_path / "store"), cluster="c1", schema_file=str(tmp_path / "schema.cql"),
                            now=NOW)


def test_the_defaults_cannot_run_and_say_what_is_missing(tmp_path, monkeypatch):
    """The scheduled runs' settings before this fix: no store, no schema. Nothing may be written anywhere."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        P.claim(P.PipelineConfig())
    msg = str(e.value)
    assert "store_url is not set" in msg and "no schema source: schema_file is not set" in msg
    assert "Airflow Variable cassandra_cdc_settings" in msg and "CASSANDRA_CDC_STORE_URL" in msg
    assert os.listdir(tmp_path) == []                  # no stray cdc-data/checkpoints/metrics.json


@pytest.mark.parametrize("change, message", [
    ({"schema_file": "/nonexistent/schema.cql"}, "schema_file /nonexistent/schema.cql does not exist"),
    ({"schema_source": "driver"}, "schema_source is 'driver' but no Cassandra contact point is set"),
])
def test_a_schema_source_that_cannot_work_fails_the_claim(cfg, change, message):
    for k, v in change.items():
        setattr(cfg, k, v)
    with pytest.raises(ConfigError, match=message):
        P.claim(cfg)


def test_a_schema_file_that_does_not_parse_fails_the_claim_before_anything_is_claimed(cfg, tmp_path):
    _ship(P.open_store(cfg), "c1", "n1", 1)
    (tmp_path / "schema.cql").write_text("CREATE TABLE oops (")
    with pytest.raises(Exception, match="schema.cql"):
        P.claim(cfg)
    assert not P.open_store(cfg).exists(P.POINTER_KEY)


def test_a_store_directory_that_does_not_exist_fails_and_is_not_created(cfg, tmp_path):
    cfg.store_url = str(tmp_path / "sotre")
    with pytest.raises(ConfigError, match="directory .*sotre does not exist"):
        P.claim(cfg)
    assert not (tmp_path / "sotre").exists()
    for request in (P.request_snapshot, P.request_sweep):    # the other DAGs' tasks do not create it either
        with pytest.raises(ConfigError, match="does not exist"):
            request(cfg)
    assert not (tmp_path / "sotre").exists()


def test_an_s3_store_whose_bucket_is_missing_or_unreadable_fails(cfg, s3_server, s3_bucket):
    s3 = dict(s3_endpoint_url=s3_server.endpoint_url, s3_access_key=s3_server.access_key,
              s3_secret_key=s3_server.secret_key)
    ok = P.PipelineConfig(**{**cfg.__dict__, **s3, "store_url": f"s3://{s3_bucket}/cdc"})
    assert P.claim(ok).empty                                 # an empty prefix of a bucket that exists: fine
    with pytest.raises(ConfigError, match="bucket 'no-such-bucket' does not exist"):
        P.claim(P.PipelineConfig(**{**ok.__dict__, "store_url": "s3://no-such-bucket/cdc"}))
    with pytest.raises(ConfigError, match=f"cannot list bucket '{s3_bucket}'"):
        P.claim(P.PipelineConfig(**{**ok.__dict__, "s3_secret_key": "wrong"}))


def _last_claim(cfg) -> dict:
    return P.read_metrics(cfg)["last"]["claim"]


def test_no_arrivals_for_longer_than_the_threshold_warns_in_the_log_and_the_metrics(cfg, caplog):
    store = P.open_store(cfg)
    t0 = 1_800_000_000.0
    cfg.warn_no_segments_s = HOUR
    caplog.set_level(logging.WARNING, "cassandra_cdc.pipeline")
    P.claim(cfg, wall_clock=t0)                             # a fresh store: the pipeline starts watching
    assert _last_claim(cfg)["warnings"] == [] and _last_claim(cfg)["quiet_s"] == 0
    P.claim(cfg, wall_clock=t0 + HOUR + 60)
    [warning] = _last_claim(cfg)["warnings"]
    assert "no segment for cluster 'c1' has arrived since this pipeline first looked" in warning
    assert "--cluster c1" in warning and cfg.store_url in warning
    assert _last_claim(cfg)["quiet_s"] == HOUR + 60
    assert any("WARNING: no segment for cluster 'c1'" in r.getMessage() for r in caplog.records)

    _ship(store, "c1", "n1", 1)                             # an agent ships: quiet again
    P.claim(cfg, wall_clock=t0 + 2 * HOUR)
    assert _last_claim(cfg)["warnings"] == [] and _last_claim(cfg)["quiet_s"] == 0
    batch = P.read_batch(store, P.batch_id_for(1))
    batch.state = "archived"                                # processed: incoming/ is empty again
    P.save_batch(store, batch)
    store.move(batch.segments[0]["key"], Layout.archived("c1", "n1", batch.segments[0]["name"]))
    P.claim(cfg, wall_clock=t0 + 2 * HOUR + 1800)
    assert _last_claim(cfg)["warnings"] == []               # 30 min without a new segment: within the threshold
    P.claim(cfg, wall_clock=t0 + 3 * HOUR + 1)
    [warning] = _last_claim(cfg)["warnings"]
    assert "no new segment for cluster 'c1' since" in warning


def test_a_segment_left_in_incoming_is_not_an_arrival(cfg):
    """Segments waiting in incoming/ (a backlog) are not news: only a newer segment of a node is."""
    store = P.open_store(cfg)
    t0 = 1_800_000_000.0
    cfg.warn_no_segments_s = HOUR
    cfg.max_segments = 1
    _ship(store, "c1", "n1", 1)
    _ship(store, "c1", "n1", 2)
    P.claim(cfg, wall_clock=t0)
    assert P.claim(cfg, wall_clock=t0 + 2 * HOUR).resumed       # the same batch again (not archived)
    assert "no new segment for cluster 'c1'" in _last_claim(cfg)["warnings"][0]


def test_segments_of_another_cluster_in_incoming_warn(cfg, caplog):
    """An agent shipping with --cluster prod while the pipeline processes cluster1: nothing is ever processed."""
    store = P.open_store(cfg)
    _ship(store, "prod", "n1", 1)
    _ship(store, "prod", "n2", 1)
    _ship(store, "staging", "n1", 7)
    caplog.set_level(logging.WARNING, "cassandra_cdc.pipeline")
    assert P.claim(cfg).empty
    last = _last_claim(cfg)
    [warning] = last["warnings"]
    assert "'prod' (2 segments), 'staging' (1 segments)" in warning and "cluster 'c1'" in warning
    assert last["foreign_segments"] == 3
    assert "claim.foreign_segments" not in P.read_metrics(cfg)["totals"]     # a gauge, not a sum over runs
    assert any("incoming/ holds segments of other clusters" in r.getMessage() for r in caplog.records)


def test_the_threshold_zero_never_warns(cfg):
    cfg.warn_no_segments_s = 0
    P.claim(cfg, wall_clock=1_800_000_000.0)
    P.claim(cfg, wall_clock=1_900_000_000.0)
    assert _last_claim(cfg)["warnings"] == []
