"""Spark jobs of the pipeline; each module runs under ``spark-submit`` and in-process (local mode)."""
