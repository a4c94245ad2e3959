"""Benchmark (not a test): two or more builds of the compiled core timed against each other, in one process.

    .venv/bin/python native/build.py --wheel /tmp/new       # the build to compare (profile-guided, as installed)
    .venv/bin/python benchmarks/engine_ab.py installed /tmp/new/*.whl [--pairs 8] [--state-order token]

Why: on this project's 2-core VMs one engine call's CPU time moves by up to a fifth from one run to the next
(docs/benchmarks.md, "The round after 2230958"), and ``bench_merge.py`` runs one build per process, minutes apart.
Here the builds are called in turn on the same batch (in alternating order: A B, B A, A B, ...), so each round of
calls meets the same machine: the ratio of a round's CPU seconds cancels most of the machine's drift.
``engine_instructions.py`` counts instructions exactly; this says what they cost in time, caches and all.

Each call runs in a process of its own, which loads that build alone and reads the batch from Arrow files this
process wrote (memory-mapped), calls the engine ``--calls`` times and reports the last call: a warm call, as a
long-lived worker makes them. Builds loaded side by side into one process were 0.76-1.04 times one another's CPU
for byte-identical copies of one build, the same way round after round (docs/benchmarks.md, "The round after
e807c7b"): where a library lands in a process is part of what a call costs, so one landing per process would be a
bias for a whole run, and a landing per call is noise the rounds average out.

The batch is ``bench_merge.py``'s, as ``engine_phases.py`` builds it (``UPDATE kv SET v = ?, n = ? WHERE id = ?`` on
distinct ids, a fifth of them new; the others' stored rows, in token order as a first load writes them and a MERGE
keeps them, or shuffled: ``--state-order``). Each call is what a batch asks of the engine:
``state.native.partition_keys``, then ``sinks.delta.table_outputs``; only the second is timed (wall and the
process's CPU seconds, user + system, all threads). The builds' outputs (events and MERGE source rows) must be
equal, which this process checks first with every build loaded: a build that answers differently is reported and
the run fails.

Builds: ``installed`` (the ``cdc_native`` in this Python), a wheel (``native/build.py --wheel DIR`` makes one) or a
directory holding a ``cdc_native`` package. Compare builds made the same way (profile-guided or not).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
# before pyarrow, as in the pipeline's processes: importing cdc_lib settles how mimalloc maps and purges memory
# (cdc_lib.allocator), and pyarrow's mimalloc reads that when it loads
import cdc_lib  # noqa: E402,F401

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import bench_merge  # noqa: E402
from cdc_lib.celllog import native as celllog_native  # noqa: E402
from cdc_lib.cql.schema_from_ddl import load_cql_schema  # noqa: E402
from cdc_lib.sinks import delta as delta_store  # noqa: E402
from cdc_lib.state import native as native_state  # noqa: E402


def load(build: str, scratch: Path):
    """The ``cdc_native`` module of ``build`` (``installed``, a wheel or a directory holding the package), loaded
    under its own path so that several live in one process."""
    if build == "installed":
        import cdc_native
        return cdc_native
    path = Path(build)
    if path.suffix == ".whl":
        unpacked = scratch / f"{len(list(scratch.iterdir()))}-{path.stem}"
        with zipfile.ZipFile(path) as whl:
            whl.extractall(unpacked)
        path = unpacked
    found = sorted(path.glob("cdc_native/cdc_native*.so"))
    if not found:
        sys.exit(f"engine_ab: no cdc_native/cdc_native*.so under {path}")
    spec = importlib.util.spec_from_file_location("cdc_native", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if getattr(module, "API", None) != celllog_native.API:
        sys.exit(f"engine_ab: {build} speaks API {getattr(module, 'API', None)}, this checkout {celllog_native.API}")
    return module


def call(module, table, cells: pa.Table, stored: pa.Table) -> tuple:
    """One batch's calls of the engine with ``module`` as the compiled core: (wall s, CPU s, outputs)."""
    celllog_native._native = module      # what state.native calls (compiled_module())
    grouping = native_state.partition_keys(cells).grouping
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = delta_store.table_outputs(table, cells, stored, bench_merge.NOW + 5, grouping=grouping)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return wall, bench_merge.cpu_seconds(r0, r1), out


BATCH_FILES = ("cells.arrow", "stored.arrow")


