"""``cassandra-cdc demo``: the demo's command line (the demo itself is ``cdc_lib.demo.run``)."""
from __future__ import annotations

import sys
from pathlib import Path

from cdc_lib.demo.run import DEFAULT_WORKDIR, _say, run_demo

from . import exits


def build_parser():
    p = exits.ArgumentParser(
        prog="cassandra-cdc demo",
        description="Run the whole pipeline on embedded defaults, all on 127.0.0.1: a real Cassandra 5.0 node (the "
                    "jars setup.sh fetched) takes a workload through cassandra-driver, its agent ships the segments "
                    "to an S3 server (SeaweedFS), the real Airflow DAGs (DAG.test(), what airflow dags test runs; "
                    "Delta tables) publish to Apache Kafka. It prints what each step does and how long it takes, "
                    "events read back from Kafka and a query of a Delta table, ends by comparing the Delta state "
                    "with SELECT *, then stops what it started and keeps its files in the workdir.")
    p.add_argument("--mutations", type=int, default=2000,
                   help="CQL statements written to the node, or with --generated, generated writes (2000)")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                   help="where the demo's files go and stay: segments, the S3 and Airflow data, and a local copy "
                        "of the store to query (default: ./cdc-demo; an earlier demo's workdir is replaced)")
    p.add_argument("--clean", action="store_true", help="delete the workdir at the end")
    p.add_argument("--seed", type=int, default=7, help="seed of the generated workload (7): same seed, same writes")
    p.add_argument("--max-segments", type=int, default=16, help="segments per batch, a DAG param (16)")
    p.add_argument("--generated", action="store_true",
                   help="no Cassandra: our own writer generates what a 3-node RF 3 cluster writes (replica copies, "
                        "out-of-order arrivals), no JVM for the source")
    return p


def demo_main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        run_demo(a.mutations, a.workdir, a.seed, a.max_segments, a.clean, generated=a.generated)
    except KeyboardInterrupt:
        _say("interrupted: everything started was stopped")
        return exits.INTERRUPTED
    except Exception as e:  # noqa: BLE001 - a failed step: say which, with its log, not a traceback
        print(f"cassandra-cdc demo: failed: {e}", file=sys.stderr)
        return exits.FAILED
    return exits.OK
