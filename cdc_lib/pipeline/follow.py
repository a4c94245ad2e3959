"""A scheduled run of ``cassandra_cdc`` keeps taking batches until shortly before the next run is due: the
``follow`` task (``follow_schedule``, ``follow_poll_s``, ``follow_margin_s``; the loop is ``steps.run_for``).

With one batch per run, a segment uploaded just after a run's claim would wait for the next run (up to the
schedule's interval, plus that run's start and batch); following, it waits for the next poll.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

from cdc_lib.settings import PipelineConfig

from .airflow import schedule_value
from .steps import run_for

log = logging.getLogger("cassandra_cdc.pipeline")


def next_run_due(schedule: str | None, run_after: datetime) -> datetime | None:
    """When the scheduled run after the one due at ``run_after`` is due, by the ``schedule`` setting as the DAG file
    reads it, computed by Airflow's own trigger timetables (a cron expression in Airflow's default timezone); None
    for manual runs only, ``@once`` and ``@continuous``."""
    value = schedule_value(schedule)
    if value is None or value in ("@once", "@continuous"):
        return None
    import pendulum
    from airflow.settings import TIMEZONE
    from airflow.timetables.base import DataInterval, TimeRestriction
    from airflow.timetables.trigger import CronTriggerTimetable, DeltaTriggerTimetable
    timetable = (DeltaTriggerTimetable(value) if isinstance(value, timedelta)
                 else CronTriggerTimetable(value, timezone=TIMEZONE))
    run_after = pendulum.instance(run_after)       # what the timetables compute with
    info = timetable.next_dagrun_info(last_automated_data_interval=DataInterval(run_after, run_after),
                                      restriction=TimeRestriction(earliest=None, latest=None, catchup=True))
    return info.run_after if info is not None else None


def follow_seconds(config: PipelineConfig, run_after: datetime, now: datetime) -> float:
    """How long a run due at ``run_after`` keeps taking batches from ``now``: until ``follow_margin_s`` before the
    next run is due (``follow_schedule``); 0 when it is off or no run follows."""
    due = next_run_due(config.schedule, run_after) if config.follow_schedule else None
    if due is None:
        return 0.0
    return max(0.0, (due - now).total_seconds() - config.follow_margin_s)


def follow_schedule_from_airflow_context(config: PipelineConfig) -> dict:
    """The ``follow`` task: in a scheduled run, ``steps.run_for`` until shortly before the next run of this DAG is
    due; returns what it did (the task's XCom): batches, segments, events, and the window's seconds. A manual run
    (a trigger, ``airflow dags test``) ends after its batch: whoever asked for one run expects it to end, and the
    schedule keeps running beside it."""
    from airflow.sdk import get_current_context

    run = get_current_context()["dag_run"]
    now = datetime.now(timezone.utc)
    scheduled = str(getattr(run.run_type, "value", run.run_type)) == "scheduled"
    seconds = follow_seconds(config, run.run_after or now, now) if scheduled else 0.0
    log.info("follow: taking batches for %.1f s (until %.0f s before the next run is due)%s", seconds,
             config.follow_margin_s, "" if scheduled else ": none in a manual run")
    batches = run_for(config, seconds, run.run_id) if seconds else []
    return {"window_s": round(seconds, 1), "batches": [b.batch_id for b in batches],
            "segments": sum(len(b.segments) for b in batches),
            "events": sum(b.steps.get("publish", {}).get("events", 0) for b in batches)}
