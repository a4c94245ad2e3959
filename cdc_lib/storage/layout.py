"""The one key layout every component uses (relative to the store's root).

``<segment>`` is the Cassandra file name ``CommitLog-<v>-<id>.log``::

    incoming/<cluster>/<node>/<segment>                    completed segments shipped by the agent
    incoming-live/<cluster>/<node>/<segment>/<start>-<end> synced bytes [start, end) of a live segment (12-digit
                                                           zero-padded file offsets; the chunks of one segment
                                                           concatenate to its synced prefix). The pipeline removes
                                                           them once it has processed incoming/.../<segment>.
    archived/<cluster>/<node>/<segment>                    processed segments (moved from incoming/)
    quarantined/<cluster>/<node>/<name>                    segments kept aside, with <key>.reason.json
    backfill/<cluster>/<request>/<keyspace>.<table>/<n>.arrow   rows a backfill scanned from token range n (an
                                                           Arrow IPC stream of cell-log records)
    backfill/<cluster>/horizons/<keyspace>.<table>.json    when the backfill scans read each part of the table
    snapshots/<cluster>/<node>/<tag>/<keyspace>/<table>-<id>/<file>   a node's SSTable snapshot (agent snapshot)
    snapshots/<cluster>/<node>/<tag>/snapshot.json         its manifest, written last
    checkpoints/<name>.json                                pipeline checkpoints
    ledger/<batch_id>.json                                 the pipeline's batch ledger
    outbox/<name>                                          events waiting to be published
    delta/state/<keyspace>.<table>                         Delta table: current state of one CDC table
    delta/events                                           Delta table: the change events

Keys are deterministic (cluster / node / segment file name), so shipping the same segment twice writes the same
object with the same bytes, and the pipeline can deduplicate on the key.
"""
from __future__ import annotations

import os
import re

from cdc_lib.errors import ConfigError, FormatError, SegmentError, StorageError

