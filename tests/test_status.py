"""What an operator sees of a running pipeline: ``cassandra-cdc metrics`` (Prometheus text) and the status page of
``cassandra-cdc status``, loaded in a real headless Chromium, both against a store with real batches (segments of
a 3-node cluster shipped by the agents, one torn copy that ends in quarantine, processed by Spark into Kafka).

The figures are checked against independent counts: events per table and op as consumed back from Kafka,
segments as shipped, batches as run. The page's screenshot is written to ``build/status-page.png``.
"""
from __future__ import annotations

import collections
import html.parser
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
import urllib.request
from pathlib import Path

import prom_text
import pytest
from servers import consume_topic, get_local_spark_session

from cdc_lib import pipeline as P
from cdc_lib.agent.shipper import Agent
from cdc_lib.cli.main import main as cli_main
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, sample_schema, write_cluster_segments
from cdc_lib.pipeline.report import status_data
from cdc_lib.settings import AgentConfig
from cdc_lib.sinks.kafka import table_topic
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import sha256_bytes

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "build" / "status-page.png"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def ran(tmp_path_factory, kafka_broker, _spark_workdir):
    """A store after several real batches: (config, batches, {(keyspace, table, op): events in Kafka}, segments)."""
    base = tmp_path_factory.mktemp("status")
    schema = sample_schema()
    cw = write_cluster_segments(base / "cassandra", schema, 240, seed=7, segment_size=24 * 1024)
    (base / "schema.cql").write_text(SAMPLE_SCHEMA_CQL)
    (base / "store").mkdir()
    cfg = P.PipelineConfig(store_url=str(base / "store"), cluster="c1", schema_file=str(base / "schema.cql"),
                           kafka_bootstrap=kafka_broker, max_segments=3, topic_prefix=f"st{uuid.uuid4().hex[:6]}")
    store = P.open_store(cfg)
    shipped = 0
    for node in sorted(cw.segments):
        shipped += Agent(AgentConfig(cdc_raw=base / "cassandra" / node, store_url=cfg.store_url, cluster="c1",
                                     node=node, state_dir=base / "agent" / node), store=store).run_once()
    # A fourth "node" shipped a torn copy of node1's first segment (a node that died mid-write): its entries are
    # replica copies of writes already shipped, its cut-off tail is quarantined.
    first = sorted(store.list(Layout.area_prefix(Layout.ARCHIVED, "c1", "node1")) +
                   store.list(Layout.area_prefix(Layout.INCOMING, "c1", "node1")))[0]
    torn = store.get_bytes(first)[:9000]
    store.put_bytes(Layout.incoming("c1", "node9", first.rsplit("/", 1)[1]), torn, checksum=sha256_bytes(torn))
    segments = shipped + 1
    batches = P.run_until_idle(cfg, spark=get_local_spark_session(_spark_workdir))
    in_kafka: collections.Counter = collections.Counter()
    for t in schema.tables.values():
        for r in consume_topic(kafka_broker, table_topic(cfg.topic_prefix, t.keyspace, t.name)):
            if r.value is not None:
                in_kafka[(t.keyspace, t.name, r.value["op"])] += 1
    return cfg, batches, in_kafka, segments


def test_metrics_command_prints_what_kafka_and_the_store_hold(ran, capsys):
    cfg, batches, in_kafka, segments = ran
    assert len(batches) >= 3 and sum(in_kafka.values()) > 0
    assert cli_main(["metrics", "--store-url", cfg.store_url, "--cluster", "c1"]) == 0
    m = prom_text.parse(capsys.readouterr().out)

    events = {(dict(ls)["keyspace"], dict(ls)["table"], dict(ls)["op"]): v
              for ls, v in prom_text.samples(m, "cassandra_cdc_events_total").items()}
    assert events == dict(in_kafka)
    assert prom_text.value(m, "cassandra_cdc_events_published_total") == sum(in_kafka.values())
    assert prom_text.value(m, "cassandra_cdc_lag_seconds_count", cluster="c1") == segments
    assert prom_text.value(m, "cassandra_cdc_segments_processed_total") == segments
    for step in ("claim", "transform", "publish", "archive"):
        runs = len(batches) + (1 if step == "claim" else 0)      # the last claim found nothing
        assert prom_text.value(m, "cassandra_cdc_step_duration_seconds_count", step=step) == runs, step
    assert prom_text.value(m, "cassandra_cdc_quarantined_entries_total") == 1
    assert prom_text.value(m, "cassandra_cdc_quarantined_segments_total") == 1
    assert prom_text.value(m, "cassandra_cdc_last_batch_seq") == len(batches)
    assert m["cassandra_cdc_lag_seconds"]["type"] == "histogram"
    # End to end: every segment an agent shipped has its close time; the torn copy put by hand has none and is
    # counted as unknown, not guessed.
    assert m["cassandra_cdc_end_to_end_lag_seconds"]["type"] == "histogram"
    assert prom_text.value(m, "cassandra_cdc_end_to_end_lag_seconds_count", cluster="c1") == segments - 1
    assert prom_text.value(m, "cassandra_cdc_end_to_end_lag_unknown_segments_total") == 1


