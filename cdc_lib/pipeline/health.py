"""No silent green: a run whose settings cannot work fails at once; a store that looks abandoned or shared warns.

The claim step (the first task of every ``cassandra_cdc`` run) calls these before it looks for segments:

* ``check_run_settings``: a store URL and a schema source are set, and the schema file reads (a run without
  them could only ever say "nothing to do", forever).
* ``open_existing_store``: the store exists and can be listed: a local directory (the pipeline never creates its
  store: a typo must not become a new, empty one) or a bucket that answers.
* ``arrival_warnings``: no segment arrived from any node for longer than ``warn_no_segments_s`` (the agents are
  down, or ship to another store or cluster), or ``incoming/`` holds segments of clusters other than the
  configured one (an agent's ``--cluster`` and the pipeline's ``cluster`` disagree). Both are logged as warnings
  and put in the claim's metrics (``checkpoints/metrics.json``, ``last.claim.warnings``).

Arrivals are tracked in ``checkpoints/arrivals.json``: the newest segment seen per node and when it was first
seen (by the wall clock of the claim that saw it, so no object timestamps are needed).
"""
from __future__ import annotations

import logging
import os
import time

from cdc_lib.errors import CdcError, ConfigError
from cdc_lib.settings import CONFIG_FILE_ENV, ENV_PREFIX, PipelineConfig
from cdc_lib.storage.layout import Layout, parse_segment_name
from cdc_lib.storage.objects import ObjectStore

from .airflow import SETTINGS_VARIABLE
from .resources import load_schema, open_store

log = logging.getLogger("cassandra_cdc.pipeline")

ARRIVALS_KEY = Layout.checkpoint("arrivals")



def _where(name: str) -> str:
    return (f"set it in the Airflow Variable {SETTINGS_VARIABLE}, as {ENV_PREFIX}{name.upper()} or in the settings "
            f"file ({CONFIG_FILE_ENV})")


def check_run_settings(config: PipelineConfig) -> None:
    """Raise ConfigError naming every setting this run lacks (store, schema source)."""
    problems = []
    if not config.store_url:
        problems.append(f"store_url is not set (where the agents ship: s3://bucket/prefix or an absolute "
                        f"directory); {_where('store_url')}")
    if config.schema_source == "cql":
        if not config.schema_file:
            problems.append("no schema source: schema_file is not set (the output of cqlsh -e 'DESCRIBE SCHEMA', "
                            f"which keeps the table IDs); {_where('schema_file')}, or set schema_source to "
                            "'driver' with the Cassandra connection")
        elif not os.path.isfile(config.schema_file):
            problems.append(f"schema_file {config.schema_file} does not exist (or is not a file) on this worker")
    elif not config.cassandra_hosts:
        problems.append(f"schema_source is 'driver' but no Cassandra contact point is set: define the Airflow "
                        f"connection {config.cassandra_conn_id} or {_where('cassandra_hosts')}")
    if problems:
        raise ConfigError("this run's settings cannot work:\n  - " + "\n  - ".join(problems))
    if config.schema_source == "cql":
        load_schema(config)     # a file that does not parse fails here, before anything is claimed


def open_existing_store(config: PipelineConfig) -> ObjectStore:
    """The store, after checking it exists and can be listed (ConfigError naming the URL otherwise)."""
    url = config.store_url
    store = open_store(config)                  # a local store: checks the directory exists
    if store.local:
        return store
    protocol = store.fs.protocol[0] if isinstance(store.fs.protocol, (tuple, list)) else store.fs.protocol
    if protocol in ("s3", "s3a", "gs", "gcs", "abfs", "az"):
        bucket = store.root.split("/", 1)[0]
        try:
            store.fs.ls(bucket, refresh=True)
        except FileNotFoundError:
            raise ConfigError(f"store {url}: bucket {bucket!r} does not exist (endpoint "
                              f"{config.s3_endpoint_url or 'AWS'})") from None
        except Exception as e:  # noqa: BLE001 - credentials, network, permissions: all mean "cannot be listed"
            raise ConfigError(f"store {url}: cannot list bucket {bucket!r} (endpoint "
                              f"{config.s3_endpoint_url or 'AWS'}): {type(e).__name__}: {e}") from None
    return store


def _segment_id(name: str) -> int:
    return parse_segment_name(name)[1]


def arrival_warnings(store: ObjectStore, config: PipelineConfig, incoming: list[str],
                     wall_clock: float | None = None) -> tuple[list[str], dict]:
    """(warnings, counters) about what agents ship, from the keys under ``incoming/`` (all clusters).

    Counters: ``quiet_s`` (seconds since a segment last arrived for this cluster, by the claims' clock) and
    ``foreign_segments`` (segments of other clusters in ``incoming/``).
    """
    now = time.time() if wall_clock is None else wall_clock
    newest: dict = {}
    foreign: dict = {}
    for key in incoming:
        try:
            _, cluster, node, name = Layout.parse_segment_key(key)
            seg_id = _segment_id(name)
        except CdcError:
            continue            # not a segment (a stray file): never claimed, not an arrival
        if cluster != config.cluster:
            foreign[cluster] = foreign.get(cluster, 0) + 1
        elif seg_id > newest.get(node, (-1, ""))[0]:
            newest[node] = (seg_id, name)

    seen = store.get_json(ARRIVALS_KEY) if store.exists(ARRIVALS_KEY) else {}
    mine = seen.get(config.cluster) or {"since": now, "last_arrival_at": None, "newest": {}}
    arrived = {node: name for node, (seg_id, name) in newest.items()
               if node not in mine["newest"] or seg_id > _segment_id(mine["newest"][node])}
    if arrived or config.cluster not in seen:
        if arrived:
            mine["last_arrival_at"] = now
            mine["newest"] = {**mine["newest"], **arrived}
        store.put_json(ARRIVALS_KEY, {**seen, config.cluster: mine})

    warnings = []
    last = mine["last_arrival_at"]
    quiet = now - (last if last is not None else mine["since"])
    if config.warn_no_segments_s and quiet > config.warn_no_segments_s:
        what = (f"no new segment for cluster {config.cluster!r} since {_utc(last)}" if last is not None else
                f"no segment for cluster {config.cluster!r} has arrived since this pipeline first looked "
                f"({_utc(mine['since'])})")
        warnings.append(f"{what}: {quiet / 60:.0f} min, more than warn_no_segments_s={config.warn_no_segments_s}."
                        f" Are the agents running, shipping to {config.store_url} with --cluster "
                        f"{config.cluster}?")
    if foreign:
        listed = ", ".join(f"{c!r} ({n} segments)" for c, n in sorted(foreign.items()))
        warnings.append(f"incoming/ holds segments of other clusters: {listed}; this pipeline processes only "
                        f"cluster {config.cluster!r}. An agent's --cluster and the pipeline's cluster setting "
                        "disagree (or another pipeline should be processing them)")
    for w in warnings:
        log.warning("claim: WARNING: %s", w)
    return warnings, {"quiet_s": round(quiet), "foreign_segments": sum(foreign.values())}


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
