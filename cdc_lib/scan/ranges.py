"""Token ranges of the Murmur3 ring for a parallel scan (the chunks of a chunked snapshot).

A range is ``(start, end]`` (``WHERE token(pk) > start AND token(pk) <= end``); together the ranges of
``split_ring`` cover the whole ring ``(MIN_TOKEN, MAX_TOKEN]`` exactly once (no key has ``MIN_TOKEN``: Cassandra
keeps it for the ring's start). They are cut at the nodes' own tokens, so each range lies within one node's range
and its coordinator reads from one replica set, and each node range is cut into parts in proportion to its width.
"""
from __future__ import annotations

from dataclasses import dataclass

from cdc_lib.cql.tokens import MAX_TOKEN, MIN_TOKEN


@dataclass(frozen=True)
class TokenRange:
    start: int      # exclusive
    end: int        # inclusive

    def __post_init__(self):
        if not MIN_TOKEN <= self.start < self.end <= MAX_TOKEN:
            raise ValueError(f"bad token range ({self.start}, {self.end}]")

    def __contains__(self, token: int) -> bool:
        return self.start < token <= self.end


def split_ring(ring_tokens, splits: int) -> list:
    """About ``splits`` ranges (at least one per node range) covering the ring, in token order.

    ``ring_tokens``: the tokens the nodes own (any order; empty: one node range, the whole ring).
    """
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    cuts = sorted({int(t) for t in ring_tokens if MIN_TOKEN < int(t) < MAX_TOKEN})
    bounds = [MIN_TOKEN] + cuts + [MAX_TOKEN]
    whole = MAX_TOKEN - MIN_TOKEN
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        parts = max(1, round(splits * (hi - lo) / whole))
        edges = [lo + (hi - lo) * k // parts for k in range(parts + 1)]
        out += [TokenRange(a, b) for a, b in zip(edges, edges[1:]) if a < b]
    return out
