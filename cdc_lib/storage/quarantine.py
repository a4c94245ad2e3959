"""Quarantine: damaged or undecodable bytes kept aside in the store, each with the reason it was kept.

Key: ``quarantined/<cluster>/<node>/<segment>.<position>.<kind>`` with ``<key>.reason.json`` beside it. Keys are
deterministic, so quarantining the same damage again (a retried Spark task) rewrites the same objects, and the
pipeline reads the records back from the store instead of trusting one run's result.
"""
from __future__ import annotations

import os
import re

from .layout import REASON_SUFFIX, Layout

_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]")


def node_of(path) -> str:
    """The node a segment came from: its directory name (``incoming/<cluster>/<node>/<segment>``)."""
    parent = os.path.basename(os.path.dirname(str(path).rstrip("/"))) or "unknown"
    name = _NAME_BAD.sub("_", parent)
    return name if name[:1].isalnum() else "n" + name


def quarantine_damage(store, cluster: str, damage, *, source_path, batch_id: str) -> str:
    """Write a ``commitlog.segment.Damage`` (its bytes, and why) to quarantine in ``store`` (a ``storage.ObjectStore``).

    Key: ``quarantined/<cluster>/<node>/<segment>.<position>.<kind>`` with ``<key>.reason.json`` beside it;
    deterministic, so quarantining the same damage again rewrites the same objects. Returns the key.
    """
    seg = _NAME_BAD.sub("_", os.path.basename(damage.segment or str(source_path)))
    key = Layout.quarantined(cluster, node_of(source_path), f"{seg}.{damage.position}.{damage.kind}")
    reason = {"batch_id": batch_id, "segment": damage.segment, "source_path": str(source_path),
              "position": damage.position, "physical_position": damage.physical_position, "kind": damage.kind,
              "reason": damage.reason, "bytes": len(damage.data)}
    store.put_json(Layout.reason(key), reason)
    store.put_bytes(key, damage.data)
    return key


def quarantined_records(store, cluster: str, segments: list, batch_id: str) -> list:
    """Quarantine records (key, node, segment, kind, reason) written for these segments (``[{node, name}]``) by
    batch ``batch_id``.

    Read back from the store rather than from the job's result, so a rerun that finds the job done still knows.
    """
    out = []
    names = {(s["node"], s["name"]) for s in segments}
    for node in sorted({s["node"] for s in segments}):
        for key in store.list(Layout.area_prefix(Layout.QUARANTINED, cluster, node)):
            name = key.rsplit("/", 1)[-1]
            if name.endswith(REASON_SUFFIX):
                continue
            m = re.fullmatch(r"(CommitLog-\d+-\d+\.log)\.(\d+)\.([A-Za-z_]+)", name)
            if not m or (node, m.group(1)) not in names:
                continue
            try:
                reason = store.get_json(Layout.reason(key))
            except Exception:  # noqa: BLE001
                reason = {}
            if reason.get("batch_id") not in (None, batch_id):
                continue
            out.append({"key": key, "node": node, "segment": m.group(1), "position": int(m.group(2)),
                        "kind": m.group(3), "reason": reason.get("reason", "")})
    return out
