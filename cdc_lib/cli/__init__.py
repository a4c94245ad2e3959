"""The ``cassandra-cdc`` command: ``inspect`` (``main``), ``agent`` (``agent``) and ``demo`` (``demo``; the demo
itself is ``cdc_lib.demo``)."""
from .main import main

__all__ = ["main"]
