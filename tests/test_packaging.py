"""What ``pip install cassandra-cdc`` brings is what ``cdc_lib`` imports: every third-party module a ``cdc_lib``
module imports at its top level (so importing the module needs it) is a distribution pyproject.toml declares, in
``dependencies`` or in an extra. An import inside a function is an optional feature and may stay undeclared (the
demo's polars, the DAG helpers' pendulum, which Airflow brings).

``numpy`` was missing: pyarrow no longer requires it, and a fresh ``pip install .`` (the images' builder stage)
could not import ``cdc_lib.sinks.delta``.
"""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "cdc_lib"


def _top_level_imports(path: Path) -> set:
    """The top-level modules ``path`` imports in its module body (not in functions or classes), absolute only."""
    found = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + [s for extra in project["optional-dependencies"].values() for s in extra]
    return {_normalized(re.match(r"[A-Za-z0-9_.-]+", s).group(0)) for s in specs}


def test_every_module_cdc_lib_imports_at_its_top_is_a_declared_dependency():
    own = {"cdc_lib", "cdc_native", "__future__"}
    distributions = packages_distributions()
    declared = _declared()
    missing = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for module in _top_level_imports(path) - own - set(sys.stdlib_module_names):
            dists = {_normalized(d) for d in distributions.get(module, [])}
            assert dists, f"{path.relative_to(REPO)} imports {module}, which no installed distribution provides"
            if not dists & declared:
                missing.setdefault(module, []).append(str(path.relative_to(REPO)))
    assert not missing, f"imported at the top of cdc_lib modules but not declared in pyproject.toml: {missing}"


def test_the_check_sees_a_top_level_import_and_not_one_in_a_function(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import numpy as np\nfrom yaml import safe_load\nfrom . import x\n\n"
                 "def g():\n    import polars\n")
    assert _top_level_imports(f) == {"numpy", "yaml"}
