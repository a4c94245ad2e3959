"""Watching the node's CDC space: Cassandra rejects writes to CDC tables once ``cdc_raw`` holds
``cdc_total_space``, so the agent warns (with numbers, rate-limited) before that and when ``cdc_raw`` fills
faster than it ships."""
from __future__ import annotations

import logging
import shutil
from collections import deque
from pathlib import Path

log = logging.getLogger("cassandra_cdc.agent")

MiB = 1024 * 1024


def default_cdc_total_space(cdc_raw: Path) -> int:
    """Cassandra's default: min(4096 MiB, total space of the cdc_raw volume / 8), in whole MiB."""
    total_mib = shutil.disk_usage(cdc_raw).total // MiB
    return min(4096, total_mib // 8) * MiB


class SpaceMonitor:
    """Warns when cdc_raw is too full, or fills faster than the agent ships (with the numbers, rate-limited)."""

    def __init__(self, total_space: int, *, warn_fraction: float = 0.5, window: float = 300.0,
                 repeat_every: float = 60.0):
        self.total_space = total_space
        self.warn_fraction = warn_fraction
        self.window = window
        self.repeat_every = repeat_every
        self._samples: deque[tuple[float, int, int]] = deque()
        self._last_warned: dict[str, float] = {}
        self.arrival_rate = 0.0
        self.ship_rate = 0.0

    def observe(self, now: float, used_bytes: int, shipped_total: int) -> list[str]:
        """Record a sample; return (and log) the warnings due now."""
        self._samples.append((now, used_bytes, shipped_total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        warnings: list[str] = []
        fraction = used_bytes / self.total_space
        if fraction > self.warn_fraction:
            warnings.append(self._maybe(
                "usage", now,
                f"cdc_raw holds {used_bytes / MiB:.1f} MiB = {fraction:.0%} of the CDC space "
                f"({self.total_space / MiB:.0f} MiB); Cassandra rejects writes to CDC tables when it is full"))
        t0, used0, shipped0 = self._samples[0]
        dt = now - t0
        if dt > 0:
            shipped = shipped_total - shipped0
            arrived = (used_bytes - used0) + shipped
            self.arrival_rate, self.ship_rate = arrived / dt, shipped / dt
            if dt >= self.window / 2 and self.arrival_rate > self.ship_rate and self._sustained_growth(t0 + dt / 2):
                growth = (used_bytes - used0) / dt
                left = max(0, self.total_space - used_bytes)
                warnings.append(self._maybe(
                    "rate", now,
                    f"cdc_raw grows faster than it ships: {self.arrival_rate / MiB:.2f} MiB/s arrive, "
                    f"{self.ship_rate / MiB:.2f} MiB/s shipped over the last {dt:.0f} s; "
                    f"{left / MiB:.1f} MiB left, full in about {left / growth:.0f} s at this rate"))
        out = [w for w in warnings if w]
        for w in out:
            log.warning(w)
        return out

    def _sustained_growth(self, middle: float) -> bool:
        """Usage in the later half of the window stayed above its peak in the earlier half.

        On 4.0+ usage jumps by a whole segment when one is created (hard link) and drops when one is shipped;
        comparing two single samples would warn on that saw-tooth.
        """
        early = [u for t, u, _ in self._samples if t <= middle]
        late = [u for t, u, _ in self._samples if t > middle]
        return bool(early and late) and min(late) > max(early)

    def _maybe(self, kind: str, now: float, message: str) -> str:
        last = self._last_warned.get(kind)
        if last is not None and now - last < self.repeat_every:
            return ""
        self._last_warned[kind] = now
        return message