def write_batch(directory: Path, cells: pa.Table, stored: pa.Table) -> None:
    """The batch as Arrow files in ``directory``, for the timed processes to map (``read_batch``)."""
    for name, t in zip(BATCH_FILES, (cells, stored)):
        with pa.OSFile(str(directory / name), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
            w.write_table(t)


def read_batch(directory: Path) -> tuple:
    """(cells, stored) as ``write_batch`` wrote them, memory-mapped (no copy)."""
    return tuple(pa.ipc.open_file(pa.memory_map(str(directory / name))).read_all() for name in BATCH_FILES)


def timed(build: str, directory: Path, calls: int) -> tuple:
    """One timed call of ``build`` on the batch in ``directory``, in a process of its own: (wall s, CPU s) of the
    last of ``calls`` calls there (the ones before it warm the process's memory up)."""
    done = subprocess.run([sys.executable, __file__, "--child", build, "--data", str(directory),
                           "--calls", str(calls)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"engine_ab: the timed call of {build} failed:\n{done.stderr[-3000:]}")
    wall, cpu = json.loads(done.stdout.strip().splitlines()[-1])[-1]
    return wall, cpu


def child(build: str, directory: Path, calls: int) -> None:
    """The timed process: ``calls`` calls of ``build`` on the batch in ``directory``; prints [[wall, CPU], ...]."""
    os.environ[celllog_native.ENV] = "1"
    table = load_cql_schema(bench_merge.CQL).by_name("bench", "kv")
    cells, stored = read_batch(directory)
    with tempfile.TemporaryDirectory(prefix="engine-ab-") as scratch:
        module = load(build, Path(scratch))
        times = []
        for _ in range(calls):
            w, c, out = call(module, table, cells, stored)
            del out
            times.append([w, c])
    print(json.dumps(times))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("builds", nargs="+", help="installed, a wheel, or a directory holding a cdc_native package; "
                                             "the first is the baseline")
    p.add_argument("--changes", type=int, default=1_000_000)
    p.add_argument("--new-fraction", type=float, default=0.2)
    p.add_argument("--pairs", type=int, default=8, help="rounds of calls, every build called once in each")
    p.add_argument("--calls", type=int, default=3, help="calls in each timed process; the last is timed")
    p.add_argument("--state-order", choices=("token", "shuffled"), default="token")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a.builds[0], Path(a.data), a.calls)
        return 0
    if len(a.builds) < 2:
        p.error("give at least two builds")
    os.environ[celllog_native.ENV] = "1"
    table = load_cql_schema(bench_merge.CQL).by_name("bench", "kv")
    cells, stored, n_new = bench_merge.engine_batch(table, a.changes, a.new_fraction, a.seed, "pipeline")
    if a.state_order == "shuffled":
        stored = stored.take(pa.array(np.random.default_rng(a.seed).permutation(stored.num_rows)))
    original = celllog_native._native       # each call swaps the build in (`call`); put back after
    try:
        with tempfile.TemporaryDirectory(prefix="engine-ab-") as scratch:
            modules = [load(b, Path(scratch)) for b in a.builds]
            print(f"{a.changes:,} changes ({n_new:,} new), {stored.num_rows:,} stored rows in {a.state_order} "
                  f"order; {a.pairs} rounds, each call in a process of its own (the last of {a.calls})")
            reference = None
            for build, module in zip(a.builds, modules):       # every build once, outputs compared
                _, _, (events, source, changed) = call(module, table, cells, stored)
                if reference is None:
                    reference = (events, source, changed)
                elif not (events.equals(reference[0]) and source.equals(reference[1]) and changed == reference[2]):
                    print(f"engine_ab: {build} answers differently from {a.builds[0]}", file=sys.stderr)
                    return 1
                del events, source
            print("outputs: equal (events and MERGE source rows)")
            del reference, modules
            data = Path(scratch) / "batch"
            data.mkdir()
            write_batch(data, cells, stored)
            # by place in the list, not by name: the same build may be named twice (a control against itself)
            cpu = [[] for _ in a.builds]
            wall = [[] for _ in a.builds]
            for i in range(a.pairs):
                turn = list(enumerate(a.builds))
                for k, build in (turn if i % 2 == 0 else turn[::-1]):
                    w, c = timed(build, data, a.calls)
                    wall[k].append(w)
                    cpu[k].append(c)
    finally:
        celllog_native._native = original
    base = a.builds[0]
    for k, build in enumerate(a.builds):
        ratios = [c / b for c, b in zip(cpu[k], cpu[0])]
        print(f"{build}: CPU median {statistics.median(cpu[k]):.3f} s, wall median "
              f"{statistics.median(wall[k]):.3f} s; CPU against {base} round by round: median "
              f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
