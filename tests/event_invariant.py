"""The invariant every change-event stream must satisfy, as one reusable check (``check_events``).

    Every ``before`` and ``after`` image of an event is a state of its row that ``SELECT *`` at consistency ALL
    could have returned at some moment, and for each key the images follow each other in the order those
    states occurred.

So no event may show a row that never existed: not a non-frozen collection emptied by the ``ts - 1`` deletion
of an overwrite, not a delete followed by a create of a row that stayed visible, not half of a batch.

``check_events(events, states, complete=False)``:

* ``events``: ``(key, event)`` pairs in publish order, as a consumer receives them: ``key`` the Kafka key (the
  outbox's ``key_json``), ``event`` the JSON envelope (``op``, ``before``, ``after`` in the JSON forms of
  ``cdc_lib.sinks.avro.to_json_row``). ``engine_events`` turns the engine's event dicts into this form.
* ``states``: the table as ``SELECT *`` showed it at successive moments, in order, each ``{key: row}`` in the
  same JSON forms; ``states[0]`` is the table before the first event. A test with the reference model gets
  them from ``reference_model.published_states``; a test against a real cluster by running ``SELECT *`` after
  each statement (and converting the rows with ``to_json_key``/``to_json_row``).

Per key it checks: ``op`` agrees with the images (``c``: no ``before``; ``d``: no ``after``; ``u``: both;
``r``, a snapshot read, only an ``after``), every event changes something, each ``before`` is the previous
event's ``after``, and the images (first ``before``, then each ``after``) are a subsequence of the key's row
across ``states`` (equal consecutive states counted once): each image existed, and history never goes back.
With ``complete=True`` they must be the key's whole history, no state skipped: what a pipeline that saw every
mutation must publish.
"""
from __future__ import annotations

import json


def _canon(value) -> str | None:
    """One string per row or key, whatever produced it (dict order, tuples vs lists)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def engine_events(table, events) -> list:
    """``state.events`` event dicts -> ``(key, JSON envelope)`` pairs, as the outbox and Kafka carry them."""
    from cdc_lib.sinks.avro import to_json_event, to_json_key
    return [(json.dumps(to_json_key(table, e["key"]), separators=(",", ":"), ensure_ascii=False),
             to_json_event(table, e)) for e in events]


def _history(states, key) -> list:
    out = []
    for s in states:
        row = s.get(key)
        if not out or row != out[-1]:
            out.append(row)
    return out


def check_events(events, states, *, complete: bool = False) -> None:
    """Raise AssertionError naming the key, the event and the row's history when the invariant does not hold."""
    canon_states = [{_canon(k): _canon(r) for k, r in s.items()} for s in states]
    if not canon_states:
        raise AssertionError("no states: states[0] must be the table before the first event")
    by_key: dict = {}
    for i, (key, event) in enumerate(events):
        by_key.setdefault(_canon(key), []).append((i, event))
    keys = set(by_key)
    if complete:
        for s in canon_states:
            keys |= set(s)
    for key in sorted(keys):
        _check_key(key, by_key.get(key, ()), _history(canon_states, key), complete)


def _check_key(key: str, events, history: list, complete: bool) -> None:
    pos = None          # index in history of the last image matched
    for i, event in events:
        op, before, after = event["op"], _canon(event.get("before")), _canon(event.get("after"))

        def fail(why):
            shown = "\n    ".join(str(h) for h in history[:12]) + ("\n    ..." if len(history) > 12 else "")
            raise AssertionError(f"event #{i} ({op}) of key {key}: {why}\n  before: {before}\n  after:  {after}"
                                 f"\n  the row's states, in order:\n    {shown}")
        expected = "c" if before is None else ("d" if after is None else "u")
        if op == "r":
            if before is not None or after is None:
                fail("a snapshot read carries only an after image")
        elif op != expected:
            fail(f"op should be {expected!r}")
        if before == after:
            fail("the event changes nothing")
        if op == "r":
            start = 0 if pos is None else pos
        elif pos is None:
            if before not in history:
                fail("its before image is not a state the row ever had")
            start = history.index(before)
            if complete and start != 0:
                fail("its before image is not the row's first state")
        else:
            if before != history[pos]:
                fail("its before image is not the previous event's after image")
            start = pos
        try:
            found = history.index(after, start if op == "r" else start + 1)
        except ValueError:
            fail("its after image is not a state the row had (after the previous image)")
        if complete and op != "r" and found != start + 1:
            fail(f"states were skipped: {history[start + 1:found]}")
        pos = found
    if complete and (pos or 0) != len(history) - 1:
        raise AssertionError(f"key {key}: {'no event' if pos is None else 'the last event'} reaches its latest "
                             f"state; states not published: {history[(pos or 0) + 1:]}")
