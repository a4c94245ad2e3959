"""The agent's HTTP endpoint: Prometheus text an operator scrapes, and a health probe that turns red when the agent
cannot ship."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import prom_text
from test_agent import FakeClock, FlakyStore, add_311_segment, make_config, segment_bytes, node  # noqa: F401

from cdc_lib.agent.endpoint import MetricsEndpoint
from cdc_lib.agent.shipper import Agent
from cdc_lib.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1024 * 1024


def get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of a GET, also for error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_addresses(port: int) -> set:
    """Local addresses with a socket listening on ``port``, from /proc/net/tcp (the kernel's view, not ours)."""
    out = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if int(p, 16) == port and state == "0A":          # 0A: LISTEN
            out.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


def test_running_agent_serves_metrics_and_health_on_loopback(node, segment_bytes):
    path = add_311_segment(node, 21, segment_bytes)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASSANDRA_CDC_")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc_lib.cli", "agent", "--cdc-raw", str(node / "cdc_raw"), "--store-url",
         str(node / "store"), "--cluster", "prod", "--node", "cass-1", "--state-dir", str(node / "state"),
         "--poll-interval", "0.2", "--cdc-total-space", "64MiB", "--metrics-port", str(port)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while (path.exists() or not listening_addresses(port)) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.05)
        assert not path.exists(), "the agent did not ship the segment"
        assert listening_addresses(port) == {"127.0.0.1"}      # loopback unless metrics_host says otherwise

        status, ctype, body = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        m = prom_text.parse(body)
        node_labels = {"cluster": "prod", "node": "cass-1"}
        assert prom_text.value(m, "cassandra_cdc_agent_segments_shipped_total", **node_labels) == 1
        assert prom_text.value(m, "cassandra_cdc_agent_bytes_shipped_total") == len(segment_bytes)
        assert prom_text.value(m, "cassandra_cdc_agent_cdc_total_space_bytes") == 64 * MiB
        assert prom_text.value(m, "cassandra_cdc_agent_backlog_segments") == 0
        assert prom_text.value(m, "cassandra_cdc_agent_up") == 1
        assert prom_text.value(m, "cassandra_cdc_agent_ship_delay_seconds_count") == 1
        assert m["cassandra_cdc_agent_segments_shipped"]["type"] == "counter"
        assert m["cassandra_cdc_agent_ship_delay_seconds"]["type"] == "histogram"
        assert get(f"http://127.0.0.1:{port}/health")[::2] == (200, "ok\n")
        assert get(f"http://127.0.0.1:{port}/nothing")[0] == 404
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert not listening_addresses(port), "the endpoint outlived the agent"


def test_health_is_unhealthy_while_shipping_fails_and_recovers(node, segment_bytes):
    add_311_segment(node, 1, segment_bytes)
    clock = FakeClock()
    agent = Agent(make_config(node, poll_interval=1.0, max_backoff=30.0),
                  FlakyStore(str(node / "store"), failures=1), clock=clock)
    endpoint = MetricsEndpoint(agent, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{endpoint.port}"
        agent.run_once()                                         # the upload fails
        status, _, body = get(url + "/health")
        assert status == 503 and "connection reset by peer" in body and "1 attempt(s) in a row failed" in body
        m = prom_text.parse(get(url + "/metrics")[2])
        assert prom_text.value(m, "cassandra_cdc_agent_up") == 0
        assert prom_text.value(m, "cassandra_cdc_agent_upload_failures_total") == 1
        assert prom_text.value(m, "cassandra_cdc_agent_backlog_segments") == 1
        clock.now += 10
        assert agent.run_once() == 1                             # the retry ships it
        assert get(url + "/health")[::2] == (200, "ok\n")
    finally:
        endpoint.close()


def test_health_names_a_stuck_loop_and_a_full_cdc_raw(node, segment_bytes):
    add_311_segment(node, 1, segment_bytes)
    agent = Agent(make_config(node, cdc_total_space=1024), FlakyStore(str(node / "store"), failures=0))
    assert agent.health() == []                                  # not full before the first pass has looked
    agent.run_once()
    assert agent.health() == []                                  # shipped: cdc_raw is empty again
    add_311_segment(node, 2, segment_bytes)
    agent.store.failures = 100
    agent.run_once()
    problems = agent.health()
    assert any("cdc_raw is full" in p for p in problems) and any("connection reset" in p for p in problems)
    later = agent.health(wall_clock=time.time() + 3600)
    assert any("no pass over cdc_raw finished for" in p for p in later)


def test_metrics_port_is_checked_and_a_taken_port_is_a_config_error(node):
    try:
        make_config(node, metrics_port=70000)
    except ConfigError as e:
        assert "metrics_port" in str(e)
    else:
        raise AssertionError("port 70000 accepted")
    agent = Agent(make_config(node))
    first = MetricsEndpoint(agent, "127.0.0.1", 0)
    try:
        try:
            MetricsEndpoint(agent, "127.0.0.1", first.port)
        except ConfigError as e:
            assert str(first.port) in str(e)
        else:
            raise AssertionError("a taken port was accepted")
    finally:
        first.close()
