"""Benchmark (not a test): the compiled state engine's instructions per change, counted by valgrind's callgrind.

    .venv/bin/python benchmarks/engine_instructions.py [--changes 100000] [--source DIR ...]

Why: on this project's 2-core VMs the CPU time of the same engine work moves by up to a fifth from one run to the
next (docs/benchmarks.md, "The round after 2230958"), which hides any change of the engine worth less than that.
The instructions it executes do not move: counted here, two builds differ by what their code does, to the
instruction, in one run of each. Instructions are not time (a cache miss costs as much as a hundred of them), so a
change found cheaper here is then timed with ``bench_merge.py``; one found dearer here need not be timed.

The batch is ``bench_merge.py``'s, as ``engine_phases.py`` builds it (``UPDATE kv SET v = ?, n = ? WHERE id = ?``
on distinct ids, a fifth of them new, the others' stored rows; its records in token order, as the pipeline hands
them over). A child process under callgrind builds it and makes the calls a batch makes of the engine
(``state.native.partition_keys``, then ``sinks.delta.table_outputs``). Counted are the instructions executed in the
``cdc_native`` module's own machine code (its functions, what is inlined into them, and mimalloc, which is linked
into it), per change; not Python's, pyarrow's (building the batch) or libc's (the few copies the engine leaves to
libc's ``memcpy``, under 1 % of its instructions).

Printed per build: that count, and, when the build has symbols (``--source`` builds have), its split by the source
file the instructions come from (code inlined from the standard library or another crate under the engine module
it was inlined into). valgrind's CPU has no SHA extensions, so the event ids are hashed by the portable SHA-256
code: that part (``sha256``) is many times what it is on this machine, and is printed apart so that it can be left
out.

Builds: the installed ``cdc_native`` (the profile-guided one ``native/build.py`` makes, without symbols), unless
``--source`` is given: then each ``--source`` directory, a copy of ``native/`` with a change to compare, is built
with cargo (a plain release build with symbols, into its ``target/instructions``) and counted, in the order given.
Compare builds made the same way: profile-guided code runs other instructions than plain code.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from cargo_build import cargo_build, native_package  # noqa: E402


def build(source: Path) -> Path:
    """``source`` (a copy of ``native/``) built with cargo, with symbols, as a ``cdc_native`` package in a temporary
    directory (returned)."""
    target = source / "target" / "instructions"
    symbols = {"CARGO_PROFILE_RELEASE_STRIP": "false", "CARGO_PROFILE_RELEASE_DEBUG": "line-tables-only"}
    why_not = cargo_build(source / "Cargo.toml", target, env=symbols)
    if why_not is not None:
        sys.exit(f"engine_instructions: cannot build {source}: {why_not}")
    return native_package(target, "engine-instructions-")


def child(changes: int, seed: int) -> None:
    """Under callgrind: build the batch, then make the engine's calls on it (only the ``cdc_native`` module's
    instructions are counted, so building the batch with pyarrow is not)."""
    os.environ["CASSANDRA_CDC_NATIVE"] = "1"
    import bench_merge as bm
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    from cdc_lib.sinks import delta as delta_store
    from cdc_lib.state import native as native_state

    table = load_cql_schema(bm.CQL).by_name("bench", "kv")
    cells, stored, _ = bm.engine_batch(table, changes, 0.2, seed, "pipeline")
    grouping = native_state.partition_keys(cells).grouping
    out = delta_store.table_outputs(table, cells, stored, bm.NOW + 5, grouping=grouping)
    if out[0].num_rows != changes:
        sys.exit(f"engine_instructions: {out[0].num_rows} events for {changes} changes")
    print(f"engine: {sys.modules['cdc_native'].__file__}", flush=True)


def instructions(out_file: Path, module: str) -> dict:
    """Instructions executed in the object whose path ends with ``module``, by (source file, function): callgrind's
    output read line by line (names are given once with a number, then by the number alone; the cost line after a
    ``calls=`` line is the call's inclusive cost, which the callee's own lines already count)."""
    names: dict = {}

    def name(kind: str, spec: str) -> str:
        m = re.match(r"\((\d+)\)(?: (.*))?", spec)
        if not m:
            return spec
        key = (kind, m.group(1))
        if m.group(2) is not None:
            names[key] = m.group(2)
        return names.get(key, "?")

    counts: dict = defaultdict(int)
    ours, source, function, after_call = False, "?", "?", False
    with open(out_file) as f:
        for line in f:
            if after_call:
                after_call = False
                continue
            if line[0].isdigit() or line[0] in "+-*":
                if ours:
                    parts = line.split()
                    if len(parts) >= 2:
                        counts[(source, function)] += int(parts[1])
                continue
            key, _, value = line.rstrip("\n").partition("=")
            if key == "ob":
                ours = name("ob", value).endswith(module)
            elif key in ("fl", "fi", "fe"):
                source = name("fl", value)      # fl, fi and fe share one numbering of files
            elif key == "fn":
                function = name("fn", value)
            elif key == "calls":
                after_call = True
            elif key in ("cob", "cfi", "cfl", "cfn"):
                name({"cob": "ob", "cfi": "fl", "cfl": "fl"}.get(key, "fn"), value)
    return counts


def group(path: str, function: str) -> str:
    """What instructions are printed under: SHA-256's apart; the engine's by its source file; code inlined from
    the standard library or another crate by the engine module it was inlined into."""
    if "/sha2-" in path or path.endswith("sha256.rs") or "sha256::" in function:
        return "sha256 (portable code under valgrind)"
    if path == "???":
        return "no symbols"
    if "/rustc/" in path or "/.cargo/registry/" in path:
        # the engine module: the function's path after the crate's name, up to two lowercase names
        m = re.search(r"cdc_native::([a-z_0-9]+(?:::[a-z_0-9]+)?)::", function)
        into = m.group(1) if m else None
        return f"inlined into {into}" if into else "Rust standard library"
    if "/src/" in path:
        return path[path.rindex("/src/") + 5:]
    return path


def count(pkg: Path | None, changes: int, seed: int) -> tuple[str, dict]:
    """One build's instructions per source group (the child's ``engine:`` line, {group: instructions})."""
    with tempfile.TemporaryDirectory(prefix="engine-instructions-") as tmp:
        out_file = Path(tmp) / "callgrind.out"
        env = dict(os.environ)
        if pkg is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(pkg), str(ROOT), env.get("PYTHONPATH", "")])
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
               sys.executable, __file__, "--child", "--changes", str(changes), "--seed", str(seed)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
        if done.returncode != 0:
            sys.exit(f"engine_instructions: the child under valgrind failed ({done.returncode}):\n"
                     f"{done.stderr[-3000:]}")
        engine = next((ln for ln in done.stdout.splitlines() if ln.startswith("engine: ")), "engine: ?")
        by_group: dict = defaultdict(int)
        for (path, function), n in instructions(out_file, "cdc_native.abi3.so").items():
            by_group[group(path, function)] += n
        return engine, by_group


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--source", action="append", type=Path, default=[],
                   help="a copy of native/ to build with cargo and count (repeat to compare builds)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        sys.path.insert(0, str(ROOT))
        child(a.changes, a.seed)
        return 0
    if shutil.which("valgrind") is None:
        sys.exit("engine_instructions: needs valgrind (Debian: apt-get install valgrind)")
    builds = [(str(s), build(s.resolve())) for s in a.source] or [("installed cdc_native", None)]
    totals = []
    try:
        for label, pkg in builds:
            engine, by_group = count(pkg, a.changes, a.seed)
            total = sum(by_group.values())
            sha = sum(n for g, n in by_group.items() if g.startswith("sha256"))
            totals.append((label, total, sha))
            if set(by_group) == {"no symbols"}:
                print(f"{label} ({engine}): {total / a.changes:,.0f} instructions per change (a build without "
                      f"symbols: SHA-256's not told apart)")
                continue
            print(f"{label} ({engine}): {total / a.changes:,.0f} instructions per change, "
                  f"{(total - sha) / a.changes:,.0f} without SHA-256")
            for g, n in sorted(by_group.items(), key=lambda kv: -kv[1]):
                if n / a.changes >= 1:
                    print(f"  {g:48s} {n / a.changes:9,.0f}")
    finally:
        for _, pkg in builds:
            if pkg is not None:
                shutil.rmtree(pkg, ignore_errors=True)
    if len(totals) > 1:     # --source builds, which have symbols
        base = totals[0]
        for label, total, sha in totals[1:]:
            print(f"{label} against {base[0]}: {(total - sha) / (base[1] - base[2]) - 1:+.2%} instructions "
                  f"without SHA-256 ({(total - sha - base[1] + base[2]) / a.changes:+,.0f} per change)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
