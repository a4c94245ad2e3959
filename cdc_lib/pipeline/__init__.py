"""The micro-batch pipeline the Airflow DAGs run: claim -> transform -> publish -> archive, one batch at a time.

``settings`` (what a run is pointed at), ``batches`` (the batch manifest, ledger keys, metrics), ``steps`` (the
four steps), ``backfill`` and ``maintenance`` (the other DAGs' work), ``airflow`` (params and connections).
The DAG files call only what this package exports.
"""
from cdc_lib.settings import PipelineConfig
from cdc_lib.spark.session import spark_session, stop_spark

from .airflow import airflow_params, config_from_airflow_context, config_from_params, default_params
from .backfill import cluster_snapshot_events, request_snapshot
from .batches import (FAULT_POINTS, METRICS_KEY, POINTER_KEY, SNAPSHOT_REQUEST_KEY, STATES, SWEEP_REQUEST_KEY, Batch,
                      PipelineError, batch_id_for, read_batch, read_metrics, save_batch)
from .maintenance import delta_upkeep, request_sweep
from .resources import delta_root, load_schema, open_store
from .steps import archive, claim, publish, run_once, run_until_idle, transform

__all__ = ["FAULT_POINTS", "METRICS_KEY", "POINTER_KEY", "SNAPSHOT_REQUEST_KEY", "STATES", "SWEEP_REQUEST_KEY",
           "Batch", "PipelineConfig", "PipelineError", "airflow_params", "archive", "batch_id_for", "claim",
           "cluster_snapshot_events", "config_from_airflow_context", "config_from_params", "default_params",
           "delta_root", "delta_upkeep", "load_schema", "open_store", "publish", "read_batch", "read_metrics",
           "request_snapshot", "request_sweep", "run_once", "run_until_idle", "save_batch", "spark_session",
           "stop_spark", "transform"]
