"""The layout shows the data flow, and stays that way: imports run one way, from entry points down to the format
layers, with no circle (README, "Where things live").

Every ``import`` of a ``cdc_lib`` module, at the top of a file or inside a function, is an arrow. A stage may
import its own modules and the stages below it in ``STAGES``, never one above. ``python tests/test_layout.py``
prints the figures: modules, import floors, arrows, arrows that run back up, circles.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cdc_lib"

# Lowest first. A module of one stage may import modules of its own stage and of the stages before it.
STAGES = (
    "errors", "wire", "gcpause", "metrics", "allocator",   # shared by every stage
    "storage",                        # the object store and its key layout
    "settings",                       # the one settings model
    "cql",                            # CQL types, tokens, table metadata
    "commitlog",                      # segment bytes -> typed mutations
    "celllog",                        # typed mutations -> the Arrow cell log
    "sstable",                        # SSTables -> the same cell log
    "scan",                           # a live table through CQL -> the same cell log
    "state",                          # cell log -> row state -> change events
    "sinks",                          # Avro/JSON, Delta, Kafka
    "spark",                          # the transform step on Spark
    "agent",                          # beside each node: cdc_raw -> the store
    "pipeline",                       # the DAG's steps
    "demo",                           # the demo, embedded servers, generated workloads (not production)
    "cli",                            # the cassandra-cdc command (its `demo` subcommand runs the demo)
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def import_graph() -> dict:
    """{module: {imported cdc_lib module, ...}} over every module of the package."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            out |= {t for t in targets if t.startswith("cdc_lib.") and t in modules and t != name}
        graph[name] = out
    return graph


def upward_imports(graph: dict) -> list:
    rank = {s: i for i, s in enumerate(STAGES)}
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if _stage(a) and _stage(b) and rank[_stage(b)] > rank[_stage(a)])


def circles(graph: dict) -> list:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found: list = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def floors(graph: dict) -> int:
    """The longest import chain, counted in modules (a module stands one floor above all it imports)."""
    memo: dict = {}

    def height(v, seen=()):
        if v in memo:
            return memo[v]
        if v in seen:          # a circle: counted once
            return 0
        h = 1 + max((height(w, seen + (v,)) for w in graph.get(v, ())), default=0)
        memo[v] = h
        return h
    return max((height(v) for v in graph), default=0)


def test_every_module_belongs_to_a_known_stage():
    unknown = sorted({_stage(m) for m in import_graph() if _stage(m) and _stage(m) not in STAGES})
    assert unknown == [], f"new stages must be placed in STAGES (and the README's list): {unknown}"


def test_imports_run_one_way():
    assert upward_imports(import_graph()) == []


def test_no_circles():
    assert circles(import_graph()) == []


@pytest.mark.parametrize("entry", ["dags", "spark_jobs"])
def test_entry_points_call_the_library_and_nothing_calls_them(entry):
    root = PACKAGE.parent
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + \
                [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
        assert not [n for n in names if n.split(".")[0] == entry], f"{path.relative_to(root)} imports {entry}"


if __name__ == "__main__":
    g = import_graph()
    print(f"modules {len(g)}, import floors {floors(g)}, arrows {sum(len(t) for t in g.values())}, "
          f"arrows that run back up {len(upward_imports(g))}, circles {len(circles(g))}")
    for a, b in upward_imports(g):
        print(f"  up: {a} -> {b}")
    for c in circles(g):
        print(f"  circle: {' <-> '.join(c)}")
