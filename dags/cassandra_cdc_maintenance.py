"""Airflow 3 DAG ``cassandra_cdc_maintenance``: TTL expiry sweep and Delta table upkeep (tombstone purge, outbox
retention, compaction, vacuum).

The sweep is requested here and performed by the next ``cassandra_cdc`` run as a batch without segments, so
it is serialized with the other batches (``cassandra_cdc`` has ``max_active_runs=1``) and its expiry events
are published exactly once like every other event (``cdc_lib.pipeline.request_sweep``). Settings as for
``cassandra_cdc`` (``cdc_lib.pipeline.airflow``); the schedule is the ``maintenance_schedule`` setting (hourly by
default). ``delta_upkeep`` (``cdc_lib.pipeline.maintenance``) purges tombstones after each table's
``gc_grace_seconds``, deletes the outbox batches older than ``outbox_retention_hours``, compacts, and vacuums what
is older than ``vacuum_retention_hours``, holding the store's Delta writer lock so it never races a batch.
"""
from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

from airflow.sdk import dag, task

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cdc_lib.pipeline.airflow import airflow_params, dag_schedules  # noqa: E402
from cdc_lib.pipeline.airflow import config_from_airflow_context as _config


@dag(
    dag_id="cassandra_cdc_maintenance",
    schedule=dag_schedules()[1],
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=airflow_params(),
    tags=["cassandra", "cdc", "maintenance"],
    doc_md=__doc__,
)
def cassandra_cdc_maintenance():
    @task
    def expiry_sweep() -> dict:
        from cdc_lib.pipeline.maintenance import request_sweep
        return request_sweep(_config(show=True))

    @task
    def delta_upkeep() -> dict:
        from cdc_lib.pipeline.maintenance import delta_upkeep as upkeep
        return upkeep(_config())

    expiry_sweep() >> delta_upkeep()


cassandra_cdc_maintenance()
