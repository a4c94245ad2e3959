#!/usr/bin/env bash
# The main job on embedded defaults (run scripts/setup.sh first, or use the README's one-liner):
# generated 3-node RF 3 segments -> agents -> embedded S3 (SeaweedFS) -> the real Airflow DAGs (`airflow dags
# test`, local Spark + Delta) -> embedded Kafka (Tansu); says what each step runs and how long it took, prints a
# summary, events from Kafka and a query of a Delta table, stops what it started and keeps its files in
# ./cdc-demo (README: "Try it after the demo"). Extra arguments go to `cassandra-cdc demo` (see --help:
# --mutations N, --workdir DIR, --clean).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv/bin/python ] || { echo "demo: .venv missing: run bash scripts/setup.sh first" >&2; exit 1; }
exec .venv/bin/python -m cdc_lib.cli demo "$@"
