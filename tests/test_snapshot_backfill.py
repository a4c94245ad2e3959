"""The ``sstables`` backfill without a cluster: the agent's snapshot command (nodetool stands in as a function that
makes the snapshot directory, as Cassandra does), what it ships, and the request made from what was shipped.
(Against a real node: ``test_backfill_real.py``.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_lib.agent.snapshot import ship_snapshot
from cdc_lib.cli.agent import agent_main
from cdc_lib.errors import ConfigError
from cdc_lib.pipeline import PipelineConfig, open_store
from cdc_lib.pipeline.backfill import request_backfill
from cdc_lib.pipeline.requests import REQUEST_KEY
from cdc_lib.settings import AgentConfig
from cdc_lib.storage.layout import Layout

SCHEMA = """
CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};
CREATE TABLE ks.t (k int PRIMARY KEY, v text) WITH ID = 5a1e6f20-0000-4000-8000-00000000000a AND cdc = true;
CREATE TABLE ks.n (k int PRIMARY KEY, v counter) WITH ID = 5a1e6f20-0000-4000-8000-00000000000b AND cdc = true;
CREATE TABLE ks.off (k int PRIMARY KEY, v text) WITH ID = 5a1e6f20-0000-4000-8000-00000000000c;
"""
COMPONENTS = ("Data.db", "Index.db", "Statistics.db", "TOC.txt")


class FakeNodetool:
    """``nodetool snapshot -t TAG -kt ks.a,ks.b`` hard-links each table's SSTables into snapshots/TAG (here: two
    SSTables per table, and the manifest.json and schema.cql Cassandra adds); ``clearsnapshot`` removes them."""

    def __init__(self, data: Path):
        self.data, self.calls = data, []

    def __call__(self, *args):
        self.calls.append(args)
        if args[0] == "snapshot":
            tag, tables = args[2], args[4].split(",")
            for name in tables:
                ks, table = name.split(".")
                d = self.data / ks / f"{table}-5a1e6f2000004000800000000000000a" / "snapshots" / tag
                d.mkdir(parents=True)
                for gen in (1, 2):
                    for c in COMPONENTS:
                        (d / f"oa-{gen}-big-{c}").write_bytes(f"{name} {gen} {c}".encode() * gen)
                (d / "manifest.json").write_text("{}")
                (d / "schema.cql").write_text("CREATE TABLE ...")
        return ""


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "schema.cql").write_text(SCHEMA)
    agents = {n: AgentConfig(cdc_raw=tmp_path / n / "cdc_raw", store_url=str(tmp_path / "store"), cluster="c1",
                             node=n) for n in ("n1", "n2")}
    cfg = PipelineConfig(store_url=str(tmp_path / "store"), cluster="c1", schema_file=str(tmp_path / "schema.cql"))
    return tmp_path, agents, cfg


def test_the_snapshot_is_shipped_with_checksums_and_its_manifest_last(setup):
    tmp, agents, cfg = setup
    nodetool = FakeNodetool(tmp / "n1" / "data")
    manifest = ship_snapshot(agents["n1"], ["ks.t"], "s1", nodetool=nodetool, data_dirs=[tmp / "n1" / "data"])
    store = open_store(cfg)
    files = manifest["tables"]["ks.t"]["files"]
    assert len(files) == 2 * len(COMPONENTS) + 2
    for f in files:
        assert f["key"] == f"snapshots/c1/n1/s1/ks/t-5a1e6f2000004000800000000000000a/{f['name']}"
        assert store.info(f["key"]).checksum == f["checksum"]                  # the .sha256 sidecar
    assert store.get_json(Layout.snapshot_manifest("c1", "n1", "s1")) == manifest
    assert nodetool.calls == [("snapshot", "-t", "s1", "-kt", "ks.t"), ("clearsnapshot", "-t", "s1")]
    with pytest.raises(ConfigError, match="no snapshot 'other' of ks.t"):
        ship_snapshot(agents["n1"], ["ks.t"], "other", nodetool=lambda *a: "", data_dirs=[tmp / "n1" / "data"])
    with pytest.raises(ConfigError, match="keyspace.table"):
        ship_snapshot(agents["n1"], ["t"], "s2", nodetool=nodetool, data_dirs=[tmp / "n1" / "data"])


def test_the_command_line_names_what_is_wrong(setup, capsys):
    tmp, agents, cfg = setup
    argv = ["snapshot", "--cdc-raw", str(tmp / "n1" / "cdc_raw"), "--store-url", str(tmp / "store"), "--cluster",
            "c1", "--node", "n1", "--tables", "ks.t", "--tag", "s1", "--nodetool", "true",
            "--data-dir", str(tmp / "n1" / "data")]
    assert agent_main(argv) == 1                                    # a setting that cannot work
    assert "no snapshot 's1' of ks.t" in capsys.readouterr().err
    assert agent_main(argv[:-2] + ["--nodetool", "false"]) == 3     # could not finish
    assert "false snapshot -t s1 -kt ks.t failed (1)" in capsys.readouterr().err


def test_the_request_makes_one_item_per_sstable_of_every_node(setup):
    tmp, agents, cfg = setup
    for n, agent in agents.items():
        ship_snapshot(agent, ["ks.t", "ks.n"], "s1", nodetool=FakeNodetool(tmp / n / "data"),
                      data_dirs=[tmp / n / "data"])
    answer = request_backfill(cfg, mode="sstables", tag="s1", sstables_per_batch=3)
    assert answer["nodes"] == ["n1", "n2"] and answer["items"] == 8              # 2 nodes x 2 tables x 2
    assert answer["tables"]["ks.t"]["sstables"] == 4          # counter tables are loaded too: SSTables hold shards
    request = open_store(cfg).get_json(REQUEST_KEY)
    assert request["mode"] == "sstables" and request["per_batch"] == 3 and request["batch"] == {"tag": "s1"}
    item = request["pending"][0]
    assert item["kind"] == "sstable" and item["node"] == "n1" and item["table"] == "ks.n"
    assert sorted(f["name"] for f in item["files"]) == [f"oa-1-big-{c}" for c in sorted(COMPONENTS)]
    assert item["size"] == len(b"ks.n 1 Data.db")                                 # Data.db bytes count
    with pytest.raises(ConfigError, match="still pending"):
        request_backfill(cfg, mode="sstables", tag="s1")


def test_the_request_refuses_what_it_cannot_load(setup):
    tmp, agents, cfg = setup
    with pytest.raises(ConfigError, match="give the snapshot's tag"):
        request_backfill(cfg, mode="sstables")
    with pytest.raises(ConfigError, match="no complete snapshot 's1' of cluster c1"):
        request_backfill(cfg, mode="sstables", tag="s1")
    ship_snapshot(agents["n1"], ["ks.t"], "s1", nodetool=FakeNodetool(tmp / "n1" / "data"),
                  data_dirs=[tmp / "n1" / "data"])
    with pytest.raises(ConfigError, match="ks.off is not a captured table"):
        request_backfill(cfg, mode="sstables", tag="s1", tables="ks.off")
    with pytest.raises(ConfigError, match="holds no SSTable of ks.n"):
        request_backfill(cfg, mode="sstables", tag="s1", tables="ks.n")
    with pytest.raises(ConfigError, match="from nodes n2"):
        request_backfill(cfg, mode="sstables", tag="s1", nodes="n2")
    with pytest.raises(ConfigError, match="mode sstables takes no splits: splits belongs to mode cql"):
        request_backfill(cfg, mode="sstables", tag="s1", splits=3)
    # a snapshot whose manifest was never written (the agent died while shipping) is not taken
    store = open_store(cfg)
    store.delete(Layout.snapshot_manifest("c1", "n1", "s1"))
    with pytest.raises(ConfigError, match="no complete snapshot"):
        request_backfill(cfg, mode="sstables", tag="s1")
    assert json.loads(json.dumps(store.list("snapshots/c1/n1/s1/")))      # the files stay for a rerun
