"""``cassandra-cdc status`` (a small web page about a pipeline, with ``/metrics`` for Prometheus) and
``cassandra-cdc metrics`` (the same Prometheus text once, on stdout: for node_exporter's textfile collector).

Both read only the store (``cdc_lib.pipeline.report``); settings as everywhere: flags > ``CASSANDRA_CDC_*``
environment > YAML file (``pipeline:`` section) > defaults, so S3 credentials come from the environment or the
file, never from the command line.
"""
from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from cdc_lib import settings as config_mod
from cdc_lib.errors import CdcError, ConfigError
from cdc_lib.metrics import CONTENT_TYPE
from cdc_lib.pipeline.report import pipeline_exposition, read_metrics_json, status_data
from cdc_lib.pipeline.resources import open_store
from cdc_lib.settings import PipelineConfig

from . import exits

log = logging.getLogger("cassandra_cdc.status")


def _parser(prog: str, description: str) -> exits.ArgumentParser:
    p = exits.ArgumentParser(prog=prog, description=description)
    p.add_argument("--config", help="YAML settings file (default: $CASSANDRA_CDC_CONFIG)")
    p.add_argument("--store-url", dest="store_url", help="the pipeline's store (absolute directory or s3://...)")
    p.add_argument("--cluster", help="cluster name (cluster1)")
    return p


def _config(args) -> PipelineConfig:
    flags = {"store_url": args.store_url, "cluster": args.cluster}
    return config_mod.load(PipelineConfig, flags=flags, config_file=args.config, section="pipeline")


def metrics_main(argv: list[str] | None = None) -> int:
    """``cassandra-cdc metrics``: print the pipeline's metrics in the Prometheus text format."""
    args = _parser("cassandra-cdc metrics", "Print the pipeline's metrics (Prometheus text format), read from "
                                            "its store.").parse_args(argv)
    try:
        cfg = _config(args)
        store = open_store(cfg)
        sys.stdout.write(pipeline_exposition(read_metrics_json(store), cfg.cluster))
    except CdcError as e:
        print(f"cassandra-cdc metrics: {e}", file=sys.stderr)
        return exits.USAGE if isinstance(e, ConfigError) else exits.FAILED
    return exits.OK


def page_html() -> bytes:
    return resources.files("cdc_lib.cli").joinpath("status.html").read_bytes()


class StatusServer:
    """Serves ``/`` (the page), ``/api/status`` (its data as JSON) and ``/metrics`` until :meth:`close`."""

    def __init__(self, config: PipelineConfig, host: str, port: int, last_batches: int = 50):
        store = open_store(config)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/":
                        self._reply(200, page_html(), "text/html; charset=utf-8")
                    elif path == "/api/status":
                        body = json.dumps(status_data(store, config.cluster, last_batches), default=str)
                        self._reply(200, body.encode(), "application/json")
                    elif path == "/metrics":
                        text = pipeline_exposition(read_metrics_json(store), config.cluster)
                        self._reply(200, text.encode(), CONTENT_TYPE)
                    else:
                        self._reply(404, b"not found: /, /api/status or /metrics\n", "text/plain")
                except Exception as e:  # noqa: BLE001 - the store is down: say so, keep serving
                    log.warning("status: %s: %s: %s", path, type(e).__name__, e)
                    self._reply(503, f"cannot read the store: {type(e).__name__}: {e}\n".encode(), "text/plain")

            def _reply(self, status: int, data: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args) -> None:
                log.debug("status: " + fmt, *args)

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise ConfigError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def close(self) -> None:
        self.server.server_close()


def status_main(argv: list[str] | None = None) -> int:
    """``cassandra-cdc status``: serve the status page until SIGTERM/SIGINT."""
    p = _parser("cassandra-cdc status", "Serve a status page (lag, backlog, events per table, last batches, "
                                        "quarantined entries) and /metrics for Prometheus, read from the store.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1; the page is unauthenticated)")
    p.add_argument("--port", type=int, default=8080, help="port (8080; 0: any free port, printed)")
    p.add_argument("--batches", type=int, default=50, help="how many recent batches the page shows (50)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = StatusServer(_config(args), args.host, args.port, args.batches)
    except CdcError as e:
        print(f"cassandra-cdc status: {e}", file=sys.stderr)
        return exits.USAGE
    print(f"cassandra-cdc status: serving http://{args.host}:{server.port}/ (and /metrics)", file=sys.stderr,
          flush=True)

    def on_signal(signum: int, _frame: Any) -> None:
        threading.Thread(target=server.server.shutdown, daemon=True).start()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    server.serve_forever()
    server.close()
    return exits.OK
