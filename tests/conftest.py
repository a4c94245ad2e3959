"""Shared pytest fixtures."""
import logging
from pathlib import Path

import pytest

# Real files written by Cassandra live in the `shared` directory next to the repository (never copied into it).
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"


@pytest.fixture(scope="session")
def corpus() -> Path:
    """Path of /work/shared/corpus (``shared/corpus`` beside the repo)."""
    if not CORPUS.is_dir():
        pytest.fail(f"corpus not found at {CORPUS}: clone/copy `shared/` next to the repository")
    return CORPUS


@pytest.fixture(scope="session", autouse=True)
def _root_logger_as_the_session_found_it():
    """Airflow configures logging when a test first imports it in this process: a handler on the root logger that
    writes to the stream ``sys.stdout`` was then (pytest's capture, closed when the session ends). Handlers added
    during the session go at its end, so that a record logged at interpreter exit (py4j closing its gateway:
    "Closing down clientserver connection") meets no closed stream ("--- Logging error ---" after the summary)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
    root.setLevel(level)


# Real servers for tests (Apache Kafka, SeaweedFS S3, Apicurio Registry on 127.0.0.1, stopped by PID): see
# tests/servers.py. Session-scoped: kafka_broker (bootstrap str), s3_server (S3Server), schema_registry (URL),
# airflow_home (env dict for `airflow dags test`, SQLite migrated), real_cassandra (a 1-node Cassandra 5.0,
# LocalCassandra). Function-scoped: kafka_topic, s3_bucket, spark_session (one shared local[2] session).
from servers import (_spark_workdir, airflow_home, kafka_broker, kafka_server, kafka_topic,  # noqa: E402,F401
                     real_cassandra, s3_bucket, s3_server, schema_registry, spark_session)
