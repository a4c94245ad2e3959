"""Tombstone purge after ``gc_grace_seconds``: what Cassandra's compaction drops, dropped from the row state.

The state engine (``state.reconcile``) keeps every tombstone, so that a late write it shadows stays shadowed. Kept
for ever, they make the state of a table with churn (the same keys inserted and deleted) grow without bound.
Cassandra bounds it by purging at compaction what is older than the table's ``gc_grace_seconds``; this module
applies the same rules to a ``PartitionState`` (``PurgeFunction``, ``Row.purge``, ``AbstractCell.purge``,
``DeletionPurger`` in Cassandra 4.0/5.0), with ``gc_before = now - gc_grace_seconds``:

* a partition deletion, range tombstone, row deletion, shadowable row deletion, collection (complex) deletion or
  cell tombstone goes once its local deletion time is ``< gc_before``;
* an expired cell goes once its expiry minus its TTL is ``< gc_before`` (Cassandra turns an expired cell into a
  tombstone dated when it was written, so the TTL counts towards the grace period); an
  expired row marker (and the views' "expired liveness" marker) once its expiry is ``< gc_before``;
* data the engine keeps under a deletion that can still be lifted goes with that deletion, as Cassandra's merges
  have already dropped it by then: the cells under a shadowable deletion no newer row marker lifted, and the
  shards of a counter whose tombstone goes (a counter tombstone hides every shard).
* the cells and collection deletions of a dropped column written at or before the drop
  (``TableMetadata.dropped``) go at once, whatever ``gc_grace_seconds``: Cassandra 5.0 leaves them out whenever it
  reads an SSTable (``UnfilteredSerializer.readSimpleColumn``/``readComplexColumn`` through
  ``DeserializationHelper.isDropped``/``isDroppedComplexDeletion``), so its next compaction does not write them;
  a row that only they kept goes with them (``SELECT *`` shows no such row: no marker, no live cell).

What is purged was invisible (a tombstone shows nothing; everything a deletion covers is already gone, see
``state.reconcile``), so a purge changes no visible row and emits no event. The consequence is Cassandra's own: a
write older than a purged tombstone that arrives afterwards is no longer shadowed, and the row comes back.

One more rule keeps the published history exact: an expired cell or row marker is only purged once the stored rows
already show it expired (its expiry is before ``reflected_before``, the partition's next expiry as the last batch
stored it), so the batch that emits its expiry event still finds it.
"""
from __future__ import annotations

from typing import Optional

from cdc_lib.commitlog.model import EXPIRED_LIVENESS_TTL, NO_DELETION_TIME

from .reconcile import PartitionState, RowState, _info
from .reconcile import _purge_row as _drop_covered     # drops what a deletion at a timestamp covers


def purge_partition(table, part: PartitionState, now: int, *, reflected_before: Optional[int] = None) -> bool:
    """Drop from ``part`` (in place) what Cassandra would purge at ``now`` under ``table.gc_grace_seconds``.

    ``reflected_before``: expiries at or after it are not yet shown by the stored rows (None: all are). ``part``
    may hold only some of a partition's records (every rule is local to one record). Returns whether anything
    was dropped.
    """
    gc_before = now - table.gc_grace_seconds
    info = _info(table)
    counters, drops = info.counter, info.drop_time
    changed = False
    if part.deletion is not None and part.deletion[1] < gc_before:
        part.deletion = None
        changed = True
    gone = [rk for rk, d in part.range_tombstones.items() if d[1] < gc_before]
    for rk in gone:
        del part.range_tombstones[rk]
    changed = bool(gone) or changed
    if _purge_row(part.static, now, gc_before, reflected_before, counters, drops):
        changed = True
    for ck in list(part.rows):
        row = part.rows[ck]
        if _purge_row(row, now, gc_before, reflected_before, counters, drops):
            changed = True
            if row.is_empty():
                del part.rows[ck]
    return changed


def _purge_row(row: RowState, now: int, gc_before: int, reflected_before: Optional[int], counters,
               drops: dict) -> bool:
    changed = bool(drops) and _purge_dropped(row, drops)

    def expired(expiry: int) -> bool:
        return now >= expiry and (reflected_before is None or expiry < reflected_before)

    if row.deletion is not None and row.deletion[1] < gc_before:
        row.deletion = None
        changed = True
    s = row.shadowable
    if s is not None and s[1] < gc_before:
        if row.liveness is None or row.liveness[0] <= s[0]:
            _drop_covered(row, s[0])          # still in force: what it hides goes with it
        row.shadowable = None
        changed = True
    lv = row.liveness
    if lv is not None and lv[1] and lv[2] < gc_before and (lv[1] == EXPIRED_LIVENESS_TTL or expired(lv[2])):
        row.liveness = None
        changed = True
    for col in [c for c, cell in row.cells.items() if _cell_purgeable(cell, gc_before, expired)]:
        del row.cells[col]
        if col in counters and col in row.complex:
            del row.complex[col]              # the counter's shards, which its tombstone hid
        changed = True
    for col in list(row.complex):
        entry = row.complex[col]
        if entry[0] is not None and entry[0][1] < gc_before:
            entry[0] = None
            changed = True
        cells = entry[1]
        gone = [p for p, cell in cells.items() if _cell_purgeable(cell, gc_before, expired)]
        for p in gone:
            del cells[p]
        changed = bool(gone) or changed
        if entry[0] is None and not cells:
            del row.complex[col]
    return changed


