"""When a scan read each part of a table: the horizon below which the commit log has nothing new for the state.

A scan shows live data, not tombstones. The commit log that follows a backfill still holds mutations older than
the scan: those from before CDC was enabled that share a segment with CDC writes, and those made between enabling
CDC and the moment the scan read their partition. Their effects are already in what the scan read, but merged
again after it they can bring back, for a moment, what a later deletion (also in that commit log) removed: a set
element written, then removed, both before the scan, would reappear and disappear again. Merging them keeps the
state exact; their *events* would show rows going back in time.

So each token range remembers, page by page, when its rows were read: ``pages`` is ``[(last token of the page,
microseconds when the page was requested)]``, the last page extended to the range's end, at most 64 entries per
range (``reader.coarse_pages`` merges pages under their first page's time). A partition's horizon is the time of the
first page that could hold it (a wide partition's first page). The state engine merges a
commit-log mutation older than its partition's horizon without an event (``state.events.apply_batch``,
``quiet_before``). A write still in flight while its partition was read (its write time a moment before the read,
applied a moment after) is merged into the state without an event: the row's next event shows it. A merged older
write can also bring back a value whose deletion is newer than the horizon but was seen by the scan (a page is
timed when asked for, and read a moment later): the row's next event in the batch starts from the row as the
events showed it, so that deletion makes none.
"""
from __future__ import annotations

import bisect
from typing import Optional


class Horizon:
    """The read times of one table's scanned token ranges (``(start, end]`` each, with their ``pages``)."""

    def __init__(self, ranges=()):
        self.ranges = sorted((int(s), int(e), [(int(t), int(at)) for t, at in pages]) for s, e, pages in ranges)
        self._starts = [r[0] for r in self.ranges]

    def at(self, token: int) -> Optional[int]:
        """The horizon (microseconds) of a partition with ``token``; None when no scan read its range."""
        i = bisect.bisect_left(self._starts, token) - 1          # the last range starting below the token
        if i < 0:
            return None
        start, end, pages = self.ranges[i]
        if not start < token <= end:
            return None
        j = bisect.bisect_left(pages, (token, -(1 << 63)))
        return pages[j][1] if j < len(pages) else pages[-1][1]

    def merged(self, start: int, end: int, pages: list) -> "Horizon":
        """This horizon with range ``(start, end]`` read as ``pages`` (replacing what it knew of those tokens)."""
        kept = [r for r in self.ranges if r[1] <= start or r[0] >= end]
        return Horizon(kept + [(start, end, pages)])

    def to_json(self) -> list:
        return [[s, e, [list(p) for p in pages]] for s, e, pages in self.ranges]

    @classmethod
    def from_json(cls, data) -> "Horizon":
        return cls(data or ())