CHECKSUM_SUFFIX = ".sha256"
REASON_SUFFIX = ".reason.json"
# Sidecar attribute of a shipped segment: when Cassandra closed it (unix seconds, the node's clock), where the
# pipeline's end-to-end lag starts. Segments shipped by agents older than it lack it: their lag is unknown.
CLOSED_AT_ATTRIBUTE = "closed_at"
_SEGMENT_NAME_RE = re.compile(r"^CommitLog-(\d+)-(\d+)\.log$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def parse_segment_name(name: str) -> tuple[int, int]:
    """``CommitLog-<version>-<id>.log`` (a name or a path to one) -> (version, id).

    The one parser of segment names: the key layout, the agent, the pipeline and the commit-log reader all use
    it. Anything else raises SegmentError (a FormatError) naming the file.
    """
    m = _SEGMENT_NAME_RE.match(os.path.basename(name))
    if not m:
        raise SegmentError("not a commit log segment name (expected CommitLog-<version>-<id>.log)", name)
    return int(m.group(1)), int(m.group(2))


def _check_name(what: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value) or ".." in value:
        raise ConfigError(f"{what} {value!r} must be letters, digits, '.', '_' or '-' (no '/', no '..')")
    return value


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or key.endswith("/") or "\\" in key:
        raise StorageError(f"bad object key {key!r}")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise StorageError(f"bad object key {key!r}")
    return key


class Layout:
    """The one documented key layout (see the module docstring). Methods return keys relative to the root."""

    INCOMING = "incoming"
    LIVE = "incoming-live"
    ARCHIVED = "archived"
    QUARANTINED = "quarantined"
    CHECKPOINTS = "checkpoints"
    LEDGER = "ledger"
    OUTBOX = "outbox"
    DELTA = "delta"
    NODES = "nodes"
    BACKFILL = "backfill"
    SNAPSHOTS = "snapshots"

    @staticmethod
    def _segment_key(area: str, cluster: str, node: str, segment_name: str) -> str:
        parse_segment_name(_check_name("segment", segment_name))   # a bare name, never a path
        return f"{area}/{_check_name('cluster', cluster)}/{_check_name('node', node)}/{segment_name}"

    @classmethod
    def incoming(cls, cluster: str, node: str, segment_name: str) -> str:
        return cls._segment_key(cls.INCOMING, cluster, node, segment_name)

    @classmethod
    def archived(cls, cluster: str, node: str, segment_name: str) -> str:
        return cls._segment_key(cls.ARCHIVED, cluster, node, segment_name)

    @classmethod
    def quarantined(cls, cluster: str, node: str, name: str) -> str:
        """Quarantine key; ``name`` is usually the segment name, possibly with a suffix that keeps it unique."""
        _check_name("quarantined name", name)
        return f"{cls.QUARANTINED}/{_check_name('cluster', cluster)}/{_check_name('node', node)}/{name}"

    @staticmethod
    def reason(key: str) -> str:
        """The JSON sidecar saying why ``key`` was quarantined."""
        return _check_key(key) + REASON_SUFFIX

    @classmethod
    def live_prefix(cls, cluster: str, node: str, segment_name: str) -> str:
        return cls._segment_key(cls.LIVE, cluster, node, segment_name) + "/"

    @classmethod
    def live_chunk(cls, cluster: str, node: str, segment_name: str, start: int, end: int) -> str:
        """Bytes [start, end) of a live segment's synced prefix (file offsets)."""
        if not 0 <= start < end:
            raise StorageError(f"bad live chunk range [{start}, {end})")
        return f"{cls.live_prefix(cluster, node, segment_name)}{start:012d}-{end:012d}"

    @staticmethod
    def parse_live_chunk(key: str) -> tuple[int, int]:
        """(start, end) from a live chunk key."""
        m = re.search(r"/(\d{12,})-(\d{12,})$", key)
        if not m:
            raise FormatError("not a live chunk key", key)
        return int(m.group(1)), int(m.group(2))

    @classmethod
    def area_prefix(cls, area: str, cluster: str | None = None, node: str | None = None) -> str:
        """``incoming/``, ``incoming/<cluster>/`` or ``incoming/<cluster>/<node>/`` (same for other areas)."""
        parts = [area]
        if cluster is not None:
            parts.append(_check_name("cluster", cluster))
            if node is not None:
                parts.append(_check_name("node", node))
        return "/".join(parts) + "/"

    @classmethod
    def parse_segment_key(cls, key: str) -> tuple[str, str, str, str]:
        """(area, cluster, node, segment_name) of an incoming/archived/quarantined segment key."""
        parts = key.split("/")
        if len(parts) != 4 or parts[0] not in (cls.INCOMING, cls.ARCHIVED, cls.QUARANTINED):
            raise FormatError("not a segment key (<area>/<cluster>/<node>/<segment>)", key)
        return parts[0], parts[1], parts[2], parts[3]

    @classmethod
    def node_info(cls, cluster: str, node: str) -> str:
        """What an agent says about its node (its datacenter), for the pipeline's ``local_datacenter``."""
        return f"{cls.NODES}/{_check_name('cluster', cluster)}/{_check_name('node', node)}.json"

    @classmethod
    def scanned_range(cls, cluster: str, request_id: str, keyspace: str, table: str, index: int) -> str:
        """The rows a backfill scan read from token range ``index`` of ``keyspace.table``."""
        return (f"{cls.BACKFILL}/{_check_name('cluster', cluster)}/{_check_name('request', request_id)}/"
                f"{_check_name('keyspace', keyspace)}.{_check_name('table', table)}/{int(index)}.arrow")

    @classmethod
    def horizon(cls, cluster: str, keyspace: str, table: str) -> str:
        """When backfill scans read each part of ``keyspace.table`` (``scan.horizon``)."""
        return f"{cls.horizons_prefix(cluster)}{_check_name('keyspace', keyspace)}.{_check_name('table', table)}.json"

    @classmethod
    def horizons_prefix(cls, cluster: str) -> str:
        return f"{cls.BACKFILL}/{_check_name('cluster', cluster)}/horizons/"

    @classmethod
    def snapshot_prefix(cls, cluster: str, node: str, tag: str) -> str:
        return (f"{cls.SNAPSHOTS}/{_check_name('cluster', cluster)}/{_check_name('node', node)}/"
                f"{_check_name('snapshot tag', tag)}/")

    @classmethod
    def snapshot_manifest(cls, cluster: str, node: str, tag: str) -> str:
        """What a node's snapshot holds (written last: the snapshot is complete when it exists)."""
        return cls.snapshot_prefix(cluster, node, tag) + "snapshot.json"

    @classmethod
    def snapshot_file(cls, cluster: str, node: str, tag: str, keyspace: str, table_dir: str, name: str) -> str:
        """One file of a node's snapshot of a table (``table_dir``: ``<table>-<id>``, as on the node)."""
        return (cls.snapshot_prefix(cluster, node, tag) + f"{_check_name('keyspace', keyspace)}/"
                f"{_check_name('table directory', table_dir)}/{_check_name('file', name)}")

    @classmethod
    def checkpoint(cls, name: str) -> str:
        return f"{cls.CHECKPOINTS}/{_check_name('checkpoint', name)}.json"

    @classmethod
    def ledger(cls, batch_id: str) -> str:
        return f"{cls.LEDGER}/{_check_name('batch id', batch_id)}.json"

    @classmethod
    def outbox(cls, name: str) -> str:
        return f"{cls.OUTBOX}/{_check_name('outbox name', name)}"

    @classmethod
    def state_table(cls, keyspace: str, table: str) -> str:
        return f"{cls.DELTA}/state/{_check_name('keyspace', keyspace)}.{_check_name('table', table)}"

    @classmethod
    def events_table(cls) -> str:
        return f"{cls.DELTA}/events"
