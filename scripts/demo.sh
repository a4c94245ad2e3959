#!/usr/bin/env bash
# The main job on embedded defaults (run scripts/setup.sh first, or use the README's one-liner):
# generated 3-node RF 3 segments -> agents -> embedded S3 (SeaweedFS) -> the real `cassandra_cdc` Airflow DAG
# (`airflow dags test`, local Spark + Delta) -> embedded Kafka (Tansu); prints a summary, events from Kafka and
# a query of a Delta table, then stops what it started. Extra arguments go to `cassandra-cdc demo`
# (e.g. --mutations 10000, --workdir DIR to keep the files).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv/bin/python ] || { echo "demo: .venv missing: run bash scripts/setup.sh first" >&2; exit 1; }
exec .venv/bin/python -m cdc_lib.demo "$@"
