"""The demo as a newcomer runs it: what it prints (every step, its time, whole events) and what it leaves to try
(the README's "Try it after the demo" commands run on it)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cdc_lib.demo.run import pick_sample_events, render_event
from cdc_lib.demo.workload import sample_schema

REPO = Path(__file__).resolve().parents[1]


def _readme_try_it_commands() -> list:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Try it after the demo"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = [line for block in blocks for line in block.splitlines() if line and not line.startswith("#")]
    return [c for c in commands if "cdc-demo/" in c]


def _run_demo(cwd: Path, *args: str):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    p = subprocess.run([sys.executable, "-m", "cdc_lib.cli", "demo", *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return cwd, p.stdout, p.stderr, env


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One demo run, as `bash scripts/demo.sh` runs it (a real Cassandra node, default workdir ./cdc-demo), with a
    small workload."""
    return _run_demo(tmp_path_factory.mktemp("newcomer"), "--mutations", "300")


def test_every_long_step_says_what_runs_and_how_long_it_took(demo):
    _, out, err, _ = demo
    assert err == ""
    lines = out.splitlines()
    runs = [i for i, line in enumerate(lines) if line.startswith("[demo] airflow dags test ")]
    dags = [re.match(r"\[demo\] airflow dags test (\S+)", lines[i]).group(1) for i in runs]
    assert dags[-4:] == ["cassandra_cdc_maintenance", "cassandra_cdc", "cassandra_cdc_backfill", "cassandra_cdc"]
    for i in runs:
        assert " -c '{" in lines[i] and "   (" in lines[i], lines[i]            # the command, and what it is for
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("[demo]   done in "))
        assert all(not lines[k].startswith("[demo] airflow") for k in range(i + 1, end))
    batches = [line for line in lines if re.match(r"\[demo\]   batch \d+: ", line)]
    assert any("sweep (TTL expiries)" in b for b in batches) and any("snapshot (backfill)" in b for b in batches)
    # a stream batch's step times; its transform says where it ran (a small batch stays in the process)
    assert any(re.search(r"claim [\d.]+ s, transform [\d.]+ s \((Spark start [\d.]+ s|in this process: a small "
                         r"batch needs no Spark)\), publish [\d.]+ s, archive [\d.]+ s", line) for line in lines)
    assert any("Delta tables:" in line and "vacuumed" in line for line in lines)         # maintenance said what it did
    assert re.search(r"\[demo\] stopping Airflow \(pid \d+\), kafka \(pid \d+\) and s3 \(pid \d+\) \.\.\.\n"
                     r"\[demo\]   stopped in [\d.]+ s", out)


def test_a_real_cassandra_writes_and_the_demo_ends_with_delta_equal_to_select(demo):
    _, out, _, _ = demo
    lines = [line for line in out.splitlines() if line.startswith("[demo]")]
    assert re.match(r"\[demo\]   done in [\d.]+ s; pid \d+, CQL on 127\.0\.0\.1:\d+ after",
                    lines[lines.index(next(x for x in lines if "starting a real Cassandra 5.0 node" in x)) + 1])
    assert any(re.match(r"\[demo\] writing 300 statements through cassandra-driver", x) for x in lines)
    equal = [x for x in lines if x.startswith("[demo] Delta state equals SELECT * for 3 tables, ")]
    assert len(equal) == 1 and lines.index(equal[0]) == len(lines) - 3, lines[-4:]   # then "done in", "try it"
    rows = int(re.search(r"for 3 tables, (\d+) rows", equal[0]).group(1))
    assert rows > 50


def test_the_generated_mode_writes_three_nodes_segments_without_cassandra(tmp_path, capsys):
    """``--generated``: its own part is the source (everything after the agents is the run above); our writer
    gives three nodes' cdc_raw with every mutation on each replica, and no JVM is started."""
    from cdc_lib.cli.demo import build_parser
    from cdc_lib.demo.run import write_generated
    assert build_parser().parse_args(["--generated"]).generated
    cw, now = write_generated(tmp_path, 100, seed=7)
    assert sorted(cw.segments) == ["node1", "node2", "node3"]
    assert len(cw.mutations) == 100 and cw.replica_copies == 300
    for node in cw.segments:
        assert list((tmp_path / "cassandra" / node).glob("CommitLog-*_cdc.idx"))
    assert now > 1_700_000_000
    assert re.search(r"\[demo\] generating 100 writes on 3 nodes, RF 3 .*\n\[demo\]   done in [\d.]+ s; node1: \d+ "
                     r"segments", capsys.readouterr().out)


