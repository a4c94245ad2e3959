"""``cassandra-cdc agent snapshot``: a ``nodetool snapshot`` of chosen tables, shipped to the store for a backfill.

The backfill mode ``sstables`` loads what tables hold from their SSTables, with no load on the cluster beyond the
snapshot (hard links: no copy on the node). On each node, the agent:

1. runs ``nodetool snapshot -t <tag> -kt <keyspace.table,...>`` (Cassandra flushes the tables' memtables first, so
   the snapshot holds every write acknowledged before it);
2. ships every file of the snapshot to ``snapshots/<cluster>/<node>/<tag>/<keyspace>/<table>-<id>/<file>``, each
   with its ``.sha256`` sidecar, as it ships segments (checked after upload; a file shipped before is not
   shipped again: the command can be run again after a failure);
3. writes ``snapshots/<cluster>/<node>/<tag>/snapshot.json`` last: the tables and their files with sizes and
   checksums. A snapshot without it is incomplete, and the backfill request ignores it;
4. runs ``nodetool clearsnapshot -t <tag>`` so the hard links do not keep compacted SSTables on the node's disk
   (``keep``: leave it).

``nodetool`` is a callable (arguments -> its output); the command line makes it from the ``--nodetool`` setting
(a command, ``nodetool`` by default, run with ``-h``/``-p`` if the node's JMX is not the default).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from cdc_lib.errors import CdcError, ConfigError
from cdc_lib.settings import AgentConfig
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import ObjectStore, sha256_file

log = logging.getLogger("cassandra_cdc.agent")


class NodetoolError(CdcError):
    """``nodetool`` failed (its exit status and output say why): the snapshot could not be taken or cleared."""


def snapshot_dirs(data_dirs, keyspace: str, table: str, tag: str) -> list:
    """The directories ``<data dir>/<keyspace>/<table>-<id>/snapshots/<tag>`` of one table's snapshot (one per data
    directory that holds the table; a table dropped and created again has an older id: only the newest counts)."""
    found = []
    for d in data_dirs:
        ks_dir = Path(d) / keyspace
        if not ks_dir.is_dir():
            continue
        for table_dir in ks_dir.iterdir():
            name, sep, table_id = table_dir.name.rpartition("-")
            if sep and name == table and (table_dir / "snapshots" / tag).is_dir():
                found.append(table_dir / "snapshots" / tag)
    return found


def ship_snapshot(config: AgentConfig, tables: list, tag: str, *, nodetool: Callable[..., str], data_dirs,
                  keep: bool = False, store: ObjectStore | None = None) -> dict:
    """Snapshot ``tables`` (``keyspace.table``) on this node and ship the files (module docstring). Returns the
    manifest written (``snapshot.json``)."""
    Layout.snapshot_manifest(config.cluster, config.node, tag)      # validates the tag
    names = [t.strip() for t in tables if t.strip()]
    if not names or any(t.count(".") != 1 for t in names):
        raise ConfigError(f"agent snapshot: give tables as keyspace.table, got {tables!r}")
    store = store or ObjectStore.from_url(config.store_url, **config.storage_options)
    t0 = time.monotonic()
    nodetool("snapshot", "-t", tag, "-kt", ",".join(names))
    manifest = {"cluster": config.cluster, "node": config.node, "tag": tag, "taken_at": int(time.time()),
                "tables": {}}
    shipped = skipped = 0
    for name in names:
        keyspace, table = name.split(".")
        dirs = snapshot_dirs(data_dirs, keyspace, table, tag)
        if not dirs:
            raise ConfigError(f"agent snapshot: no snapshot {tag!r} of {name} under {', '.join(map(str, data_dirs))} "
                              "(is the table there, and are these Cassandra's data_file_directories?)")
        files = []
        for d in dirs:
            table_dir = d.parent.parent.name                       # <table>-<id>
            for f in sorted(d.iterdir()):
                if not f.is_file():
                    continue
                key = Layout.snapshot_file(config.cluster, config.node, tag, keyspace, table_dir, f.name)
                checksum, size = sha256_file(f)
                if store.exists(key) and store.info(key).checksum == checksum:
                    skipped += 1                                    # shipped by an earlier run of this command
                else:
                    store.put_file(f, key, checksum=checksum)
                    shipped += 1
                files.append({"key": key, "name": f.name, "dir": f"{keyspace}/{table_dir}", "size": size,
                              "checksum": checksum})
        manifest["tables"][name] = {"files": files}
    store.put_json(Layout.snapshot_manifest(config.cluster, config.node, tag), manifest)
    if not keep:
        nodetool("clearsnapshot", "-t", tag)
    total = sum(f["size"] for t in manifest["tables"].values() for f in t["files"])
    log.info("snapshot %s of %s on %s: %d files shipped (%d already there), %.1f MB, in %.1f s", tag,
             ", ".join(names), config.node, shipped, skipped, total / 1e6, time.monotonic() - t0)
    return manifest


def nodetool_command(command: str) -> Callable[..., str]:
    """A ``nodetool`` callable from a command line (``nodetool``, ``/opt/cassandra/bin/nodetool -p 7199``)."""
    import shlex
    import subprocess
    argv = shlex.split(command)

    def run(*args: str) -> str:
        r = subprocess.run([*argv, *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise NodetoolError(f"{command} {' '.join(args)} failed ({r.returncode}): {r.stdout}{r.stderr}")
        return r.stdout
    return run
