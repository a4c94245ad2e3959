"""Metrics in the Prometheus text exposition format (version 0.0.4), and histograms kept as plain JSON.

Both the agent (``/metrics`` of its HTTP endpoint) and the pipeline (``cassandra-cdc status`` serves
``/metrics``; ``cassandra-cdc metrics`` prints it for a node_exporter textfile collector) write through
:class:`Exposition`, so names, label escaping and histogram layout are the same everywhere.

A histogram is stored as a dict (``{"le": [...], "counts": [...], "sum": s, "count": n}``, counts per bucket, not
cumulative) so that it survives a JSON round trip in ``checkpoints/metrics.json`` or the agent's ``status.json``;
:meth:`Exposition.histogram` makes the buckets cumulative as Prometheus wants them.
"""
from __future__ import annotations

import bisect
import math
from typing import Iterable, Mapping

# Lag and step durations range from about a second (a healthy pipeline) to hours (one that is down).
SECONDS_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def new_histogram(buckets: Iterable[float] = SECONDS_BUCKETS) -> dict:
    le = sorted(float(b) for b in buckets)
    return {"le": le, "counts": [0] * (len(le) + 1), "sum": 0.0, "count": 0}


def observe(hist: dict, value: float) -> None:
    """Count ``value`` in ``hist`` (the last count is the +Inf bucket)."""
    hist["counts"][bisect.bisect_left(hist["le"], value)] += 1
    hist["sum"] = hist["sum"] + value
    hist["count"] += 1


def quantile(hist: dict, q: float) -> float | None:
    """The upper bound of the bucket holding quantile ``q`` (what a status page can show without raw samples);
    None for an empty histogram, ``inf`` when it falls in the overflow bucket."""
    if not hist or not hist["count"]:
        return None
    rank = q * hist["count"]
    seen = 0
    for bound, n in zip(list(hist["le"]) + [math.inf], hist["counts"]):
        seen += n
        if seen >= rank and n:
            return bound
    return math.inf


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str] | None, extra: tuple[str, str] | None = None) -> str:
    pairs = list((labels or {}).items()) + ([extra] if extra else [])
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _number(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


class Exposition:
    """Builds one scrape: families in the order first named, each with its HELP and TYPE once."""

    def __init__(self, prefix: str = "cassandra_cdc_"):
        self.prefix = prefix
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def _family(self, name: str, kind: str, help_text: str) -> list[str]:
        full = self.prefix + name
        if full not in self._families:
            self._families[full] = (kind, help_text, [])
        elif self._families[full][0] != kind:
            raise ValueError(f"metric {full} is both a {self._families[full][0]} and a {kind}")
        return self._families[full][2]

    def gauge(self, name: str, help_text: str, value: float | None, labels: Mapping[str, str] | None = None) -> None:
        if value is not None:
            self._family(name, "gauge", help_text).append(f"{self.prefix}{name}{_labels(labels)} {_number(value)}")

    def counter(self, name: str, help_text: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        """``name`` without ``_total``; the sample gets it, as the format's counters do."""
        self._family(name, "counter", help_text).append(
            f"{self.prefix}{name}_total{_labels(labels)} {_number(value)}")

    def histogram(self, name: str, help_text: str, hist: dict | None,
                  labels: Mapping[str, str] | None = None) -> None:
        if not hist:
            return
        lines = self._family(name, "histogram", help_text)
        cumulative = 0
        for bound, n in zip(list(hist["le"]) + [math.inf], hist["counts"]):
            cumulative += n
            lines.append(f"{self.prefix}{name}_bucket{_labels(labels, ('le', _number(float(bound))))} {cumulative}")
        lines.append(f"{self.prefix}{name}_sum{_labels(labels)} {_number(float(hist['sum']))}")
        lines.append(f"{self.prefix}{name}_count{_labels(labels)} {hist['count']}")

    def text(self) -> str:
        out = []
        for full, (kind, help_text, lines) in self._families.items():
            if not lines:
                continue
            out.append(f"# HELP {full} {help_text.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
            out.append(f"# TYPE {full} {kind}")
            out.extend(lines)
        return "\n".join(out) + "\n"
