"""Beside each Cassandra node: ship completed CDC segments from ``cdc_raw`` to the object store.

``cdc_raw`` reads the node's directory (which segments are complete, per Cassandra version), ``space`` watches
the CDC space, ``shipper.Agent`` uploads, verifies and frees. The command is ``cassandra-cdc agent``
(``cdc_lib.cli.agent``).
"""
from cdc_lib.settings import AgentConfig

from .cdc_raw import CdcSegment, IdxState, read_idx, scan_cdc_raw, synced_file_end
from .shipper import Agent
from .space import SpaceMonitor, default_cdc_total_space

__all__ = ["Agent", "AgentConfig", "CdcSegment", "IdxState", "SpaceMonitor", "default_cdc_total_space", "read_idx",
           "scan_cdc_raw", "synced_file_end"]
