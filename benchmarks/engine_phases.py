"""Benchmark (not a test): where the compiled state engine's time goes, phase by phase.

    .venv/bin/python benchmarks/engine_phases.py --changes 1000000

The same batch as ``bench_merge.py`` (``UPDATE kv SET v = ?, n = ? WHERE id = ?`` on distinct ids, a fifth of them
new; the stored rows of the others, as the state table holds them; its records in ``--order``) through
``sinks.delta.table_outputs`` ``--calls`` times in one process, with a build of ``native/`` made with the
``phase-times`` feature (cargo, on first use, into ``native/target/phase-times``; the installed module is not
touched). That build reads the time-stamp counter where each phase ends (``native/src/state/phases.rs``); a sampling
profiler cannot tell the phases apart, as they are inlined into one another. Reading the clock costs a few percent,
so the figures are shares, not speeds: ``bench_merge.py`` times the engine.

Printed per phase: its share of the engine threads' time, and about how much CPU time per change that is (the
share of the calls' user + system CPU time; the part before the threads start and the Python around the call
are in the CPU time but in no phase, so this errs a little high). Phases nest, as their names say.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# before pyarrow (which bench_merge imports), as in the pipeline's processes: importing cdc_lib settles how mimalloc
# maps and purges memory (cdc_lib.allocator), and pyarrow's mimalloc reads that when it loads
import cdc_lib  # noqa: E402,F401

from cargo_build import cargo_build, native_package  # noqa: E402
TARGET = ROOT / "native" / "target" / "phase-times"


def build() -> Path:
    """The engine built with phase times (cargo), as a ``cdc_native`` package in a temporary directory."""
    why_not = cargo_build(ROOT / "native" / "Cargo.toml", TARGET, "--features", "phase-times")
    if why_not is not None:
        sys.exit(f"engine_phases: cannot build native/ with the phase-times feature: {why_not}")
    return native_package(TARGET, "engine-phases-")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=1_000_000)
    p.add_argument("--new-fraction", type=float, default=0.2)
    p.add_argument("--calls", type=int, default=3, help="calls of the engine on the batch (their times summed)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--order", choices=("pipeline", "commitlog"), default="pipeline",
                   help="the records' order: by token as the Spark job hands them over, or as written "
                        "(bench_merge.py's --orders)")
    a = p.parse_args(argv)
    built = build()
    try:
        return run(a, built)
    finally:
        shutil.rmtree(built, ignore_errors=True)


def run(a, built: Path) -> int:
    sys.path.insert(0, str(built))      # this build's cdc_native before the installed one
    sys.path.insert(1, str(ROOT / "benchmarks"))
    import cdc_native
    if getattr(cdc_native, "phase_times", lambda: None)() is None:
        sys.exit(f"engine_phases: {cdc_native.__file__} times no phases (built without phase-times?)")
    os.environ["CASSANDRA_CDC_NATIVE"] = "1"
    import bench_merge as bm

    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    from cdc_lib.sinks import delta as delta_store
    from cdc_lib.state import native as native_state

    table = load_cql_schema(bm.CQL).by_name("bench", "kv")
    cells, stored, n_new = bm.engine_batch(table, a.changes, a.new_fraction, a.seed, a.order)
    print(f"{a.changes:,} changes ({n_new:,} new), {stored.num_rows:,} stored rows, engine {cdc_native.__file__}")
    cdc_native.phase_times()            # from zero
    cpu = wall = system = 0.0
    for _ in range(a.calls):
        grouping = native_state.partition_keys(cells).grouping
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = delta_store.table_outputs(table, cells, stored, bm.NOW + 5, grouping=grouping)
        wall += time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu += bm.cpu_seconds(r0, r1)
        system += r1.ru_stime - r0.ru_stime
        assert out[0].num_rows == a.changes, out[0].num_rows
        del out
    ticks = cdc_native.phase_times()
    total = sum(t for name, t in ticks.items() if name.startswith("partition:"))
    per_change = cpu / a.calls / a.changes * 1e6
    print(f"{a.calls} calls: {wall / a.calls:.2f} s wall and {cpu / a.calls:.2f} s CPU each, {system / a.calls:.2f} s "
          f"of it system time (first touches of fresh memory): {per_change:.2f} us of CPU per change")
    print(f"{'phase':32s} {'share':>7s} {'us/change':>10s}")
    for name, t in ticks.items():
        indent = "" if name.startswith("partition:") else "  " if name.startswith("merge:") else "    "
        print(f"{indent + name:32s} {100 * t / total:6.1f}% {per_change * t / total:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
