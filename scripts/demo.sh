#!/usr/bin/env bash
# The main job on embedded defaults (run scripts/setup.sh first, or use the README's one-liner):
# a real Cassandra 5.0 node (the jars setup.sh fetched) takes writes through cassandra-driver -> its agent ships
# the segments to an embedded S3 (SeaweedFS) -> the real Airflow DAGs (Delta state tables) -> Apache Kafka; says
# what each step runs and how long it took, prints a summary, events from Kafka and a query of a Delta table,
# stops what it started, ends by comparing the Delta state with SELECT * and keeps its files in ./cdc-demo
# (README: "Try it after the demo"). Extra arguments go to `cassandra-cdc demo` (see --help: --mutations N,
# --workdir DIR, --clean, --generated: no Cassandra, our own writer generates a 3-node RF 3 cluster's segments).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv/bin/python ] || { echo "demo: .venv missing: run bash scripts/setup.sh first" >&2; exit 1; }
exec .venv/bin/python -m cdc_lib.cli demo "$@"
