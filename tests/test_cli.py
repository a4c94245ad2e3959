"""`cassandra-cdc inspect`, as a user runs it: real segments, JSON Lines, text, exit statuses."""
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, sample_schema, write_cluster_segments

REPO = Path(__file__).resolve().parents[1]
CONSOLE = REPO / ".venv" / "bin" / "cassandra-cdc"


def run(*args, check_exit=None, prefix=()):
    cmd = [*prefix, *([str(CONSOLE)] if CONSOLE.exists() else [sys.executable, "-m", "cdc_lib.cli"])]
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
    assert "shop.orders" in text
    assert "DELETED" in text or "deleted at" in text


REAL_40 = "4.0.11/CommitLog-7-1699285478684.log"
REAL_30 = "3.0.29/CommitLog-6-1699279786262.log"


def _records(stdout: str) -> list:
    return [json.loads(line) for line in stdout.splitlines()]


def _copy(corpus, rel, tmp_path, edit=lambda raw: raw) -> Path:
    raw = (corpus / "commitlog" / rel).read_bytes()
    out = tmp_path / rel.rsplit("/", 1)[1]
    out.write_bytes(edit(bytearray(raw)))
    return out


def test_inspect_torn_segment_prints_every_whole_entry_and_exits_2(corpus, tmp_path):
    """Issue 13, item 1: the real 4.0.11 segment cut at byte 37,500 (inside its third section)."""
    cut = _copy(corpus, REAL_40, tmp_path, lambda raw: raw[:37500])
    p = run("inspect", "--schema-from-log", cut)
    assert p.returncode == 2
    recs = _records(p.stdout)
    intact = _records(run("inspect", "--schema-from-log", corpus / "commitlog" / REAL_40, check_exit=0).stdout)
    assert recs[:-1] == [r for r in intact if r["position"] <= 37500]      # every whole entry, as intact
    assert sum(r["table"] == "Standard1" for r in recs[:-1]) == 172
    reason = ("the entry of 184 bytes at 37416 is cut after 76 bytes: the section at file offset 1576 ends at "
              "75003, past the end of the file (37500 bytes): 37503 bytes are missing")
    assert recs[-1] == {"segment": cut.name, "position": 37416, "kind": "error", "error": "torn_tail",
                        "reason": reason, "bytes": 84}
    assert p.stderr == (f"cassandra-cdc inspect: damaged input: 1 damage record(s) in 1 of 1 segment(s); first "
                        f"{cut.name} @ 37416: torn_tail: {reason}\n")
    strict = run("inspect", "--schema-from-log", "--strict", cut)
    assert strict.returncode == 2 and _records(strict.stdout) == recs[:-1]
    assert strict.stderr == (f"cassandra-cdc inspect: stopped at the first damage (--strict): {cut.name} @ 37416: "
                             f"torn_tail: {reason}\n")


def test_inspect_bit_flip_is_damage_even_with_strict(corpus, tmp_path):
    def flip(raw):
        raw[30000] ^= 0xFF
        return raw
    bad = _copy(corpus, REAL_40, tmp_path, flip)
    p = run("inspect", "--schema-from-log", bad)
    assert p.returncode == 2
    errs = [r for r in _records(p.stdout) if r["kind"] == "error"]
    assert [(r["error"], r["position"]) for r in errs] == [("crc_mismatch", 29908)]
    assert sum(r["kind"] == "row" for r in _records(p.stdout)) == 354       # everything else was read
    assert p.stderr == (f"cassandra-cdc inspect: damaged input: 1 damage record(s) in 1 of 1 segment(s); first "
                        f"{bad.name} @ 29908: crc_mismatch: mutation CRC mismatch in entry of 192 bytes\n")
    strict = run("inspect", "--schema-from-log", "--strict", "--system", bad)     # system entries do not stop it
    assert strict.returncode == 2 and strict.stderr == (
        f"cassandra-cdc inspect: stopped at the first damage (--strict): {bad.name} @ 29908: crc_mismatch: "
        "mutation CRC mismatch in entry of 192 bytes\n")


@pytest.mark.parametrize("rel", [REAL_30, REAL_40])
def test_strict_on_a_pristine_segment_reads_everything(corpus, rel):
    """--strict is about damage: entries of tables the schema does not know (Cassandra's own) do not stop it."""
    seg = corpus / "commitlog" / rel
    for extra in ((), ("--system",)):
        plain = run("inspect", "--schema-from-log", *extra, seg, check_exit=0)
        strict = run("inspect", "--schema-from-log", "--strict", *extra, seg, check_exit=0)
        assert strict.stdout == plain.stdout and strict.stderr == plain.stderr == ""


