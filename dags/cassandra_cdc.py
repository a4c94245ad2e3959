"""Airflow 3 DAG ``cassandra_cdc``: claim new segments -> Spark job -> publish to Kafka -> archive.

Only wiring: every task calls a step of ``cdc_lib.pipeline`` (read its docstring for what each step does and
why each is idempotent). Settings (``cdc_lib.pipeline.airflow``): a run's conf > the Airflow connections and the
Variable ``cassandra_cdc_settings`` > ``CASSANDRA_CDC_*`` environment > the settings file (``CASSANDRA_CDC_CONFIG``)
> defaults; the params are empty unless a manual trigger fills them. The schedule is the ``schedule`` setting
(every minute by default), read when this file is parsed. ``claim`` fails at once when the settings cannot work
and warns when agents ship nothing; a run that finds nothing new skips transform, publish and archive
(short-circuit). ``follow`` then (after archive, or after a claim that found nothing), in a scheduled run, keeps
taking batches in its own process until shortly before the next run is due (``follow_schedule``,
``steps.run_for``), so that a segment uploaded during the minute waits seconds, not for the next run.
"""
from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import dag, task

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:          # cdc_lib / spark_jobs from the repository when not pip-installed
    sys.path.insert(0, str(REPO))

from cdc_lib.pipeline.airflow import airflow_params, dag_schedules  # noqa: E402
from cdc_lib.pipeline.airflow import config_from_airflow_context as _config


@dag(
    dag_id="cassandra_cdc",
    schedule=dag_schedules()[0],
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=airflow_params(),
    default_args={"retries": 3, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True},
    tags=["cassandra", "cdc"],
    doc_md=__doc__,
)
def cassandra_cdc():
    @task.short_circuit(ignore_downstream_trigger_rules=False)     # skips transform, publish, archive; not follow
    def claim() -> dict:
        from airflow.sdk import get_current_context

        from cdc_lib.pipeline.steps import claim as claim_step
        batch = claim_step(_config(show=True), get_current_context()["run_id"])
        if batch.empty:
            print("nothing to do: no new segments")
            return {}                                 # falsy: skip the rest of the run
        return batch.summary()

    @task
    def transform(batch: dict) -> dict:
        from cdc_lib.pipeline.steps import transform as transform_step
        return transform_step(_config(), batch).summary()

    @task
    def publish(batch: dict) -> dict:
        from cdc_lib.pipeline.steps import publish as publish_step
        return publish_step(_config(), batch).summary()

    @task
    def archive(batch: dict) -> dict:
        from cdc_lib.pipeline.steps import archive as archive_step
        return archive_step(_config(), batch).summary()

    @task(trigger_rule="none_failed")
    def follow() -> dict:
        from cdc_lib.pipeline.follow import follow_schedule_from_airflow_context
        return follow_schedule_from_airflow_context(_config())

    archive(publish(transform(claim()))) >> follow()


cassandra_cdc()
