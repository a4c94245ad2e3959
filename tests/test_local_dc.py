"""``local_datacenter``: a multi-DC cluster's pipeline processes one datacenter's replicas (every write reaches
each datacenter's replicas, so one datacenter's commit logs hold every write)."""
from __future__ import annotations

import logging

from test_agent import add_311_segment, make_config, node, segment_bytes  # noqa: F401
from test_pipeline import _put_segment, _segment_name, cfg  # noqa: F401

from cdc_lib import pipeline as P
from cdc_lib.agent.shipper import Agent
from cdc_lib.cli.agent import build_parser, load_agent_config
from cdc_lib.storage.layout import Layout


def test_agent_says_its_datacenter_in_the_store(node, segment_bytes):  # noqa: F811
    add_311_segment(node, 1, segment_bytes)
    agent = Agent(make_config(node, datacenter="dc-east"))
    assert agent.run_once() == 1
    info = agent.store.get_json(Layout.node_info("prod", "cass-1"))
    assert info["datacenter"] == "dc-east" and info["node"] == "cass-1"
    args = build_parser().parse_args(["--cdc-raw", str(node / "cdc_raw"), "--store-url", str(node / "store"),
                                      "--cluster", "prod", "--datacenter", "dc-west"])
    assert load_agent_config(args, env={}).datacenter == "dc-west"
    silent = Agent(make_config(node))
    silent.store.delete(Layout.node_info("prod", "cass-1"))
    silent.run_once()
    assert not silent.store.exists(Layout.node_info("prod", "cass-1"))     # nothing said without --datacenter


def test_claim_takes_the_local_datacenter_and_nodes_that_said_nothing(cfg, caplog):  # noqa: F811
    store = P.open_store(cfg)
    for node, dc in (("e1", "east"), ("w1", "west")):
        store.put_json(Layout.node_info("c1", node), {"node": node, "datacenter": dc})
    for i in (1, 2):
        _put_segment(store, "e1", i)
        _put_segment(store, "w1", 10 + i)
    _put_segment(store, "x1", 20)                          # an agent without --datacenter
    cfg.local_datacenter = "east"
    with caplog.at_level(logging.WARNING, logger="cassandra_cdc.pipeline"):
        b = P.claim(cfg)
    assert sorted((s["node"], s["name"]) for s in b.segments) == [
        ("e1", _segment_name(1)), ("e1", _segment_name(2)), ("x1", _segment_name(20))]
    assert b.steps["claim"]["other_datacenter_segments"] == 2
    assert b.steps["claim"]["backlog"] == {"e1": {"segments": 2, "bytes": 200}, "x1": {"segments": 1, "bytes": 100}}
    assert any("x1" in r.getMessage() and "did not say their datacenter" in r.getMessage() for r in caplog.records)
    assert len(store.list(Layout.area_prefix(Layout.INCOMING, "c1", "w1"))) == 2     # left where they were


def test_without_local_datacenter_every_node_is_processed(cfg):  # noqa: F811
    store = P.open_store(cfg)
    store.put_json(Layout.node_info("c1", "w1"), {"node": "w1", "datacenter": "west"})
    _put_segment(store, "w1", 1)
    _put_segment(store, "e1", 2)
    b = P.claim(cfg)
    assert sorted(s["node"] for s in b.segments) == ["e1", "w1"] and "other_datacenter_segments" not in b.steps["claim"]