def test_sample_events_are_whole_and_readable(demo):
    _, out, _, _ = demo
    part = out[out.index("a few of them, whole"):out.index("[demo] copying the store")]
    assert "\\u00" not in part and "\\u4e" not in part                  # text as text
    assert re.search(r"[^\x00-\x7f]", part)                             # (the story prefers a row with some)
    headers = re.findall(r"^    (cdc\.\S+)  op=(\w)", part, re.M)
    assert [op for _, op in headers[:2]] == ["c", "u"] and headers[0][0] == headers[1][0]
    assert {"d"} <= {op for _, op in headers}
    assert "by TTL expiry" in part
    orders = [c.name for c in sample_schema().by_name("shop", "orders").columns.values()]
    block = part.split("    cdc.")[2]                                    # the update: every column, changed ones *
    rows = [(mark, name, before.strip(), after.strip())
            for mark, name, before, after in re.findall(r"^      ([* ]) (\w+) +(.*?) -> (.*)$", block, re.M)]
    if headers[0][0] == "cdc.shop.orders":
        assert sorted(name for _, name, _, _ in rows) == sorted(orders)
    assert any(mark == "*" and before != after for mark, _, before, after in rows)
    assert all(before == after for mark, _, before, after in rows if mark == " ")


def test_the_demo_leaves_a_store_the_readme_commands_run_on(demo):
    cwd, out, _, env = demo
    store = cwd / "cdc-demo" / "store"
    assert (store / "delta" / "state" / "shop.orders" / "_delta_log").is_dir()
    assert list((store / "archived" / "demo" / "node1").glob("CommitLog-7-*.log"))
    commands = _readme_try_it_commands()
    assert len(commands) >= 4
    for cmd in commands:
        cmd = cmd.replace(".venv/bin/python", sys.executable).replace(".venv/bin/cassandra-cdc",
                                                                      f"{sys.executable} -m cdc_lib.cli")
        p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=300)
        # (inspect | head: head closes the pipe early; inspect stops quietly and exits 0)
        assert p.returncode == 0 and p.stdout.strip() and p.stderr == "", (cmd, p.stderr[-2000:])
    printed = out[out.index("[demo] try it on what the demo left"):].splitlines()[1:]
    assert printed and all(line.startswith("    ") for line in printed)
    for cmd in printed:
        p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd.strip()], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0 and p.stdout.strip(), (cmd, p.stderr[-2000:])


def test_the_demo_prints_the_readme_commands():
    from cdc_lib.demo.run import try_it_commands
    printed = [c.replace(f"{sys.executable} -m cdc_lib.cli", ".venv/bin/cassandra-cdc")
               .replace(str(REPO / ".venv" / "bin" / "cassandra-cdc"), ".venv/bin/cassandra-cdc")
               .replace(str(REPO / ".venv" / "bin" / "python"), ".venv/bin/python")
               .replace(sys.executable, ".venv/bin/python") for c in try_it_commands(Path("cdc-demo"))]
    assert printed == _readme_try_it_commands()


def test_render_event_shows_every_column_before_and_after():
    value = {"op": "u", "before": {"k": 1, "name": "café", "n": 1}, "after": {"k": 1, "name": "café 中", "n": 1},
             "changed": ["name"], "source": {"node": "node1", "segment": "CommitLog-7-1.log", "position": 99,
                                             "ts_us": 1763000001234567, "expired": False, "table": "t"}}
    lines = render_event("cdc.ks.t", {"k": 1}, value)
    assert lines == ['cdc.ks.t  op=u (updated)  key={"k": 1}',
                     "    from node1 CommitLog-7-1.log @ 99, written 2025-11-13T02:13:21.234567Z",
                     "    column  before    after",
                     "    k       1      -> 1",
                     '  * name    "café" -> "café 中"',
                     "    n       1      -> 1"]
    created = {**value, "op": "c", "before": None, "changed": ["k", "name", "n"]}
    assert render_event("cdc.ks.t", {"k": 1}, created)[3:] == ["  * k       -      -> 1",
                                                              '  * name    -      -> "café 中"',
                                                              "  * n       -      -> 1"]
    events = [("cdc.ks.t", {"k": 1}, created), ("cdc.ks.t", {"k": 1}, value),
              ("cdc.ks.t", {"k": 2}, {**value, "op": "d", "after": None})]
    assert [e[2]["op"] for e in pick_sample_events(events)] == ["c", "u", "d"]
