"""Cell log -> exact row state and change events.

``reconcile`` is Cassandra's last-write-wins as a join-semilattice over cell-log records (``PartitionState``),
``events`` derives what consumers see when a row's visible state changes, ``batch`` runs one batch of both per
partition (replica copies dropped, partitions in publish order), ``purge`` drops what Cassandra's compaction would
after ``gc_grace_seconds``.
"""
from .batch import process_cell_log, process_partition
from .events import apply_batch, expiry_sweep, snapshot_events
from .reconcile import PartitionState, apply_records

__all__ = ["PartitionState", "apply_batch", "apply_records", "expiry_sweep", "process_cell_log",
           "process_partition", "snapshot_events"]
