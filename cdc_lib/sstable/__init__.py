"""SSTables -> the same typed partitions and Arrow cell log as commit logs, for bootstrap and backfill.

``descriptor`` names the files and versions (Cassandra 3.0 to 5.0: BIG ``ma`` … ``oa``, BTI ``da``),
``statistics`` reads the serialization header, ``chunks`` turns Data.db into the checked uncompressed stream,
``table`` decides the table and its column names, ``reader`` decodes partitions (the reference, sharing the
commit log's row decoder), ``fast`` goes straight to cell-log records, ``index`` finds where to resume after
damage.
"""
from .descriptor import find_data_files, is_sstable_input
from .fast import read_sstable_cell_log
from .reader import SSTable, read_sstable_mutations

__all__ = ["SSTable", "find_data_files", "is_sstable_input", "read_sstable_cell_log", "read_sstable_mutations"]
