"""Exit statuses of the ``cassandra-cdc`` command, one scheme for every subcommand (inspect, agent, demo, status,
metrics).

``2`` means damaged input, as it did from the start, so scripts can tell "the files are damaged" from "the command
was used wrongly" (``1``, which argparse would otherwise report as ``2``) and from "it could not finish" (``3``).
"""
from __future__ import annotations

import argparse
import sys

OK = 0          # done; nothing damaged
USAGE = 1       # usage or configuration error (a flag, a setting, an input file that cannot be used); nothing was done
DAMAGED = 2     # damaged input: everything readable was read and reported, and so was the damage
FAILED = 3      # could not finish: e.g. agent --once could not ship a segment, a demo step failed
INTERRUPTED = 130

EPILOG = ("exit status: 0 done, nothing damaged; 1 usage or configuration error (nothing was read or shipped); "
          "2 damaged input (everything readable was read; the damage is reported); 3 could not finish "
          "(e.g. a segment could not be shipped)")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with this command's exit status for usage errors (``USAGE``, not argparse's 2) and the exit
    statuses in every ``--help``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EPILOG)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"{self.prog}: error: {message}\n")
