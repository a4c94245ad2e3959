"""A live table read through CQL -> the same Arrow cell log as commit logs and SSTables (the ``cql`` backfill).

``ranges`` splits the Murmur3 ring into token ranges (aligned with the nodes' own ranges), ``raw`` makes
cassandra-driver hand over every value as the bytes Cassandra sent, ``rows`` turns a row of ``SELECT`` with
``WRITETIME()`` and ``TTL()`` of each column into cell-log records, ``reader`` scans one token range page by page.

Values are never converted through the driver's Python types: the native protocol carries each value in the
serialization Cassandra stores in its cells (the same bytes for every type, collections and UDTs included), so
the scan keeps them byte for byte, and the one codec of ``cql.types`` reads them, as it reads commit logs.
"""
from .ranges import TokenRange, split_ring
from .reader import ScanSettings, scan_range, scan_session
from .rows import ScanError, TableScan

__all__ = ["ScanError", "ScanSettings", "TableScan", "TokenRange", "scan_range", "scan_session", "split_ring"]
