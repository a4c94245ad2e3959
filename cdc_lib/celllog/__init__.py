"""The Arrow cell log: one row per cell or tombstone, the hand-off from the decoders to the state merge.

``schema`` defines the columns and record kinds, ``records`` converts typed mutations (the reference), ``fast``
decodes entry bytes straight to columns (same output), ``reader.read_cell_log`` streams segments through them,
or through the compiled reader (``native``, the optional ``cdc_native`` extension) when it is installed.
"""
from .reader import read_cell_log
from .records import mutation_records, records_to_batch
from .schema import CELL_LOG_SCHEMA, KINDS, decode_clustering, encode_clustering

__all__ = ["CELL_LOG_SCHEMA", "KINDS", "decode_clustering", "encode_clustering", "mutation_records",
           "read_cell_log", "records_to_batch"]