def test_backlog_and_lag_per_batch_follow_the_claims(ran):
    cfg, batches, _, segments = ran
    data = status_data(P.open_store(cfg), "c1")
    assert [b["batch_seq"] for b in data["batches"]] == [b.batch_seq for b in batches]
    backlog = [b["backlog_segments"] for b in data["batches"]]
    claimed = [b["segments"] for b in data["batches"]]
    assert backlog[0] == segments                                 # the first claim saw every shipped segment
    for i in range(1, len(backlog)):
        assert backlog[i] == backlog[i - 1] - claimed[i - 1]      # nothing shipped meanwhile: it only drains
    assert all(b["lag_max_s"] is not None and b["lag_max_s"] >= 0 for b in data["batches"])
    # A segment closes on its node before it reaches the store: end to end is never the shorter lag.
    for shown, batch in zip(data["batches"], batches):
        assert all(s["closed_at"] <= s["shipped_at"] for s in batch.segments if "closed_at" in s)
        if all("closed_at" in s for s in batch.segments):
            assert shown["end_to_end_lag_max_s"] >= shown["lag_max_s"]
        else:
            assert [s["node"] for s in batch.segments if "closed_at" not in s] == ["node9"]
    assert [(q["kind"], q["key"].split("/")[2]) for q in data["quarantined"]] == [("torn_tail", "node9")]


class _Page(html.parser.HTMLParser):
    """The rendered DOM as Chromium dumped it: text of table cells per table id, card values, chart attributes."""

    def __init__(self):
        super().__init__()
        self.tables: dict = collections.defaultdict(list)
        self.cards: dict = {}
        self.svg: dict = {}
        self.body: dict = {}
        self._table = self._row = self._cell = self._card = None
        self._in_b = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "table":
            self._table = a.get("id")
        elif tag == "tr" and self._table:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = ""
        elif tag == "div" and a.get("class") == "card":
            self._card = a.get("data-name")
        elif tag == "b" and self._card:
            self._in_b = True
        elif tag == "svg":
            self.svg[a.get("id")] = a

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "b":
            self._in_b = False
        elif tag == "div":
            self._card = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._in_b and self._card:
            self.cards[self._card] = data


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", "--virtual-time-budget=10000", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def status_url(ran):
    """``cassandra-cdc status`` running on the store (stopped by PID)."""
    cfg = ran[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASSANDRA_CDC_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "cdc_lib.cli", "status", "--store-url", cfg.store_url,
                             "--cluster", "c1", "--port", str(port)], cwd=str(REPO), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                urllib.request.urlopen(url + "/api/status", timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "cassandra-cdc status did not answer"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_status_serves_the_same_metrics_as_the_command(ran, status_url, capsys):
    cfg = ran[0]
    served = urllib.request.urlopen(status_url + "/metrics", timeout=10).read().decode()
    assert cli_main(["metrics", "--store-url", cfg.store_url, "--cluster", "c1"]) == 0
    printed = capsys.readouterr().out
    drop_times = lambda text: [l for l in text.splitlines() if "last_run_timestamp" not in l]  # noqa: E731
    assert drop_times(served) == drop_times(printed)


def test_status_page_in_headless_chromium_shows_batches_lag_tables_and_quarantine(ran, status_url):
    assert CHROMIUM, "needs Debian's chromium package (scripts/setup.sh installs it)"
    cfg, batches, in_kafka, segments = ran
    dump = _chromium("--dump-dom", status_url + "/")
    assert dump.returncode == 0, dump.stderr[-2000:]
    page = _Page()
    page.feed(dump.stdout)
    assert page.body.get("data-loaded") == "1", "the page's script did not load /api/status"

    rows = page.tables["batches"]
    assert [r[0] for r in rows] == [b.batch_id for b in reversed(batches)]       # newest first
    assert all(r[1] == "archived" for r in rows)
    assert all(float(r[6]) >= 0 for r in rows)                                   # transform seconds
    by_table = collections.Counter()
    for (ks, t, _), n in in_kafka.items():
        by_table[f"{ks}.{t}"] += n
    assert {r[0]: int(r[1]) for r in page.tables["tables"]} == dict(by_table)
    [quarantined] = page.tables["quarantined"]
    assert quarantined[1] == "torn_tail" and "/node9/" in quarantined[2] and quarantined[3]
    assert page.cards["events published"] == str(sum(in_kafka.values()))
    assert page.cards["quarantined entries"] == "1"
    assert page.cards["backlog (segments)"] == "0"                               # drained (the last claim)
    assert page.cards["segments of unknown close time"] == "1"                   # the torn copy put by hand
    assert page.cards["end-to-end lag p95 (s)"].startswith("\u2264 ")
    assert page.svg["lag"]["data-points"] == str(len(batches))
    assert page.svg["backlog"]["data-points"] == str(len(batches))

    SCREENSHOT.parent.mkdir(exist_ok=True)
    SCREENSHOT.unlink(missing_ok=True)
    shot = _chromium(f"--screenshot={SCREENSHOT}", "--window-size=1280,1400", status_url + "/")
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and SCREENSHOT.stat().st_size > 20_000


def test_status_of_a_store_that_does_not_exist_says_so(tmp_path, capsys):
    assert cli_main(["status", "--store-url", str(tmp_path / "nope"), "--port", "0"]) == 1      # usage/config
    assert "does not exist" in capsys.readouterr().err