def test_system_keyspaces_are_left_out_unless_asked_for(corpus):
    seg = corpus / "commitlog" / REAL_30
    recs = _records(run("inspect", "--schema-from-log", seg, check_exit=0).stdout)
    assert {(r["keyspace"], r["table"], r["kind"]) for r in recs} == {("Keyspace1", "Standard1", "row")}
    everything = _records(run("inspect", "--schema-from-log", "--system", seg, check_exit=0).stdout)
    unknown = [r for r in everything if r["kind"] == "error"]
    assert len(unknown) == 68 and {r["error"] for r in unknown} == {"unknown_table"}
    assert {r["keyspace"] for r in everything if r["kind"] != "error"} == {"system_schema", "Keyspace1"}
    assert [r for r in everything if r.get("keyspace") == "Keyspace1"] == recs


def test_without_a_schema_option_it_says_which_option_is_missing(corpus):
    p = run("inspect", corpus / "commitlog" / REAL_30, check_exit=0)
    assert {(r["kind"], r["error"]) for r in _records(p.stdout)} == {("error", "unknown_table")}
    assert p.stderr == ("cassandra-cdc inspect: no schema given, so none of the 98 entries could be decoded: add "
                        "--schema FILE (cqlsh -e 'DESCRIBE SCHEMA' output) or --schema-from-log\n")


def _bad_inputs(tmp_path):
    good_schema = tmp_path / "schema.cql"
    good_schema.write_text(SAMPLE_SCHEMA_CQL)
    binary = tmp_path / "binary.cql"
    binary.write_bytes(b"CREATE TABLE \xff\xfe\x00")
    prose = tmp_path / "notes.txt"
    prose.write_text("just some notes\n")
    no_key = tmp_path / "keystore.jceks"
    # neither keystore's magic nor a DER SEQUENCE (0x30, read as PKCS12): random bytes began with 0x30 one time in
    # 256, and the message was then PKCS12's
    no_key.write_bytes(b"not a keystore\n" + bytes(range(49)))
    missing = tmp_path / "missing.log"
    password = tmp_path / "keystore-password"
    password.write_text("x\n")
    empty = tmp_path / "empty-password"
    empty.write_text("")
    return {
        "missing segment": (["inspect", "--schema-from-log", "SEG", missing],
                            f"{missing}: no such segment file"),
        "directory": (["inspect", "SEG", tmp_path],
                      f"{tmp_path}: is a directory without SSTables (no *-Data.db file in it)"),
        "binary schema": (["inspect", "--schema", binary, "SEG"],
                          f"{binary}: is not a CQL text file (byte 0xff at offset 13 is not UTF-8)"),
        "schema without tables": (["inspect", "--schema", prose, "SEG"],
                                  f"{prose}: holds no CREATE TABLE statement (give the output of cqlsh -e "
                                  "'DESCRIBE SCHEMA')"),
        "missing schema": (["inspect", "--schema", tmp_path / "nope.cql", "SEG"],
                           f"{tmp_path / 'nope.cql'}: no such schema file"),
        "missing keystore": (["inspect", "--keystore", tmp_path / "nope.jceks", "--keystore-password-file", password,
                              "SEG"], f"{tmp_path / 'nope.jceks'}: no such keystore"),
        "garbage keystore": (["inspect", "--keystore", no_key, "--keystore-password-file", password, "SEG"],
                             f"keystore {no_key} cannot be read as JCEKS/JKS: Not a JKS or JCEKS keystore (magic "
                             "number wrong; expected FEEDFEED or CECECECE)"),
        "keystore without password": (["inspect", "--keystore", no_key, "SEG"],
                                      "--keystore needs its password: --keystore-password-file FILE or "
                                      "CASSANDRA_CDC_KEYSTORE_PASSWORD"),
        "empty password file": (["inspect", "--keystore", no_key, "--keystore-password-file", empty, "SEG"],
                                f"keystore password file {empty} is empty (the secret is its first line)"),
        "key file without keys": (["inspect", "--key-file", empty, "SEG"],
                                  f"{empty}: holds no encryption key (one ALIAS=HEX per line)"),
        "bad key": (["inspect", "--key-file", prose, "SEG"], "encryption key 'just some notes' is not ALIAS=HEX"),
    }


@pytest.mark.parametrize("case", ["missing segment", "directory", "binary schema", "schema without tables",
                                  "missing schema", "missing keystore", "garbage keystore",
                                  "keystore without password", "empty password file", "key file without keys",
                                  "bad key"])
def test_bad_inputs_are_one_line_before_any_output(corpus, tmp_path, case):
    """Inputs are checked before anything is read: no partial output, no traceback, one line naming the file."""
    argv, message = _bad_inputs(tmp_path)[case]
    argv = [corpus / "commitlog" / REAL_40 if a == "SEG" else a for a in argv]
    p = run(*argv)
    assert (p.returncode, p.stdout, p.stderr) == (1, "", f"cassandra-cdc inspect: {message}\n")


