"""Read commit-log segments into typed mutations: the library's front door.

``read_mutations`` joins the segment container (``segment``), the schema in force (a fixed ``Schema`` or a
``commitlog.schema_from_log.SchemaTracker`` that follows ``system_schema`` mutations in the log) and the mutation decoder
(``mutation``). It yields ``Mutation`` objects in file order, and ``Damage`` records for everything that
could not be decoded (damaged bytes, unknown tables, columns the schema cannot type), each with its bytes,
file and position, so a caller can quarantine them. Nothing is dropped silently.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional, Union

from cdc_lib.errors import CdcError, FormatError, UnknownTableError

from .model import Mutation, mutation_id
from .mutation import decode_mutation
from .segment import Damage, LogEntry, SegmentReader, segment_sources


class SchemaSource:
    """What the decoder asks for the schema: ``current()`` before each entry, ``observe()`` after it."""

    def current(self):
        raise NotImplementedError

    def observe(self, mutation: Mutation) -> None:
        pass


class FixedSchema(SchemaSource):
    def __init__(self, schema):
        self.schema = schema

    def current(self):
        return self.schema


class LogSchema(SchemaSource):
    """The schema as of each position, following ``system_schema`` mutations found in the log."""

    def __init__(self, base=None):
        from .schema_from_log import SchemaTracker
        self.tracker = SchemaTracker(base)

    def current(self):
        return self.tracker.schema

    def observe(self, mutation: Mutation) -> None:
        self.tracker.observe(mutation)


def schema_source(schema=None, schema_from_log: bool = False) -> SchemaSource:
    if schema_from_log:
        return LogSchema(schema)
    if schema is None:
        from cdc_lib.cql.schema import Schema
        schema = Schema()
    return FixedSchema(schema)


def decode_entry(entry: LogEntry, schema) -> Union[Mutation, Damage]:
    """Decode one entry; a decoding failure becomes a Damage record that keeps the entry's bytes."""
    mv = entry.messaging_version
    if mv is None:
        return Damage(entry.segment, entry.start, "unsupported",
                      f"descriptor version {entry.descriptor_version} uses the pre-3.0 mutation layout, "
                      "which is read at container level only", entry.data)
    try:
        m = decode_mutation(entry.data, schema, mv, source=entry.segment, base_position=entry.start + 8)
    except UnknownTableError as e:
        return Damage(entry.segment, entry.start, "unknown_table", e.reason, entry.data, table_id=e.table_id)
    except FormatError as e:
        return Damage(entry.segment, entry.start, "undecodable", e.reason, entry.data)
    except CdcError as e:
        return Damage(entry.segment, entry.start, "undecodable", str(e), entry.data)
    m.segment = entry.segment
    m.segment_id = entry.segment_id
    m.position = entry.position
    m.mutation_id = mutation_id(entry.data)
    return m


def read_mutations(paths: Iterable, schema=None, *, schema_from_log: bool = False, keys=None,
                   strict: bool = False, start: Optional[int] = None, stop: Optional[int] = None,
                   source: SchemaSource | None = None) -> Iterator[Union[Mutation, Damage]]:
    """Mutations and damage records of ``paths`` in order (segment ids ascending as given).

    ``paths``: one segment or an iterable of them, each a path (str, bytes or os.PathLike) or a segment's bytes
    (``segment.is_segment_bytes``).

    ``strict``: raise the first damage (``Damage.is_damage``) as a ``SegmentError`` instead of yielding it;
    entries of tables the schema does not know are still yielded as ``unknown_table`` records.
    """
    src = source or schema_source(schema, schema_from_log)
    for path in segment_sources(paths):
        reader = SegmentReader(path, keys=keys, strict=strict, start=start, stop=stop)
        for rec in reader:
            if isinstance(rec, Damage):
                yield rec
                continue
            out = decode_entry(rec, src.current())
            if isinstance(out, Damage) and strict and out.is_damage:
                raise out.error()
            if isinstance(out, Mutation):
                src.observe(out)
            yield out
