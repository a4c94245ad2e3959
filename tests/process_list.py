"""What every user of the machine can read while a test runs: the process list (``ps -eww -o args``: without ``ww`` ps cuts lines at 80 columns when its output is no terminal), sampled.

``with ProcessList() as ps: ...`` samples the command lines of every process every ``interval`` seconds in a
thread until the block ends; ``ps.lines_with(secret)`` are the command lines that held it. Tests that must keep
secrets off command lines also run a process that *does* show its secret (a positive control), so a sampler that
saw nothing cannot pass for one that looked.
"""
from __future__ import annotations

import subprocess
import threading


class ProcessList:
    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.lines: set[str] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ps-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
            self.lines.update(out.splitlines()[1:])
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> "ProcessList":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def lines_with(self, secret: str) -> list[str]:
        return sorted(line for line in self.lines if secret in line)
