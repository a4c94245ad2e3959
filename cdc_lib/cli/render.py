"""Render decoded mutations as JSON-ready records (the ``inspect`` CLI's JSON Lines) and readable text.

One record per row, static row, partition deletion and range tombstone marker, with values in the JSON forms
a Cassandra user recognises (``cql.types.CqlType.to_json``).
"""
from __future__ import annotations

from cdc_lib.commitlog.model import NO_TIMESTAMP, RangeTombstoneMarker
from cdc_lib.cql.tokens import token as murmur3_token
from cdc_lib.errors import CdcError


def _json_value(ctype, data: bytes):
    try:
        return ctype.to_json(ctype.decode(data))
    except CdcError as e:
        return {"$undecodable": "0x" + data.hex(), "reason": str(e)}


def _deletion(d):
    return {"marked_for_delete_at": d.marked_for_delete_at, "local_deletion_time": d.local_deletion_time}


def _key_object(table, key: bytes) -> dict:
    cols = table.partition_key
    if len(cols) == 1:
        return {cols[0].name: _json_value(cols[0].type, key)}
    from cdc_lib.cql.types import composite_decode
    try:
        parts = composite_decode([c.type for c in cols], key)
    except CdcError as e:
        return {"$undecodable": "0x" + key.hex(), "reason": str(e)}
    return {c.name: c.type.to_json(v) for c, v in zip(cols, parts)}


def _clustering_object(table, values) -> dict:
    out = {}
    for col, v in zip(table.clustering, values):
        out[col.name] = None if v is None else _json_value(col.type, v)
    return out


def _cell_value(table, cell):
    col = table.column_for_data(cell.column)
    ctype = col.type
    if cell.is_tombstone:
        return None, (None if cell.path is None else _json_value(ctype.path_type, cell.path))
    if ctype.kind == "counter":
        from cdc_lib.cql.types import counter_total
        try:
            return counter_total(cell.value), None
        except CdcError as e:
            return {"$undecodable": "0x" + cell.value.hex(), "reason": str(e)}, None
    if cell.path is None:
        return _json_value(ctype, cell.value), None
    path = _json_value(ctype.path_type, cell.path)
    vtype = ctype.element_value_type(cell.path)
    value = None if vtype is None or (not cell.value and ctype.kind == "set") else _json_value(vtype, cell.value)
    return value, path


def _cells(table, row) -> list:
    out = []
    for c in row.cells:
        value, path = _cell_value(table, c)
        out.append({"column": c.column, "path": path, "value": value, "timestamp": c.timestamp,
                    "ttl": c.ttl, "local_deletion_time": c.local_deletion_time if (c.ttl or c.is_tombstone)
                    else None, "deleted": c.is_tombstone})
    return out


def mutation_json_records(m) -> list:
    """JSON-ready dicts for every row, static row, partition deletion and marker of mutation ``m``."""
    out = []
    for u in m.updates:
        t = u.table
        base = {"segment": m.segment, "position": m.position, "keyspace": t.keyspace, "table": t.name,
                "table_id": str(u.table_id), "token": murmur3_token(u.partition_key),
                "partition_key": _key_object(t, u.partition_key)}
        if u.partition_deletion is not None and not u.partition_deletion.is_live:
            out.append({**base, "kind": "partition_deletion", "clustering": {},
                        "deletion": _deletion(u.partition_deletion), "cells": []})
        rows = ([u.static_row] if u.static_row is not None else []) + list(u.unfiltereds)
        for r in rows:
            if isinstance(r, RangeTombstoneMarker):
                rec = {**base, "kind": "range_tombstone", "bound": r.kind.name.lower(),
                       "clustering": _clustering_object(t, r.clustering), "cells": []}
                if r.kind.is_boundary:
                    rec["end_deletion"] = _deletion(r.end_deletion)
                    rec["start_deletion"] = _deletion(r.start_deletion)
                else:
                    rec["deletion"] = _deletion(r.deletion)
                out.append(rec)
                continue
            rec = {**base, "kind": "static_row" if r.is_static else "row",
                   "clustering": {} if r.is_static else _clustering_object(t, r.clustering)}
            if r.liveness is not None and r.liveness.timestamp != NO_TIMESTAMP:
                rec["liveness"] = {"timestamp": r.liveness.timestamp, "ttl": r.liveness.ttl,
                                   "local_expiration_time": r.liveness.local_expiration_time
                                   if r.liveness.ttl else None}
            if r.deletion is not None and not r.deletion.is_live:
                rec["deletion"] = {**_deletion(r.deletion), "shadowable": r.shadowable}
            if r.complex_deletions:
                rec["complex_deletions"] = {k: _deletion(d) for k, d in r.complex_deletions.items()}
            rec["cells"] = _cells(t, r)
            out.append(rec)
    return out


def damage_json_record(d) -> dict:
    return {"segment": d.segment, "position": d.position, "kind": "error", "error": d.kind, "reason": d.reason,
            "bytes": len(d.data)}


def text_lines(rec: dict) -> list:
    """A readable rendering of one JSON record, for people."""
    import json

    def j(v):
        return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))

    where = f"{rec['segment']}@{rec['position']}"
    if rec["kind"] == "error":
        return [f"{where}  ERROR {rec['error']}: {rec['reason']} ({rec['bytes']} bytes kept)"]
    key = ", ".join(f"{k}={j(v)}" for k, v in rec["partition_key"].items())
    ck = ", ".join(f"{k}={j(v)}" for k, v in rec.get("clustering", {}).items())
    head = f"{where}  {rec['keyspace']}.{rec['table']}  [{key}]" + (f" [{ck}]" if ck else "") + f"  {rec['kind']}"
    lines = [head]
    if "deletion" in rec:
        lines.append(f"    deleted at {rec['deletion']['marked_for_delete_at']}")
    if "liveness" in rec:
        lv = rec["liveness"]
        lines.append(f"    row marker ts={lv['timestamp']}" + (f" ttl={lv['ttl']}" if lv["ttl"] else ""))
    for c in rec.get("cells", []):
        name = c["column"] + (f"[{j(c['path'])}]" if c["path"] is not None else "")
        what = "DELETED" if c["deleted"] else j(c["value"])
        extra = f" ttl={c['ttl']}" if c["ttl"] else ""
        lines.append(f"    {name} = {what}  ts={c['timestamp']}{extra}")
    return lines
