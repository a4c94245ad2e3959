"""The in-process Spark driver's output reaches Python logging at each line's own level, so that Airflow's task
log shows a Spark WARN as a warning and only a real ERROR as an error (before, every start-up line of Spark was
logged at error level: the JVM wrote to the task's stderr). The whole path under Airflow is checked by
test_airflow_scheduler.py; this is the level mapping, line by line."""
from __future__ import annotations

import io
import logging

from cdc_lib.spark.session import LOG4J2_CONFIG, forward_jvm_output


def _forwarded(text: str, unformatted_level: int, caplog) -> list:
    caplog.set_level(logging.DEBUG, "cassandra_cdc.spark.jvm")
    forward_jvm_output(io.BytesIO(text.encode()), unformatted_level).join(10)
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "cassandra_cdc.spark.jvm"]


def test_each_record_keeps_its_log4j_level_and_its_stack_trace_with_it(caplog):
    out = _forwarded(
        "WARNING: Using incubator modules: jdk.incubator.vector\n"
        "something the JVM printed by itself\n"
        "WARN SparkConf: spark.executor.memory is not set\n"
        "ERROR Executor: Exception in task 0.0\n"
        "java.lang.IllegalStateException: boom\n"
        "\tat org.apache.spark.Foo.bar(Foo.scala:1)\n"
        "Caused by: java.io.IOException: disk\n"
        "\n"
        "INFO Utils: a line a custom config let through\n", logging.WARNING, caplog)
    assert out == [
        ("INFO", "WARNING: Using incubator modules: jdk.incubator.vector"),    # the JVM's notice at each start
        ("WARNING", "something the JVM printed by itself"),
        ("WARNING", "SparkConf: spark.executor.memory is not set"),
        ("ERROR", "Executor: Exception in task 0.0"),
        ("ERROR", "java.lang.IllegalStateException: boom"),                      # %ex: the record's exception
        ("ERROR", "\tat org.apache.spark.Foo.bar(Foo.scala:1)"),
        ("ERROR", "Caused by: java.io.IOException: disk"),
        ("INFO", "Utils: a line a custom config let through"),
    ]


def test_stdout_lines_without_a_prefix_are_info(caplog):
    assert _forwarded("hello from a JVM println\n", logging.INFO, caplog) == [("INFO", "hello from a JVM println")]


def test_the_log4j2_config_matches_the_parser():
    """The forwarder parses the pattern this file sets; WARN is the threshold; the config ships in the package."""
    text = LOG4J2_CONFIG.read_text()
    assert "appender.stderr.layout.pattern = %p %c{1}: %m%n%ex" in text
    assert "rootLogger.level = warn" in text
