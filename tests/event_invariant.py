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
mutation must publish. ``backfilled=True`` is for a stream that starts with a backfill (rows that existed before
the pipeline saw any change): the states of a key before its first event may go unpublished (the backfill read the
row at some moment; its first event is the ``r`` of that read, or a later change whose ``before`` is a whole state
of the row), and a key with no event at all must end as it started (a row deleted before the backfill read it,
which consumers never saw); from its first event on, the history must still be complete.
"""
from __future__ import annotations

import json


def canon(value) -> str | None:
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


def histories(states) -> dict:
    """{key: the row's states across ``states`` (None: absent), equal consecutive states counted once}, in the
    canonical form (``canon``): what ``check_histories`` takes."""
    canon_states = [{canon(k): canon(r) for k, r in s.items()} for s in states]
    if not canon_states:
        raise AssertionError("no states: states[0] must be the table before the first event")
    keys = set().union(*canon_states)
    return {key: _history(canon_states, key) for key in keys}


def _history(states, key) -> list:
    out = []
    for s in states:
        row = s.get(key)
        if not out or row != out[-1]:
            out.append(row)
    return out


def check_events(events, states, *, complete: bool = False, backfilled: bool = False, may_skip=None) -> None:
    """Raise AssertionError naming the key, the event and the row's history when the invariant does not hold."""
    check_histories(events, histories(states), complete=complete, backfilled=backfilled, may_skip=may_skip)


def check_histories(events, history_of: dict, *, complete: bool = False, backfilled: bool = False,
                    may_skip=None) -> None:
    """``check_events`` with each key's history given (``histories``: a writer that changes a few rows at a time
    can keep them as it goes, instead of whole-table states). ``may_skip(key, j)``: whether state ``j`` of the key's
    history may be missing between two events with ``complete`` (a write a backfill merges without an event:
    ``scan.horizon``); by default none may."""
    by_key: dict = {}
    for i, (key, event) in enumerate(events):
        by_key.setdefault(canon(key), []).append((i, event))
    keys = set(by_key)
    if complete:
        keys |= set(history_of)
    for key in sorted(keys):
        _check_key(key, by_key.get(key, ()), history_of.get(key, [None]), complete, backfilled, may_skip)


def _check_key(key: str, events, history: list, complete: bool, backfilled: bool = False, may_skip=None) -> None:
    pos = None          # index in history of the last image matched
    for i, event in events:
        op, before, after = event["op"], canon(event.get("before")), canon(event.get("after"))

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
            if backfilled:      # the first event may come at any point of the history: where it leads to `after`
                start = next((j for j in range(start, len(history) - 1)
                              if history[j] == before and history[j + 1] == after), start)
            elif complete and start != 0:
                fail("its before image is not the row's first state")
        else:
            if before != history[pos]:
                fail("its before image is not the previous event's after image")
            start = pos
        try:
            found = history.index(after, start if op == "r" else start + 1)
        except ValueError:
            fail("its after image is not a state the row had (after the previous image)")
        if complete and op != "r" and found != start + 1 and not (
                may_skip is not None and all(may_skip(key, j) for j in range(start + 1, found))):
            fail(f"states were skipped: {history[start + 1:found]}")
        pos = found
    if complete and pos is None and backfilled and history[-1] == history[0]:
        return                      # never seen by the backfill, gone before the end: consumers never had it
    if complete and (pos or 0) != len(history) - 1:
        raise AssertionError(f"key {key}: {'no event' if pos is None else 'the last event'} reaches its latest "
                             f"state; states not published: {history[(pos or 0) + 1:]}")
