"""The agent's HTTP endpoint (``metrics_port``): ``/metrics`` in the Prometheus text format, ``/health`` for a
liveness or load-balancer probe (200 ``ok``, or 503 with the reasons the agent cannot ship, one per line).

It binds ``metrics_host`` (127.0.0.1 unless set: the counters name the store and the node, and nothing on the
endpoint is authenticated) and serves from a daemon thread; the shipping loop never waits for it.
"""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cdc_lib.errors import ConfigError
from cdc_lib.metrics import CONTENT_TYPE, Exposition

log = logging.getLogger("cassandra_cdc.agent")


def agent_exposition(m: dict, problems: list[str]) -> str:
    """The agent's counters (``Agent.metrics()``) and health as one Prometheus scrape."""
    node = {"cluster": m["cluster"], "node": m["node"]}
    e = Exposition("cassandra_cdc_agent_")
    e.gauge("up", "1 when the agent can ship (see /health for the reasons when 0)", 0 if problems else 1, node)
    e.counter("segments_shipped", "completed segments uploaded and verified", m["segments_shipped"], node)
    e.counter("bytes_shipped", "bytes of completed segments uploaded", m["bytes_shipped"], node)
    e.counter("live_chunks_shipped", "chunks of live segments shipped", m["live_chunks_shipped"], node)
    e.counter("upload_failures", "failed shipping attempts (each is retried)", m["upload_failures"], node)
    e.counter("conflicts", "segments whose key held other bytes (shipped to quarantined/)", m["conflicts"], node)
    e.counter("segments_lost", "segments that vanished from cdc_raw before they were shipped", m["segments_lost"],
              node)
    e.gauge("consecutive_failures", "failed attempts since the last success", m["consecutive_failures"], node)
    e.gauge("backlog_segments", "completed segments in cdc_raw not shipped yet", m["pending_segments"], node)
    e.gauge("live_segments", "segments Cassandra is still writing", m["live_segments"], node)
    e.gauge("unreadable_idx", "segments waiting on an unreadable _cdc.idx", m["unreadable_idx"], node)
    e.gauge("cdc_raw_bytes", "bytes in cdc_raw (Cassandra counts them against cdc_total_space)",
            m["cdc_raw_bytes"], node)
    e.gauge("cdc_total_space_bytes", "Cassandra's cdc_total_space", m["cdc_total_space"], node)
    e.gauge("cdc_usage_ratio", "cdc_raw bytes / cdc_total_space (Cassandra rejects CDC writes at 1)",
            m["cdc_usage_fraction"], node)
    e.gauge("arrival_rate_bytes", "bytes per second arriving in cdc_raw (over rate_window)", m["arrival_rate"],
            node)
    e.gauge("ship_rate_bytes", "bytes per second shipped (over rate_window)", m["ship_rate"], node)
    e.gauge("last_success_timestamp_seconds", "when a segment was last shipped (unix time)",
            m["last_success_time"], node)
    e.gauge("last_pass_timestamp_seconds", "when a pass over cdc_raw last finished (unix time)",
            m["last_pass_time"], node)
    e.histogram("ship_delay_seconds", "from a segment's close in cdc_raw to its verified copy in the store",
                m["ship_delay_seconds"], node)
    return e.text()


class MetricsEndpoint:
    """Serves an ``Agent``'s ``/metrics`` and ``/health`` until :meth:`close`."""

    def __init__(self, agent, host: str, port: int):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
                path = self.path.split("?", 1)[0]
                problems = agent.health()
                if path == "/metrics":
                    self._reply(200, agent_exposition(agent.metrics(), problems), CONTENT_TYPE)
                elif path == "/health":
                    if problems:
                        self._reply(503, "unhealthy\n" + "".join(p + "\n" for p in problems))
                    else:
                        self._reply(200, "ok\n")
                else:
                    self._reply(404, "not found: try /metrics or /health\n")

            def _reply(self, status: int, body: str, content_type: str = "text/plain; charset=utf-8") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args) -> None:
                log.debug("metrics endpoint: " + fmt, *args)

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="cdc-agent-metrics", daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics, health on /health", host, self.port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