# Root reads files whatever their mode (CAP_DAC_OVERRIDE): as root (CI's containers) the command runs without the
# two capabilities that allow it, which setpriv drops from the bounding set of what it executes.
WITHOUT_ROOT_READS = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")


def test_unreadable_segment_is_one_line(corpus, tmp_path):
    seg = _copy(corpus, REAL_40, tmp_path)
    seg.chmod(0)
    prefix = WITHOUT_ROOT_READS if os.geteuid() == 0 else ()
    if prefix and (shutil.which("setpriv") is None or subprocess.run([*prefix, "true"]).returncode != 0):
        pytest.skip("running as root, and setpriv cannot drop the capabilities that let root read any file")
    p = run("inspect", seg, prefix=prefix)
    assert (p.returncode, p.stdout, p.stderr) == (1, "", f"cassandra-cdc inspect: {seg}: cannot be read "
                                                        "(Permission denied)\n")


def test_usage_errors_exit_1_and_help_documents_the_exit_statuses():
    p = run("inspect")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.endswith("cassandra-cdc inspect: error: the following arguments are required: SEGMENT|SSTABLE\n")
    p = run("no-such-command")
    assert p.returncode == 1 and "invalid choice: 'no-such-command'" in p.stderr
    p = run("agent", "--once", "--store-url", "memory://x")
    assert p.returncode == 1 and "missing required setting" in p.stderr and "Traceback" not in p.stderr
    for argv in (["--help"], ["inspect", "--help"], ["agent", "--help"], ["demo", "--help"]):
        h = run(*argv, check_exit=0).stdout
        assert "exit status: 0 done, nothing damaged; 1 usage or configuration error" in " ".join(h.split()), argv
    agent_help = run("agent", "--help", check_exit=0).stdout
    assert "do not ship live prefixes" in " ".join(agent_help.split())
    demo_help = run("demo", "--help", check_exit=0).stdout
    assert "``" not in demo_help and "--seed SEED" in demo_help


def _readme_exit_statuses() -> dict:
    """The README's exit-status table: {status: meaning}."""
    text = (REPO / "README.md").read_text()
    table = text.split("### Exit status", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    return {int(status): meaning.strip() for status, meaning in rows}


def test_every_exit_status_the_readme_promises(corpus, tmp_path):
    """Each row of the README's exit-status table, produced by the installed command as a user would."""
    promised = _readme_exit_statuses()
    assert sorted(promised) == [0, 1, 2, 3], promised
    seg = corpus / "commitlog" / REAL_40
    ok = run("inspect", "--schema-from-log", seg)
    assert ok.returncode == 0 and ok.stdout and ok.stderr == ""
    usage = run("inspect", "--schema-from-log", tmp_path / "missing.log")     # nothing read
    assert (usage.returncode, usage.stdout) == (1, "") and "no such segment file" in usage.stderr
    damaged = run("inspect", "--schema-from-log", _copy(corpus, REAL_40, tmp_path, lambda raw: raw[:37500]))
    assert damaged.returncode == 2 and damaged.stdout and "damaged input" in damaged.stderr
    # could not finish: agent --once cannot ship (the store's incoming/ is a file, so no object can go there)
    cdc_raw = tmp_path / "cdc_raw"
    cdc_raw.mkdir()
    (cdc_raw / "CommitLog-6-1.log").write_bytes((corpus / "commitlog" / REAL_30).read_bytes())
    store = tmp_path / "store"
    store.mkdir()
    (store / "incoming").write_text("not a directory")
    failed = run("agent", "--once", "--cdc-raw", cdc_raw, "--store-url", store, "--cluster", "c", "--node", "n1",
                 "--state-dir", tmp_path / "state")
    assert failed.returncode == 3, failed.stderr
    assert "1 completed segment(s) not shipped" in failed.stdout
    assert (cdc_raw / "CommitLog-6-1.log").exists()                             # nothing lost


def test_every_option_of_every_subcommand_has_help_text():
    import argparse

    from cdc_lib.cli.agent import build_parser as agent_parser
    from cdc_lib.cli.main import build_parser
    from cdc_lib.cli.demo import build_parser as demo_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in (("inspect", sub.choices["inspect"]), ("agent", agent_parser()), ("demo", demo_parser())):
        for action in parser._actions:
            assert action.help and action.help.strip(), f"{name} {action.option_strings or action.dest}: no help"


def test_inspect_into_a_closed_pipe_is_quiet(corpus):
    cmd = [str(CONSOLE)] if CONSOLE.exists() else [sys.executable, "-m", "cdc_lib.cli"]
    p = subprocess.run(" ".join(cmd + ["inspect", "--schema-from-log", str(corpus / "commitlog" / REAL_40)])
                       + " | head -1", shell=True, capture_output=True, text=True, cwd=REPO)
    assert len(p.stdout.splitlines()) == 1 and p.stderr == ""
