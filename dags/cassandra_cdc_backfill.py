"""Airflow 3 DAG ``cassandra_cdc_backfill`` (manual): load what exists, rebuild what was lost, re-emit what a
consumer missed.

The run asks the pipeline for a batch of its own in the one batch sequence (``cdc_lib.pipeline.backfill``); the
next ``cassandra_cdc`` runs claim it before new segments and publish it exactly once like any batch, so consumers
see it between two stream batches, without a gap or an overlap. Param ``mode``:

* ``snapshot`` (default): an ``op = 'r'`` event for every visible row of the Delta state tables, as the previous
  batch committed them;
* ``cql``: load what live tables hold (rows written before CDC was enabled) through a parallel CQL scan by token
  ranges (``tables``, ``consistency`` default QUORUM, ``splits``, ``page_size``, ``splits_per_batch``,
  ``parallelism``), as ``op = 'r'`` events and state, before any new segment;
* ``sstables``: the same from the SSTable snapshot ``tag`` the nodes' agents shipped (``cassandra-cdc agent
  snapshot``; ``tables``, ``nodes``, ``sstables_per_batch``);
* ``replay``: archived batches again (``batches_from``/``batches_to`` or ``since``/``until``), ``purpose``
  ``rebuild`` (their segments through the transform again: a lost or damaged state table is rebuilt, the events
  say what the repair changed) or ``reemit`` (their events published again, unchanged, with their ids).

Settings as for ``cassandra_cdc`` (``cdc_lib.pipeline.airflow``).
"""
from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

from airflow.sdk import dag, task

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cdc_lib.pipeline.backfill import backfill_params  # noqa: E402


@dag(
    dag_id="cassandra_cdc_backfill",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=backfill_params(),
    tags=["cassandra", "cdc", "backfill"],
    doc_md=__doc__,
)
def cassandra_cdc_backfill():
    @task
    def request_backfill() -> dict:
        from cdc_lib.pipeline.backfill import backfill_from_airflow_context
        return backfill_from_airflow_context()

    request_backfill()


cassandra_cdc_backfill()
