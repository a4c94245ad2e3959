"""The ``cassandra-cdc`` command: ``inspect`` (``main``), ``agent`` (``agent``), ``demo`` (``cdc_lib.demo``)."""
from .main import main

__all__ = ["main"]