def _purge_dropped(row: RowState, drops: dict) -> bool:
    """Drop the cells and collection deletions of dropped columns (``drops``: {column: drop time, µs}) written at or
    before the drop (``DeserializationHelper.isDropped``: ``cell.timestamp() <= droppedTime``)."""
    changed = False
    for col in [c for c, cell in row.cells.items() if c in drops and cell[0] <= drops[c]]:
        del row.cells[col]
        changed = True
    for col in [c for c in row.complex if c in drops]:
        dropped_at = drops[col]
        entry = row.complex[col]
        if entry[0] is not None and entry[0][0] <= dropped_at:
            entry[0] = None
            changed = True
        gone = [p for p, cell in entry[1].items() if cell[0] <= dropped_at]
        for p in gone:
            del entry[1][p]
        changed = bool(gone) or changed
        if entry[0] is None and not entry[1]:
            del row.complex[col]
    return changed


def _cell_purgeable(cell: tuple, gc_before: int, expired) -> bool:
    """A cell tombstone older than ``gc_before``, or an expired cell written before it.

    Cassandra 5.0's ``AbstractCell.purge`` (org.apache.cassandra.db.rows) purges an expired cell whose expiry is
    before ``gc_before``, or else makes it ``BufferCell.tombstone(..., localDeletionTime() - ttl(), ...)`` and
    purges that tombstone when *its* time is: expiry minus TTL, the moment it was written, the earlier of the two.
    (Checked on a real node: ``test_real_cluster``'s expired-cell test.)
    """
    ts, ttl, ldt, tomb, _ = cell
    if tomb:
        return ldt < gc_before
    return bool(ttl) and expired(ldt) and ldt - ttl < gc_before


#: ``oldest_deletion_time`` of a record holding data of a dropped column: purgeable at any time.
DROPPED_DATA = 0


def oldest_deletion_time(record: dict, drops: Optional[dict] = None) -> int:
    """The earliest time (s) from which ``gc_grace_seconds`` counts for anything in one stored record
    (``state.reconcile.STATE_SCHEMA`` fields): a deletion's or tombstone's local deletion time, an expiring row
    marker's expiry, an expiring cell's expiry minus its TTL; ``NO_DELETION_TIME`` when the record has none, and
    ``DROPPED_DATA`` when it holds a cell or collection deletion that a drop in ``drops`` ({column: drop time,
    µs}: ``TableMetadata.dropped``) hides.

    Nothing in the record can be purged before this time plus ``gc_grace_seconds``: a store keeps it per record so
    that a purge reads only the records that may have something to purge.
    """
    if drops and holds_dropped_data(record, drops):
        return DROPPED_DATA
    times = [t for t in (record.get("deletion_ldt"), record.get("shadowable_ldt")) if t is not None]
    if record.get("liveness_ttl"):
        times.append(record["liveness_ldt"])
    for c in record.get("cells") or ():
        if c["tombstone"]:
            times.append(c["ldt"])
        elif c["ttl"]:
            times.append(c["ldt"] - c["ttl"])
    times += [d["ldt"] for d in record.get("complex_deletions") or ()]
    times += [rt["ldt"] for rt in record.get("range_tombstones") or ()]
    return min(times, default=NO_DELETION_TIME)


def holds_dropped_data(record: dict, drops: dict) -> bool:
    """Whether a stored record holds a cell or collection deletion of a dropped column (``drops``: {column: drop
    time, µs}) written at or before the drop."""
    for c in record.get("cells") or ():
        if c["column"] in drops and c["ts"] <= drops[c["column"]]:
            return True
    return any(d["column"] in drops and d["ts"] <= drops[d["column"]] for d in record.get("complex_deletions") or ())


def can_be_visible(record: dict) -> bool:
    """Whether anything in a stored record could make its row visible at some time: a row marker or a cell that is
    not a tombstone."""
    return record.get("liveness_ts") is not None or not all(c["tombstone"] for c in record.get("cells") or ())
