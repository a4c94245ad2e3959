"""Airflow 3 DAG ``cassandra_cdc``: claim new segments -> Spark job -> publish to Kafka -> archive.

Only wiring: every task calls a step of ``cdc_lib.pipeline`` (read its docstring for what each step does and
why each is idempotent). Settings are DAG params (defaults = the embedded setup; override with
``--conf``/the trigger form); Kafka, S3 and Cassandra come from the Airflow connections named by the
``*_conn_id`` params when those exist. A run that finds nothing to do stops after ``claim`` (short-circuit).
"""
from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import dag, task

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:          # cdc_lib / spark_jobs from the repository when not pip-installed
    sys.path.insert(0, str(REPO))

from cdc_lib.pipeline.airflow import airflow_params  # noqa: E402
from cdc_lib.pipeline.airflow import config_from_airflow_context as _config

SCHEDULE = os.environ.get("CASSANDRA_CDC_SCHEDULE", "* * * * *")


@dag(
    dag_id="cassandra_cdc",
    schedule=SCHEDULE,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=airflow_params(),
    default_args={"retries": 3, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True},
    tags=["cassandra", "cdc"],
    doc_md=__doc__,
)
def cassandra_cdc():
    @task.short_circuit
    def claim() -> dict:
        from airflow.sdk import get_current_context

        from cdc_lib.pipeline.steps import claim as claim_step
        batch = claim_step(_config(), get_current_context()["run_id"])
        if batch.empty:
            print("nothing to do: no new segments")
            return {}                                 # falsy: skip the rest of the run
        return batch.to_dict()

    @task
    def transform(batch: dict) -> dict:
        from cdc_lib.pipeline.steps import transform as transform_step
        return transform_step(_config(), batch).to_dict()

    @task
    def publish(batch: dict) -> dict:
        from cdc_lib.pipeline.steps import publish as publish_step
        return publish_step(_config(), batch).to_dict()

    @task
    def archive(batch: dict) -> dict:
        from cdc_lib.pipeline.steps import archive as archive_step
        done = archive_step(_config(), batch)
        print("batch summary:", done.steps)
        return done.to_dict()

    archive(publish(transform(claim())))


cassandra_cdc()
