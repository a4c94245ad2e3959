"""``cassandra-cdc agent``: the node agent's command line (settings: flags > ``CASSANDRA_CDC_*`` environment >
YAML ``agent:`` section > defaults)."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from cdc_lib import settings as config_mod
from cdc_lib.agent.endpoint import MetricsEndpoint
from cdc_lib.agent.shipper import Agent
from cdc_lib.errors import ConfigError
from cdc_lib.settings import AgentConfig

from . import exits

log = logging.getLogger("cassandra_cdc.agent")


def _common_flags(p: argparse.ArgumentParser) -> None:
    """The settings every agent command needs: where the node is, where the store is."""
    p.add_argument("--config", help="YAML settings file (default: $CASSANDRA_CDC_CONFIG); keys as below, "
                                    "top level or under 'agent:'")
    p.add_argument("--cdc-raw", dest="cdc_raw", help="Cassandra's cdc_raw directory")
    p.add_argument("--store-url", dest="store_url", help="store root: /dir, file:///dir, s3://bucket/prefix, ...")
    p.add_argument("--storage-option", dest="storage_option", action="append", metavar="KEY=VALUE",
                   help="fsspec storage option, repeatable (e.g. endpoint_url=http://127.0.0.1:8333); credentials "
                        "are refused here (the process list shows them): use AWS_ACCESS_KEY_ID/"
                        "AWS_SECRET_ACCESS_KEY, CASSANDRA_CDC_STORAGE_OPTIONS or the settings file")
    p.add_argument("--cluster", help="cluster name (first part of every key)")
    p.add_argument("--node", help="node name (default: this host's name)")
    p.add_argument("--log-level", dest="log_level", help="DEBUG, INFO, WARNING, ERROR (INFO)")


def build_parser(prog: str = "cassandra-cdc agent") -> argparse.ArgumentParser:
    p = exits.ArgumentParser(prog=prog, description="Ship completed Cassandra CDC segments from cdc_raw "
                                                    "to object storage (and: agent snapshot --help).")
    _common_flags(p)
    p.add_argument("--datacenter", help="this node's datacenter, as in cassandra-rackdc.properties (lets the "
                                        "pipeline process one datacenter's replicas only: local_datacenter)")
    p.add_argument("--poll-interval", dest="poll_interval", type=float, help="seconds between scans (1)")
    p.add_argument("--state-dir", dest="state_dir", help="local state directory (default: beside cdc_raw)")
    p.add_argument("--ship-live-prefix", dest="ship_live_prefix", action="store_true", default=None,
                   help="also ship the synced prefix of live 4.0+ segments")
    p.add_argument("--no-ship-live-prefix", dest="ship_live_prefix", action="store_false",
                   help="do not ship live prefixes, whatever the settings file or environment say (the default)")
    p.add_argument("--cdc-total-space", dest="cdc_total_space",
                   help="Cassandra's cdc_total_space, e.g. 4096MiB (default: min(4096MiB, volume/8))")
    p.add_argument("--warn-usage-fraction", dest="warn_usage_fraction", type=float,
                   help="warn when cdc_raw holds more than this fraction of the CDC space (0.5)")
    p.add_argument("--rate-window", dest="rate_window", type=float,
                   help="seconds over which arrival and ship rates are compared (300)")
    p.add_argument("--max-backoff", dest="max_backoff", type=float, help="longest retry delay in seconds (60)")
    p.add_argument("--metrics-port", dest="metrics_port", type=int,
                   help="serve Prometheus /metrics and /health on this port (default: no endpoint)")
    p.add_argument("--metrics-host", dest="metrics_host",
                   help="address the endpoint binds (127.0.0.1; it is unauthenticated)")
    p.add_argument("--once", action="store_true",
                   help="one pass, print what it did, then exit (3 if a segment could not be shipped)")
    return p


SNAPSHOT_FLAGS = ("tables", "tag", "nodetool", "data_dir", "keep")


def build_snapshot_parser(prog: str = "cassandra-cdc agent snapshot") -> argparse.ArgumentParser:
    p = exits.ArgumentParser(prog=prog, description="Take a nodetool snapshot of tables on this node and ship its "
                                                    "files to the store, for a backfill of mode sstables.")
    _common_flags(p)
    p.add_argument("--tables", required=True, help="keyspace.table, comma-separated")
    p.add_argument("--tag", required=True, help="the snapshot's name (the backfill's tag param)")
    p.add_argument("--nodetool", default="nodetool",
                   help="the nodetool command, with its options (default: nodetool)")
    p.add_argument("--data-dir", dest="data_dir", action="append",
                   help="a Cassandra data_file_directories entry, repeatable (default: /var/lib/cassandra/data)")
    p.add_argument("--keep", action="store_true", help="leave the snapshot on the node (default: clearsnapshot)")
    return p


def load_agent_config(args: argparse.Namespace, env: dict[str, str] | None = None) -> AgentConfig:
    flags = {k: v for k, v in vars(args).items()
             if k not in ("config", "once", "storage_option") + SNAPSHOT_FLAGS}
    if args.storage_option:
        options = config_mod.parse_key_values(args.storage_option)
        exposed = sorted(k for k in options if k.lower() in config_mod.SECRET_STORAGE_OPTIONS)
        if exposed:
            raise ConfigError(f"--storage-option {', '.join(exposed)}: credentials on the command line are visible to "
                              "every user of this machine (ps); give them as AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
                              f"(s3fs reads them), in {config_mod.ENV_PREFIX}STORAGE_OPTIONS or under storage_options "
                              "in the settings file (readable by the agent's user only)")
        flags["storage_options"] = options
    return config_mod.load(AgentConfig, flags=flags, env=env, config_file=args.config, section="agent")


def snapshot_main(argv: list[str]) -> int:
    """``cassandra-cdc agent snapshot ...`` (``agent.snapshot``): prints the manifest's summary."""
    from cdc_lib.agent.snapshot import NodetoolError, nodetool_command, ship_snapshot
    args = build_snapshot_parser().parse_args(argv)
    try:
        cfg = load_agent_config(args)
        logging.basicConfig(level=getattr(logging, str(cfg.log_level).upper(), logging.INFO),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        manifest = ship_snapshot(cfg, args.tables.split(","), args.tag, nodetool=nodetool_command(args.nodetool),
                                 data_dirs=args.data_dir or ["/var/lib/cassandra/data"], keep=args.keep)
    except ConfigError as e:
        print(f"cassandra-cdc agent snapshot: {e}", file=sys.stderr)
        return exits.USAGE
    except NodetoolError as e:
        print(f"cassandra-cdc agent snapshot: {e}", file=sys.stderr)
        return exits.FAILED
    files = [f for t in manifest["tables"].values() for f in t["files"]]
    print(f"cassandra-cdc agent snapshot: {manifest['tag']} of {', '.join(manifest['tables'])} on "
          f"{manifest['node']}: {len(files)} files, {sum(f['size'] for f in files) / 1e6:.1f} MB in the store")
    return exits.OK


def agent_main(argv: list[str] | None = None) -> int:
    """``cassandra-cdc agent ...``: returns the exit status (``exits``; 0 after a clean SIGTERM/SIGINT stop)."""
    if argv and argv[0] == "snapshot":
        return snapshot_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        cfg = load_agent_config(args)
        level = getattr(logging, str(cfg.log_level).upper(), None)
        if not isinstance(level, int):
            raise ConfigError(f"unknown log level {cfg.log_level!r}")
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        agent = Agent(cfg)
        endpoint = None
        if cfg.metrics_port is not None and not args.once:
            endpoint = MetricsEndpoint(agent, cfg.metrics_host, cfg.metrics_port)
    except ConfigError as e:
        print(f"cassandra-cdc agent: {e}", file=sys.stderr)
        return exits.USAGE
    if args.once:
        agent.run_once()
        print(f"cassandra-cdc agent: {agent.pass_summary()}")
        return exits.FAILED if agent.metrics()["consecutive_failures"] else exits.OK
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s, stopping after the current step", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        agent.run_forever(stop)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if endpoint is not None:
            endpoint.close()
    return 0


if __name__ == "__main__":
    sys.exit(agent_main(sys.argv[1:]))
