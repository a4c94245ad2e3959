"""A strict reader of the Prometheus text exposition format (0.0.4), written from the format's description, to
check what the agent and ``cassandra-cdc metrics`` print (it shares no code with ``cdc_lib.metrics``).

``parse(text)`` -> {family: {"type": t, "help": h, "samples": {(sample name, ((label, value), ...)): float}}};
it fails on a sample without a TYPE line before it, a repeated family, a malformed line, and on histograms whose
buckets are not cumulative, lack +Inf, or whose +Inf bucket differs from _count.
"""
from __future__ import annotations

import math
import re

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\[\\"n])*)"(,|$)')
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def _value(text: str) -> float:
    return {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}.get(text) if text in ("+Inf", "-Inf", "NaN") \
        else float(text)


def _labels(text: str | None) -> tuple:
    if not text:
        return ()
    out, pos = [], 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        assert m, f"bad labels {text!r} at {pos}"
        value = re.sub(r"\\(.)", lambda g: "\n" if g.group(1) == "n" else g.group(1), m.group(2))
        out.append((m.group(1), value))
        pos = m.end()
    return tuple(out)


def parse(text: str) -> dict:
    assert text.endswith("\n"), "the exposition ends with a line feed"
    families: dict = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert name not in families, f"family {name} declared twice"
            families[name] = {"help": line.split(" ", 3)[3] if line.count(" ") >= 3 else "", "type": None,
                              "samples": {}}
            current = name
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == current and kind in _SUFFIXES, line
            families[name]["type"] = kind
        elif line.startswith("#") or not line:
            continue
        else:
            m = _SAMPLE.match(line)
            assert m, f"malformed sample line {line!r}"
            name = m.group(1)
            fam = families.get(current)
            assert fam and fam["type"], f"sample {name} before its TYPE"
            assert any(name == current + s for s in _SUFFIXES[fam["type"]]), f"{name} does not belong to {current}"
            key = (name, _labels(m.group(2)))
            assert key not in fam["samples"], f"sample {key} twice"
            fam["samples"][key] = _value(m.group(3))
    for name, fam in families.items():
        if fam["type"] == "histogram":
            _check_histogram(name, fam["samples"])
    return families


def _check_histogram(name: str, samples: dict) -> None:
    series: dict = {}
    for (sample, labels), value in samples.items():
        rest = tuple(kv for kv in labels if kv[0] != "le")
        entry = series.setdefault(rest, {"buckets": [], "count": None})
        if sample.endswith("_bucket"):
            entry["buckets"].append((_value(dict(labels)["le"]), value))
        elif sample.endswith("_count"):
            entry["count"] = value
    for rest, entry in series.items():
        buckets = sorted(entry["buckets"])
        assert buckets and buckets[-1][0] == math.inf, f"{name}{rest}: no +Inf bucket"
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), f"{name}{rest}: buckets not cumulative"
        assert counts[-1] == entry["count"], f"{name}{rest}: +Inf bucket != _count"


def value(families: dict, sample: str, **labels) -> float:
    """The one sample named ``sample`` whose labels include ``labels``."""
    family = _family_of(families, sample)
    found = [v for (name, ls), v in families[family]["samples"].items()
             if name == sample and labels.items() <= dict(ls).items()]
    assert len(found) == 1, f"{sample} {labels}: {len(found)} samples"
    return found[0]


def samples(families: dict, sample: str) -> dict:
    """{labels dict as a sorted tuple: value} of every sample named ``sample``."""
    family = _family_of(families, sample)
    return {ls: v for (name, ls), v in families[family]["samples"].items() if name == sample}


def _family_of(families: dict, sample: str) -> str:
    """The family a sample belongs to: its name, or the longest family name it extends by a suffix of its type."""
    owners = [f for f, fam in families.items() if any(sample == f + s for s in _SUFFIXES[fam["type"]])]
    assert owners, f"no family has a sample {sample}"
    return max(owners, key=len)
