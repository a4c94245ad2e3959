"""Where the JVM parts of the tests and the demo are: ``.jvm/lib/<part>`` in the repository, fetched from Maven
Central by ``scripts/setup.sh`` as pinned by ``jvm/<part>/pom.xml`` (cassandra, kafka, apicurio, delta, s3a).

A part that is not there is an error that says how to get it (never a skipped test).
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JVM_LIB = REPO / ".jvm" / "lib"


class JvmPartMissing(RuntimeError):
    """A JVM part the tests or the demo need was not fetched."""


def part_dir(part: str) -> Path:
    """``.jvm/lib/<part>``, checked: the folder and the stamp setup.sh writes after a complete fetch exist."""
    d = JVM_LIB / part
    if not (REPO / "jvm" / part / "pom.xml").is_file():
        raise JvmPartMissing(f"no JVM part named {part!r} (jvm/{part}/pom.xml does not exist)")
    if not d.is_dir() or not (JVM_LIB / f"{part}.stamp").is_file():
        raise JvmPartMissing(f"the JVM part {part!r} is not installed in {d}: run bash scripts/setup.sh "
                             f"(it fetches jvm/{part}/pom.xml from Maven Central)")
    return d


def classpath(part: str) -> str:
    """Every jar of a part, as a Java class path (sorted, so the order is the same on every machine)."""
    jars = sorted(part_dir(part).glob("*.jar"))
    if not jars:
        raise JvmPartMissing(f"{JVM_LIB / part} holds no jar: run bash scripts/setup.sh again")
    return ":".join(str(j) for j in jars)


def jar(part: str, prefix: str) -> Path:
    """The one jar of a part whose file name starts with ``prefix`` (e.g. the jamm agent)."""
    found = sorted(part_dir(part).glob(f"{prefix}*.jar"))
    if len(found) != 1:
        raise JvmPartMissing(f"expected one {prefix}*.jar in {JVM_LIB / part}, found {len(found)}")
    return found[0]
