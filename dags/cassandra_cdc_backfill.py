"""Airflow 3 DAG ``cassandra_cdc_backfill`` (manual): snapshot the current data as ``op = 'r'`` events.

The snapshot is a batch of its own in the pipeline's batch sequence (``cdc_lib.pipeline.request_snapshot``):
the next ``cassandra_cdc`` run claims it instead of new segments, writes an 'r' event for every visible row
of the Delta state tables (the state exactly as the previous batch committed it) to the outbox, and publishes
it exactly once like any batch. Every change in segments not yet processed comes in the batches after it, so
consumers see snapshot + stream without a gap or an overlap (see the module docstring of ``cdc_lib.pipeline``).
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

from cdc_lib.pipeline.airflow import airflow_params  # noqa: E402
from cdc_lib.pipeline.airflow import config_from_airflow_context as _config


@dag(
    dag_id="cassandra_cdc_backfill",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=airflow_params(),
    tags=["cassandra", "cdc", "backfill"],
    doc_md=__doc__,
)
def cassandra_cdc_backfill():
    @task
    def request_snapshot() -> dict:
        from cdc_lib.pipeline.backfill import request_snapshot as request
        return request(_config(show=True))

    request_snapshot()


cassandra_cdc_backfill()
