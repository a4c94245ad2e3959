"""Commit-log segments -> typed mutations, and the byte-exact writer that goes the other way.

``segment`` reads the container (header, sync sections, CRCs, ``compression``/``encryption`` codecs) into
entries and ``Damage`` records; ``mutation`` decodes an entry into a ``commitlog.model.Mutation``; ``reader.read_mutations``
joins them with the schema in force (fixed, or followed through the log by ``schema_from_log``).
"""
from .model import Mutation, mutation_id
from .reader import read_mutations
from .segment import DAMAGE_KINDS, Damage, LogEntry, SegmentReader

__all__ = ["DAMAGE_KINDS", "Damage", "LogEntry", "Mutation", "SegmentReader", "mutation_id", "read_mutations"]
