"""The micro-batch pipeline the Airflow DAGs run: claim -> transform -> publish -> archive, one batch at a time.

``resources`` (what a run is pointed at), ``batches`` (the batch manifest, ledger keys, metrics), ``health``
(settings that cannot work fail at once; warnings when agents ship nothing or ship another cluster), ``steps``
(the four steps), ``follow`` (a scheduled run's further batches until the next run is due), ``backfill`` (the
backfill DAG's modes), ``requests`` (a backfill's work, batch by batch), ``bootstrap`` (loading live tables),
``replay`` and ``maintenance`` (the other DAGs' work), ``airflow`` (where a DAG run's settings come from: conf,
connections, the Variable, environment, file).
The DAG files call only what this package exports.
"""
from cdc_lib.settings import PipelineConfig
from cdc_lib.spark.session import spark_session, stop_spark

from .airflow import SETTINGS_VARIABLE, airflow_params, config_from_airflow_context, dag_schedules, pipeline_config
from .backfill import request_backfill, request_snapshot
from .batches import (FAULT_POINTS, METRICS_KEY, POINTER_KEY, SNAPSHOT_REQUEST_KEY, STATES, SWEEP_REQUEST_KEY, Batch,
                      PipelineError, batch_id_for, read_batch, read_metrics, save_batch)
from .health import ARRIVALS_KEY, arrival_warnings, check_run_settings, open_existing_store
from .maintenance import delta_upkeep, request_sweep
from .resources import delta_root, load_schema, open_store
from .steps import archive, claim, publish, run_for, run_once, run_until_idle, transform

__all__ = ["ARRIVALS_KEY", "FAULT_POINTS", "METRICS_KEY", "POINTER_KEY", "SETTINGS_VARIABLE", "SNAPSHOT_REQUEST_KEY",
           "STATES", "SWEEP_REQUEST_KEY", "Batch", "PipelineConfig", "PipelineError", "airflow_params",
           "archive", "arrival_warnings", "batch_id_for", "check_run_settings", "claim",
           "config_from_airflow_context", "dag_schedules", "delta_root", "delta_upkeep", "load_schema",
           "open_existing_store", "open_store", "pipeline_config", "publish", "read_batch", "read_metrics",
           "request_backfill", "request_snapshot", "request_sweep", "run_for", "run_once", "run_until_idle",
           "save_batch", "spark_session", "stop_spark", "transform"]
