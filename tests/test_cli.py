"""`cassandra-cdc inspect`, as a user runs it: real segments, JSON Lines, text, exit statuses."""
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, sample_schema, write_cluster_segments

REPO = Path(__file__).resolve().parents[1]
CONSOLE = REPO / ".venv" / "bin" / "cassandra-cdc"


def run(*args, check_exit=None):
    cmd = [str(CONSOLE)] if CONSOLE.exists() else [sys.executable, "-m", "cdc_lib.cli"]
    p = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, cwd=REPO, timeout=300)
    if check_exit is not None:
        assert p.returncode == check_exit, p.stderr
    return p


def test_console_script_is_installed():
    """The README's setup installs the command into .venv/bin."""
    assert CONSOLE.exists(), "run the README setup (scripts/setup.sh): it installs .venv/bin/cassandra-cdc"


def _hash(records, table_id):
    cells = h = 0
    for r in records:
        if r["kind"] != "row" or r["table_id"] != table_id:
            continue
        first = next(iter(r["clustering"].values()), None)
        if not (isinstance(first, str) and first.startswith("name")):
            continue
        for c in r["cells"]:
            cells += 1
            shift = 0
            # 4.0.11 stores val as blob ("0x.."); the 3.0.29 log's schema says ascii (the files win over README)
            v = c["value"]
            raw = bytes.fromhex(v[2:]) if v.startswith("0x") else v.encode("ascii")
            for b in raw:
                h = (h + (b << shift)) & 0xFFFFFFFF
                shift = (shift + 8) & 31
    return cells, h - (1 << 32) if h >= 1 << 31 else h


@pytest.mark.parametrize("d", ["4.0.11", "3.0.29"])
def test_inspect_reproduces_hash_txt(corpus, d):
    segs = glob.glob(str(corpus / "commitlog" / d / "*.log"))
    p = run("inspect", "--schema-from-log", *segs, check_exit=0)
    recs = [json.loads(line) for line in p.stdout.splitlines()]
    truth = dict(line.split("=", 1) for line in open(corpus / "commitlog" / d / "hash.txt").read().split()
                 if "=" in line)
    assert _hash(recs, truth["cfid"]) == (int(truth["cells"]), int(truth["hash"]))
    row = next(r for r in recs if r["kind"] == "row" and r["table"] == "Standard1")
    assert {"segment", "position", "keyspace", "table", "table_id", "token", "kind", "partition_key",
            "clustering", "cells"} <= set(row)
    assert row["table_id"] == truth["cfid"]
    cell = row["cells"][0]
    assert set(cell) == {"column", "path", "value", "timestamp", "ttl", "local_deletion_time", "deleted"}
    if d == "4.0.11":
        assert cell["value"].startswith("0x") and cell["value"] == cell["value"].lower()
    errors = [r for r in recs if r["kind"] == "error"]
    assert all(r["error"] == "unknown_table" and r["reason"] for r in errors)


def test_inspect_with_schema_file_every_kind(tmp_path):
    schema_file = tmp_path / "schema.cql"
    schema_file.write_text(SAMPLE_SCHEMA_CQL)
    cw = write_cluster_segments(tmp_path / "log", sample_schema(), 400, nodes=1, rf=1, seed=3)
    p = run("inspect", "--schema", schema_file, *cw.segments["node1"], check_exit=0)
    recs = [json.loads(line) for line in p.stdout.splitlines()]
    kinds = {r["kind"] for r in recs}
    assert {"row", "static_row", "partition_deletion", "range_tombstone"} <= kinds
    rows = [r for r in recs if r["kind"] == "row" and r["table"] == "orders"]
    r = next(r for r in rows if r["cells"])
    assert list(r["partition_key"]) == ["customer_id"]
    assert list(r["clustering"]) == ["order_day", "order_id"]          # key order
    assert len(r["clustering"]["order_day"]) == 10                     # 'YYYY-MM-DD'
    coll = [c for rr in rows for c in rr["cells"] if c["column"] == "items" and not c["deleted"]]
    assert coll and all(isinstance(c["path"], str) and isinstance(c["value"], int) for c in coll)
    pv = [r for r in recs if r["table"] == "page_views" and r["kind"] == "row"]
    counters = [c for r in pv for c in r["cells"] if not c["deleted"]]      # (counter batches delete some)
    assert counters and all(isinstance(c["value"], int) for c in counters)
    text = run("inspect", "--schema", schema_file, "--format", "text", *cw.segments["node1"], check_exit=0).stdout
    assert "shop.orders" in text and "DELETED" in text or "deleted at" in text


def test_inspect_damaged_segment_exit_status(corpus, tmp_path):
    src = sorted(glob.glob(str(corpus / "commitlog" / "4.0.11" / "*.log")))[0]
    raw = bytearray(open(src, "rb").read())
    raw[30000] ^= 0xFF
    bad = tmp_path / os.path.basename(src)
    bad.write_bytes(bytes(raw))
    p = run("inspect", "--schema-from-log", bad)
    assert p.returncode == 2
    recs = [json.loads(line) for line in p.stdout.splitlines()]
    errs = [r for r in recs if r["kind"] == "error" and r["error"] != "unknown_table"]
    assert errs and errs[0]["segment"] == bad.name and errs[0]["position"] > 0
    assert sum(r["kind"] == "row" for r in recs) > 300                  # everything else was read
    strict = run("inspect", "--schema-from-log", "--strict", bad)
    assert strict.returncode == 2 and "Traceback" not in strict.stderr and bad.name in strict.stderr


def test_inspect_usage_errors():
    p = run("inspect", "--keystore", "/nonexistent.jceks", "x.log")
    assert p.returncode != 0 and "Traceback" not in p.stderr
