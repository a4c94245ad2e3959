"""Differential runs of ``read_cell_log``: each reader against the reference decoder, on the same input.

Readers (``PATHS``):

* ``python``: the pure-Python reader (``CASSANDRA_CDC_NATIVE=0``: ``SegmentReader`` + ``celllog.fast`` +
  the reference for what the fast path does not decode);
* ``native``: the compiled reader (``CASSANDRA_CDC_NATIVE=1``, the ``cdc_native`` extension);

and the truth they are compared with, ``reference``: the pure-Python reader with the fast path switched off, so
that every entry goes through ``commitlog.mutation.decode_mutation`` + ``celllog.records.update_records``.

What is compared: every batch (row count, then every column's values, then ``RecordBatch.equals``), every
damage record (segment, position, kind, reason, bytes, physical position) in order and interleaved with the
batches, the ``stats`` counters, and the exception (type and message) when the read raises.
"""
from __future__ import annotations

import contextlib
import logging
import os
from unittest import mock

import pytest

from cdc_lib.celllog import native, read_cell_log
from cdc_lib.celllog.fast import FastCellLog

PATHS = ("python", "native")


def require(path: str) -> None:
    """Skip a test of the native reader when ``cdc_native`` is not installed (unless it is required:
    ``CASSANDRA_CDC_NATIVE=1`` makes a missing module a failure)."""
    if path == "native" and not native.native_available() and os.environ.get(native.ENV) != "1":
        pytest.skip("cdc_native is not installed (scripts/setup.sh builds it)")


def _damage_key(d):
    return ("damage", d.segment, d.position, d.kind, d.reason, bytes(d.data), d.physical_position)


@contextlib.contextmanager
def _env(value: str):
    old = os.environ.get(native.ENV)
    os.environ[native.ENV] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[native.ENV]
        else:
            os.environ[native.ENV] = old


@contextlib.contextmanager
def _reference_only():
    def refuse(self, *a, **k):
        raise ValueError("reference only")
    quiet = logging.getLogger("cdc_lib.celllog.reader")    # warns of every entry the fast path leaves
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with mock.patch.object(FastCellLog, "add_entry", refuse):
            yield
    finally:
        quiet.setLevel(level)


def run(path: str, sources, **kw) -> dict:
    """Everything observable of one ``read_cell_log`` on ``path`` (python, native or reference)."""
    events, stats, batches = [], {}, []
    exc = None
    ctx = _reference_only() if path == "reference" else contextlib.nullcontext()
    with _env("1" if path == "native" else "0"), ctx:
        try:
            for b in read_cell_log(sources, on_damage=lambda d: events.append(_damage_key(d)), stats=stats, **kw):
                events.append(("batch", b.num_rows))
                batches.append(b)
        except Exception as e:  # noqa: BLE001 - compared between the readers
            exc = (type(e).__name__, str(e))
    return {"events": events, "batches": batches, "stats": stats, "exc": exc}


def diff(a: dict, b: dict) -> str | None:
    """None when identical, else a description of the first difference."""
    if a["exc"] != b["exc"]:
        return f"exception {a['exc']} != {b['exc']}"
    if a["events"] != b["events"]:
        for i, (x, y) in enumerate(zip(a["events"], b["events"])):
            if x != y:
                return f"event {i}: {str(x)[:300]} != {str(y)[:300]}"
        return f"{len(a['events'])} events != {len(b['events'])}"
    if a["stats"] != b["stats"]:
        return f"stats {a['stats']} != {b['stats']}"
    for bi, (x, y) in enumerate(zip(a["batches"], b["batches"])):
        if x.schema != y.schema:
            return f"batch {bi}: schema differs"
        for name in x.schema.names:
            xs, ys = x.column(name).to_pylist(), y.column(name).to_pylist()
            if xs != ys:
                i = next(i for i in range(len(xs)) if xs[i] != ys[i])
                return f"batch {bi} column {name} row {i}: {xs[i]!r} != {ys[i]!r}"
        if not x.equals(y):
            return f"batch {bi}: RecordBatch.equals is False"
    return None


def check(path: str, sources, **kw) -> dict:
    """``path`` reads ``sources`` exactly as the reference does; returns the reference's result."""
    require(path)
    ref = run("reference", sources, **kw)
    got = run(path, sources, **kw)
    d = diff(ref, got)
    assert d is None, f"the {path} reader differs from the reference: {d}"
    return ref


def examples(n: int) -> int:
    """Hypothesis example counts, scaled by ``CELLLOG_FUZZ_SCALE`` (e.g. 20 for a long fuzzing run)."""
    return max(1, int(n * float(os.environ.get("CELLLOG_FUZZ_SCALE", "1"))))


@pytest.fixture(params=PATHS)
def reader(request) -> str:
    """Each reader in turn (``PATHS``); the native one is skipped when ``cdc_native`` is not installed."""
    require(request.param)
    return request.param
