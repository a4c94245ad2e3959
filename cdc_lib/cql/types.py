"""The CQL type registry: every CQL type, its canonical name, its value codec and its JSON form.

A ``CqlType`` is an immutable, hashable description of a type (equal by structure). It turns the serialized
value bytes Cassandra writes in cells, clustering prefixes and partition keys into Python values and back
(``decode``/``encode``: ``encode(decode(b)) == b`` for every canonical ``b``), renders values as JSON
(``to_json``), and for non-frozen collections and UDTs ("complex" columns: one cell per element) says how cell
paths and cell values are typed (``path_type``, ``element_value_type``, ``decode_cells``/``encode_cells``).

``parse_type`` reads type strings in both forms Cassandra prints them: CQL (``frozen<map<text, int>>``, as in
DESCRIBE and ``system_schema.columns.type``) and marshal class names (``org.apache.cassandra.db.marshal.
MapType(...)``, as in SSTable headers, some system tables and dropped-column records).

Byte layouts: cassandra-commitlog-format.md §16-§18 and cassandra-sstable-format.md §4.6.

Python values (``decode`` results; ``encode`` accepts these and a few natural alternatives):

=====================  =================================================================================
ascii, text, varchar   ``str``
blob, custom types     ``bytes``
tinyint ... bigint,    ``int``
varint
counter                ``CounterValue`` (an ``int``, the sum of the shards, that keeps its counter context)
boolean                ``bool``
float, double          ``float`` (float32 values are exact; NaN bit patterns are kept)
decimal                ``decimal.Decimal`` with the exact unscaled value and scale
uuid, timeuuid         ``uuid.UUID``
inet                   ``ipaddress.IPv4Address`` / ``IPv6Address``
date                   ``datetime.date``, or ``CqlDate(days)`` outside years 1..9999
time                   ``CqlTime(nanoseconds)``
timestamp              aware UTC ``datetime.datetime``, or ``CqlTimestamp(millis)`` outside years 1..9999
duration               ``Duration(months, days, nanoseconds)``; ``str()`` is the CQL literal
list, vector           ``list``
set                    ``CqlSet``: a ``tuple`` in serialized (Cassandra's sorted) order
map                    ``CqlMap`` (a ``dict`` in serialized order); ``CqlPairs`` (a tuple of (key, value)
                       pairs) when the key type decodes to unhashable values (lists, maps, vectors)
tuple                  ``tuple`` (fields missing at the end of the bytes are ``None``)
UDT                    ``UdtValue``: an ordered, read-only mapping field name -> value (missing fields None)
empty type             ``EMPTY``
=====================  =================================================================================

Null elements inside collections, tuples and UDTs (i32 length -1) are ``None``. An empty value (zero bytes) of a
type for which ``b""`` is not a valid value decodes to ``EMPTY``; ascii/text give ``""``, blob and custom ``b""``.

Order: ``CqlSet``, ``CqlMap`` and ``CqlPairs`` are trusted to be in Cassandra's order and are re-encoded as they
are (so decoded values round-trip byte for byte). Any other set or mapping (``set``, ``frozenset``, ``list``,
``dict``, ...) is sorted into Cassandra's comparison order of the element/key type before encoding (exact for
numbers, strings, blobs, inet, dates and times; best effort for uuid and nested collections).

JSON (``to_json``): strings for text; ``"0x"`` + lowercase hex for blob and custom types; numbers for integers,
counters, float and double (``"NaN"``, ``"Infinity"``, ``"-Infinity"`` as strings; float32 values as the
shortest decimal that reads back to the same float32); varint as a number when ``abs(v) < 2**53`` else a string;
decimal as its exact string (``"2.71828"``, Java BigDecimal.toString style); booleans; uuid as the lowercase
canonical string; inet as its address string; date ``"YYYY-MM-DD"``; time ``"HH:MM:SS.nnnnnnnnn"``; timestamp
``"YYYY-MM-DDTHH:MM:SS.mmmZ"`` (years outside 0..9999 get a sign); duration as its CQL literal; list, set,
vector and tuple as arrays; map as an object when the key type is ascii/text, else an array of
``[key, value]`` pairs; UDT as an object; null as null; ``EMPTY`` as ``{"$empty": true}``, which no real value
of any type produces.
"""
from __future__ import annotations

import datetime
import decimal
import functools
import ipaddress
import math
import os
import re
import struct
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from cdc_lib.errors import CqlValueError, FormatError, SchemaError
from cdc_lib.wire import encode_uvint, encode_vint, read_uvint, read_vint

__all__ = [
    "EMPTY", "CqlType", "parse_type", "udt_type", "composite_decode", "composite_encode", "composite_split",
    "CqlDate", "CqlTime", "CqlTimestamp", "Duration", "CqlSet", "CqlMap", "CqlPairs", "UdtValue",
    "CounterValue", "CounterShard", "decode_counter_context", "encode_counter_context", "counter_total",
    "NATIVE_TYPES", "MARSHAL_PACKAGE", "marshal_is_reversed", "read_length_prefixed",
]

MARSHAL_PACKAGE = "org.apache.cassandra.db.marshal."

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


# ---------------------------------------------------------------------------------------------------------------
# Sentinel and value classes
# ---------------------------------------------------------------------------------------------------------------

class _Empty:
    """The type of ``EMPTY``: a zero-byte value of a type for which zero bytes are not a real value."""
    __slots__ = ()
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "EMPTY"

    def __reduce__(self):
        return (_Empty, ())

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


EMPTY = _Empty()
EMPTY_JSON = {"$empty": True}


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian (year, month, day) of a day number counted from 1970-01-01, for any integer."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return (y + 1 if m <= 2 else y), m, d


def _format_year(y: int) -> str:
    # ISO 8601 expanded years carry a sign; 0000..9999 are written plainly.
    return f"{y:04d}" if 0 <= y <= 9999 else f"{y:+05d}"


def _format_days(days: int) -> str:
    y, m, d = _civil_from_days(days)
    return f"{_format_year(y)}-{m:02d}-{d:02d}"


def _format_nanos_of_day(n: int) -> str:
    h, rem = divmod(n, 3_600_000_000_000)
    mi, rem = divmod(rem, 60_000_000_000)
    s, ns = divmod(rem, 1_000_000_000)
    return f"{h:02d}:{mi:02d}:{s:02d}.{ns:09d}"


def _format_millis(ms: int) -> str:
    days, rem = divmod(ms, 86_400_000)
    h, rem = divmod(rem, 3_600_000)
    mi, rem = divmod(rem, 60_000)
    s, milli = divmod(rem, 1000)
    return f"{_format_days(days)}T{h:02d}:{mi:02d}:{s:02d}.{milli:03d}Z"


@dataclass(frozen=True, order=True)
class CqlDate:
    """A CQL ``date`` outside the range of ``datetime.date``: days since 1970-01-01 (-2^31 .. 2^31-1)."""
    days: int

    def __str__(self):
        return _format_days(self.days)


@dataclass(frozen=True, order=True)
class CqlTime:
    """A CQL ``time``: nanoseconds since midnight. ``str`` gives ``HH:MM:SS.nnnnnnnnn``."""
    nanoseconds: int

    def __str__(self):
        return _format_nanos_of_day(self.nanoseconds)

    @classmethod
    def from_time(cls, t: datetime.time) -> "CqlTime":
        return cls(((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000_000 + t.microsecond * 1000)

    def to_time(self) -> datetime.time:
        """As ``datetime.time`` (truncated to microseconds); ValueError outside one day."""
        h, rem = divmod(self.nanoseconds, 3_600_000_000_000)
        mi, rem = divmod(rem, 60_000_000_000)
        s, ns = divmod(rem, 1_000_000_000)
        return datetime.time(h, mi, s, ns // 1000)


@dataclass(frozen=True, order=True)
class CqlTimestamp:
    """A CQL ``timestamp`` outside the range of ``datetime``: milliseconds since the Unix epoch."""
    millis: int

    def __str__(self):
        return _format_millis(self.millis)


_NANOS_PER_MICRO = 1000
_NANOS_PER_MILLI = 1000 * _NANOS_PER_MICRO
_NANOS_PER_SECOND = 1000 * _NANOS_PER_MILLI
_NANOS_PER_MINUTE = 60 * _NANOS_PER_SECOND
_NANOS_PER_HOUR = 60 * _NANOS_PER_MINUTE


@dataclass(frozen=True)
class Duration:
    """A CQL ``duration``. ``str`` is the CQL literal in Cassandra's own output format (``Duration.toString``),
    e.g. ``12h30m50ms``, ``1y2mo3d``, ``-5s`` -- except that the zero duration prints as ``0s`` (Cassandra
    prints an empty string, which is not a literal)."""
    months: int = 0
    days: int = 0
    nanoseconds: int = 0

    def __str__(self):
        out = []

        def unit(dividend, divisor, name):
            if dividend == 0 or dividend < divisor:
                return dividend
            out.append(f"{dividend // divisor}{name}")
            return dividend % divisor

        if self.months < 0 or self.days < 0 or self.nanoseconds < 0:
            out.append("-")
        rem = unit(abs(self.months), 12, "y")
        unit(rem, 1, "mo")
        unit(abs(self.days), 1, "d")
        if self.nanoseconds != 0:
            rem = unit(abs(self.nanoseconds), _NANOS_PER_HOUR, "h")
            rem = unit(rem, _NANOS_PER_MINUTE, "m")
            rem = unit(rem, _NANOS_PER_SECOND, "s")
            rem = unit(rem, _NANOS_PER_MILLI, "ms")
            rem = unit(rem, _NANOS_PER_MICRO, "us")
            unit(rem, 1, "ns")
        text = "".join(out)
        return text if text not in ("", "-") else "0s"


class CqlSet(tuple):
    """A decoded CQL set: the elements in serialized order (Cassandra's sort order of the element type).

    A tuple (so it keeps the order exactly and needs no hashable elements); compares equal to a tuple with the
    same elements in the same order. ``encode`` writes it in this order.
    """
    __slots__ = ()

    def __repr__(self):
        return f"CqlSet({tuple.__repr__(self)})"


class CqlMap(dict):
    """A decoded CQL map with hashable keys: a ``dict`` in serialized order (``encode`` keeps that order)."""
    __slots__ = ()

    def __repr__(self):
        return f"CqlMap({dict.__repr__(self)})"


class CqlPairs(tuple):
    """A decoded CQL map whose keys are unhashable (lists, maps, vectors): a tuple of (key, value) pairs in
    serialized order."""
    __slots__ = ()

    def __repr__(self):
        return f"CqlPairs({tuple.__repr__(self)})"

    def items(self):
        return iter(self)

    def keys(self):
        return [k for k, _ in self]

    def values(self):
        return [v for _, v in self]


class UdtValue(Mapping):
    """A UDT value: a read-only mapping field name -> value, in the type's field order.

    Built like a dict (``UdtValue(street="x", zip=None)`` or ``UdtValue({"street": "x"})``). Fields are also
    attributes. Decoded values hold every field of the type (missing ones None) and remember how many fields the
    bytes held (``present``), so that values written before ``ALTER TYPE ... ADD`` re-encode byte for byte.
    Equal to any mapping with the same items; hashable when the field values are.
    """
    __slots__ = ("_fields", "present")

    def __init__(self, fields=(), /, **kw):
        d = dict(fields)
        d.update(kw)
        object.__setattr__(self, "_fields", d)
        object.__setattr__(self, "present", None)

    @classmethod
    def _decoded(cls, names, values, present):
        v = cls(zip(names, values))
        object.__setattr__(v, "present", present)
        return v

    def __getitem__(self, k):
        return self._fields[k]

    def __iter__(self):
        return iter(self._fields)

    def __len__(self):
        return len(self._fields)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("UdtValue is read-only")

    def __eq__(self, other):
        if isinstance(other, Mapping):
            return dict(self._fields) == dict(other.items())
        return NotImplemented

    def __hash__(self):
        return hash(tuple(self._fields.items()))

    def __repr__(self):
        return "UdtValue(" + ", ".join(f"{k}={v!r}" for k, v in self._fields.items()) + ")"

    def __reduce__(self):
        return (_rebuild_udt_value, (tuple(self._fields.items()), self.present))


def _rebuild_udt_value(items, present):
    v = UdtValue(items)
    object.__setattr__(v, "present", present)
    return v


class CounterShard(NamedTuple):
    """One shard of a counter context (format §17.4)."""
    counter_id: uuid.UUID
    clock: int
    count: int
    kind: str              # 'global', 'local' or 'remote'


class CounterValue(int):
    """A decoded counter cell: an ``int`` (the sum of its shards' counts) that keeps the counter context bytes
    (``context``) so that ``encode`` reproduces them; ``shards`` decodes the context."""

    def __new__(cls, total: int, context: bytes):
        v = super().__new__(cls, total)
        v.context = context
        return v

    @property
    def shards(self) -> list:
        return decode_counter_context(self.context)

    def __repr__(self):
        return f"CounterValue({int(self)})"

    def __reduce__(self):
        return (CounterValue, (int(self), self.context))


def decode_counter_context(data) -> list:
    """The shards of a counter context: [CounterShard(counter_id, clock, count, kind)] in body order."""
    data = bytes(data)
    if len(data) < 2:
        raise CqlValueError(f"counter context of {len(data)} bytes has no header count", position=0)
    header_count = abs(_I16.unpack_from(data, 0)[0])
    body_start = 2 + 2 * header_count
    if body_start > len(data) or (len(data) - body_start) % 32:
        raise CqlValueError(f"counter context of {len(data)} bytes does not hold {header_count} header entries "
                            f"and whole 32-byte shards", position=0)
    n = (len(data) - body_start) // 32
    kinds = ["remote"] * n
    for i in range(header_count):
        entry = _I16.unpack_from(data, 2 + 2 * i)[0]
        index, kind = (entry, "local") if entry >= 0 else (entry + 32768, "global")
        if index >= n:
            raise CqlValueError(f"counter context header entry {i} points at shard {index} of {n}",
                                position=2 + 2 * i)
        kinds[index] = kind
    shards = []
    for i in range(n):
        p = body_start + 32 * i
        shards.append(CounterShard(uuid.UUID(bytes=data[p:p + 16]), _I64.unpack_from(data, p + 16)[0],
                                   _I64.unpack_from(data, p + 24)[0], kinds[i]))
    return shards


def encode_counter_context(shards) -> bytes:
    """Inverse of ``decode_counter_context``: header entries for global and local shards, in body order."""
    header = []
    body = bytearray()
    for i, sh in enumerate(shards):
        counter_id, clock, count, kind = sh
        if kind == "global":
            header.append(i - 32768)
        elif kind == "local":
            header.append(i)
        elif kind != "remote":
            raise CqlValueError(f"unknown counter shard kind {kind!r}")
        if i >= 32768:
            raise CqlValueError("too many counter shards")
        cid = counter_id if isinstance(counter_id, uuid.UUID) else uuid.UUID(str(counter_id))
        try:
            body += cid.bytes + _I64.pack(clock) + _I64.pack(count)
        except struct.error as e:
            raise CqlValueError(f"counter shard {i}: {e}") from None
    return _I16.pack(len(header)) + b"".join(_I16.pack(h) for h in header) + bytes(body)


def counter_total(data) -> int:
    """The value of a counter cell: the sum of its shards' counts."""
    return sum(s.count for s in decode_counter_context(data))


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------

def _bad(t: "CqlType", message: str, position: int | None = None) -> CqlValueError:
    return CqlValueError(f"{t.cql}: {message}", position=position)


def _varint_bytes(v: int) -> bytes:
    # Java BigInteger.toByteArray: minimal two's complement, zero is one 0x00 byte.
    n = (v.bit_length() if v >= 0 else (~v).bit_length()) // 8 + 1
    return v.to_bytes(n, "big", signed=True)


def _float32_json(v: float):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    target = _F32.pack(v)
    for p in range(1, 10):
        s = float(f"{v:.{p}g}")
        try:
            if _F32.pack(s) == target:
                return s
        except OverflowError:   # a short decimal near Float.MAX_VALUE rounds past it: not this float
            continue
    return v


def _double_json(v: float):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _float_order(v: float):
    # Java Float.compare / Double.compare: -0.0 < 0.0, NaN above everything.
    if math.isnan(v):
        return (1, 0.0, 0.0)
    return (0, v, math.copysign(1.0, v))


def _signed_bytes_key(b: bytes) -> bytes:
    # Lexicographic comparison of bytes taken as *signed*: flip the sign bit and compare unsigned.
    return bytes(x ^ 0x80 for x in b)


def _read_i32_len(t, data, pos, what):
    if pos + 4 > len(data):
        raise _bad(t, f"truncated: {what} length needs 4 bytes at {pos}, {len(data) - pos} left", pos)
    return _I32.unpack_from(data, pos)[0], pos + 4


def read_length_prefixed(data: bytes, pos: int = 0, count: int | None = None, what: str = "value",
                         context: object = None) -> tuple[list, int]:
    """``count`` int32-length-prefixed values from byte ``pos`` of ``data`` (as many as the bytes hold when
    ``count`` is None), and the position after them. Length -1 is a null (None).

    The framing of collection elements, map keys and values, and tuple and UDT fields. Bytes that end inside a
    length or a value, or a length below -1, raise ``CqlValueError`` naming ``what`` and its number with the
    byte position, after the caller's ``context`` (a type, a column) when given.
    """
    out: list = []
    end = len(data)
    unpack = _I32.unpack_from
    try:
        while (len(out) < count) if count is not None else (pos < end):
            ln = unpack(data, pos)[0]
            pos += 4
            if 0 <= ln <= end - pos:
                out.append(data[pos:pos + ln])
                pos += ln
            elif ln == -1:
                out.append(None)
            elif ln < 0:
                raise _framing_error(context, f"{what} {len(out)} has negative length {ln} at byte {pos - 4}",
                                     pos - 4)
            else:
                raise _framing_error(context, f"truncated {what}: {what} {len(out)} needs {ln} bytes at byte {pos}",
                                     pos)
    except struct.error:     # fewer than 4 bytes left for a length; checked only then, this loop is hot
        raise _framing_error(context, f"truncated {what}: {what} {len(out)} at byte {pos}", pos) from None
    return out, pos


def _framing_error(context, message: str, position: int) -> CqlValueError:
    return CqlValueError(message if context is None else f"{context}: {message}", position=position)


def _frame(b: bytes | None) -> bytes:
    if b is None:
        return b"\xff\xff\xff\xff"
    return _I32.pack(len(b)) + b


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_timeuuid_lock = threading.Lock()
_timeuuid_last = 0
_UUID_EPOCH_OFFSET = 0x01B21DD213814000   # 100-ns intervals from 1582-10-15 to 1970-01-01


def _new_timeuuids(n: int) -> list:
    """``n`` version-1 UUIDs with strictly increasing timestamps (list cell paths, as Cassandra makes them)."""
    global _timeuuid_last
    with _timeuuid_lock:
        ts = max(time.time_ns() // 100 + _UUID_EPOCH_OFFSET, _timeuuid_last + 1)
        _timeuuid_last = ts + n - 1
    rnd = int.from_bytes(os.urandom(8), "big")
    clock_seq = rnd & 0x3FFF
    node = ((rnd >> 14) & 0xFFFFFFFFFFFF) | 0x010000000000   # multicast bit: not a real MAC
    out = []
    for i in range(n):
        t = ts + i
        out.append(uuid.UUID(fields=(t & 0xFFFFFFFF, (t >> 32) & 0xFFFF, (t >> 48) & 0x0FFF,
                                     (clock_seq >> 8) & 0x3F, clock_seq & 0xFF, node), version=1))
    return out


# ---------------------------------------------------------------------------------------------------------------
# The type hierarchy
# ---------------------------------------------------------------------------------------------------------------

class CqlType:
    """Base of every CQL type. Immutable and hashable, equal by structure.

    Attributes: ``cql`` (canonical CQL string), ``kind``, ``fixed_length`` (bytes written with no length prefix
    in cells and clustering, Cassandra's ``valueLengthIfFixed``; None = variable, written with a uvint length),
    ``multicell`` (a non-frozen collection or UDT), ``subtypes``.

    ``kind`` is the native type name (``"int"``, ``"text"``, ... ; varchar is ``"text"``), or ``"list"``,
    ``"set"``, ``"map"``, ``"tuple"``, ``"udt"``, ``"vector"``, ``"counter"``, ``"empty"``, ``"custom"`` (raw
    bytes) or ``"composite"`` (``CompositeType``, decodes to a tuple). Element types are in ``subtypes``; UDTs
    also have ``keyspace``, ``name``, ``field_names``; vectors ``dimension``; custom types ``class_name``.
    ``ReversedType(T)`` parses to T (use ``marshal_is_reversed`` on the string), legacy ``DateType`` to timestamp.
    """
    __slots__ = ("cql", "kind", "fixed_length", "multicell", "subtypes", "_hash")

    # True when b"" is a real value of the type (ascii, text, blob, custom) rather than EMPTY.
    empty_is_value = False

    def __init__(self, kind: str, cql: str, fixed_length: int | None = None, multicell: bool = False,
                 subtypes: tuple = ()):
        s = object.__setattr__
        s(self, "kind", kind)
        s(self, "cql", cql)
        s(self, "fixed_length", fixed_length)
        s(self, "multicell", multicell)
        s(self, "subtypes", tuple(subtypes))
        s(self, "_hash", None)

    # --- identity ---
    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _key(self) -> tuple:
        return (self.kind, self.multicell, self.subtypes)

    def __eq__(self, other):
        if not isinstance(other, CqlType):
            return NotImplemented
        return self is other or (type(self) is type(other) and self._key() == other._key())

    def __hash__(self):
        h = self._hash
        if h is None:
            h = hash((type(self).__name__, self._key()))
            object.__setattr__(self, "_hash", h)
        return h

    def __repr__(self):
        return f"CqlType({self.cql!r})"

    def __str__(self):
        return self.cql

    def __reduce__(self):
        return (parse_type, (self.marshal,)) if self.kind != "udt" else (_rebuild_udt, self._udt_args())

    # --- codec ---
    def decode(self, data) -> object:
        """Serialized value bytes -> Python value. ``b""`` -> EMPTY unless zero bytes are a value of the type."""
        data = bytes(data)
        if not data and not self.empty_is_value:
            return EMPTY
        try:
            return self._decode(data)
        except CqlValueError:
            raise
        except FormatError as e:
            raise _bad(self, e.reason, e.position) from None
        except (struct.error, IndexError, ValueError, OverflowError, UnicodeDecodeError) as e:
            raise _bad(self, f"cannot decode {len(data)} bytes: {e}") from None

    def encode(self, value) -> bytes:
        """Python value -> serialized bytes. ``EMPTY`` -> ``b""``; ``None`` is not a value (it is a null)."""
        if value is EMPTY:
            return b""
        if value is None:
            raise _bad(self, "None (null) has no serialized value")
        try:
            return self._encode(value)
        except CqlValueError:
            raise
        except (struct.error, TypeError, ValueError, OverflowError, AttributeError, UnicodeEncodeError) as e:
            raise _bad(self, f"cannot encode {value!r}: {e}") from None

    def to_json(self, value) -> object:
        """The JSON form of a decoded value (see the module docstring)."""
        if value is None:
            return None
        if value is EMPTY:
            return dict(EMPTY_JSON)
        return self._json(value)

    def sort_key(self, data: bytes):
        """A Python key ordering serialized values as Cassandra's comparator for this type orders them.
        Empty values sort first."""
        data = bytes(data)
        if not data:
            return (0,)
        try:
            return (1, self._sort_key(data))
        except (CqlValueError, FormatError, struct.error, IndexError, ValueError):
            return (2, data)

    def _decode(self, data: bytes):
        raise NotImplementedError

    def _encode(self, value) -> bytes:
        raise NotImplementedError

    def _json(self, value):
        return value

    def _sort_key(self, data: bytes):
        return data

    # --- structure ---
    def freeze(self) -> "CqlType":
        """The frozen variant (single cell, nested types frozen too)."""
        return self

    @property
    def marshal(self) -> str:
        """The type as Cassandra's marshal class string (``AbstractType.toString``)."""
        return self._marshal("top")

    def _marshal(self, ctx: str) -> str:
        """``ctx``: "top" (a column's type), "multicell" (inside a non-frozen collection/UDT) or "frozen"
        (inside a frozen one). Frozen collections and UDTs print ``FrozenType(...)`` except inside frozen ones."""
        raise NotImplementedError

    # --- complex (multi-cell) columns ---
    @property
    def path_type(self) -> "CqlType | None":
        """Type of the cell path of a complex column's cells; None for single-cell types."""
        return None

    def element_value_type(self, path: bytes) -> "CqlType | None":
        """Type of the value of the cell with cell path ``path`` (None: the value is empty, as for sets)."""
        raise _bad(self, "not a multi-cell (complex) type: cells have no path")

    def decode_cells(self, cells) -> object:
        """(path, value) pairs of a complex column's live cells, in path order -> the column's Python value."""
        raise _bad(self, "not a multi-cell (complex) type: cells have no path")

    def encode_cells(self, value) -> list:
        """Inverse of ``decode_cells``: [(path, value bytes)] in path order."""
        raise _bad(self, "not a multi-cell (complex) type: cells have no path")


# --- simple types -------------------------------------------------------------------------------------------

class _Simple(CqlType):
    """A native CQL type (no parameters); one instance per kind, see NATIVE_TYPES."""
    __slots__ = ()
    marshal_class = ""

    def __init__(self, kind, fixed_length=None):
        super().__init__(kind, kind, fixed_length)

    def _marshal(self, ctx):
        return MARSHAL_PACKAGE + self.marshal_class


class AsciiType(_Simple):
    __slots__ = ()
    empty_is_value = True
    marshal_class = "AsciiType"

    def _decode(self, data):
        try:
            return data.decode("ascii")
        except UnicodeDecodeError as e:
            raise _bad(self, f"non-ASCII byte at {e.start}", e.start) from None

    def _encode(self, value):
        if not isinstance(value, str):
            raise _bad(self, f"expected str, got {type(value).__name__}")
        try:
            return value.encode("ascii")
        except UnicodeEncodeError as e:
            raise _bad(self, f"non-ASCII character at {e.start}") from None


class TextType(_Simple):
    __slots__ = ()
    empty_is_value = True
    marshal_class = "UTF8Type"

    def _decode(self, data):
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _bad(self, f"invalid UTF-8 at {e.start}", e.start) from None

    def _encode(self, value):
        if not isinstance(value, str):
            raise _bad(self, f"expected str, got {type(value).__name__}")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _bad(self, f"unencodable character at {e.start} (lone surrogate)") from None


class BlobType(_Simple):
    __slots__ = ()
    empty_is_value = True
    marshal_class = "BytesType"

    def _decode(self, data):
        return data

    def _encode(self, value):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise _bad(self, f"expected bytes, got {type(value).__name__}")
        return bytes(value)

    def _json(self, value):
        return "0x" + bytes(value).hex()


class BooleanType(_Simple):
    __slots__ = ()
    marshal_class = "BooleanType"

    def _decode(self, data):
        if len(data) != 1:
            raise _bad(self, f"expected 1 byte, got {len(data)}")
        return data[0] != 0

    def _encode(self, value):
        if not isinstance(value, bool):
            raise _bad(self, f"expected bool, got {type(value).__name__}")
        return b"\x01" if value else b"\x00"


class IntegerType(_Simple):
    """tinyint, smallint, int, bigint: signed big-endian of a fixed size."""
    __slots__ = ("size", "_marshal_class")

    def __init__(self, kind, size, fixed_length, marshal_class):
        super().__init__(kind, fixed_length)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "_marshal_class", marshal_class)

    def _marshal(self, ctx):
        return MARSHAL_PACKAGE + self._marshal_class

    def _decode(self, data):
        if len(data) != self.size:
            raise _bad(self, f"expected {self.size} bytes, got {len(data)}")
        return int.from_bytes(data, "big", signed=True)

    def _encode(self, value):
        if not _is_int(value):
            raise _bad(self, f"expected int, got {type(value).__name__}")
        lim = 1 << (8 * self.size - 1)
        if not -lim <= value < lim:
            raise _bad(self, f"{value} out of range")
        return value.to_bytes(self.size, "big", signed=True)

    def _sort_key(self, data):
        return self._decode(data)


class CounterType(_Simple):
    """counter: cell values are counter contexts (format §17.4); decodes to a CounterValue."""
    __slots__ = ()
    marshal_class = "CounterColumnType"

    def _decode(self, data):
        shards = decode_counter_context(data)
        return CounterValue(sum(s.count for s in shards), data)

    def _encode(self, value):
        if isinstance(value, CounterValue):
            return value.context
        if not _is_int(value):
            raise _bad(self, f"expected int, got {type(value).__name__}")
        # A plain int becomes one global shard (what a leader writes to the commit log), nil counter id.
        return encode_counter_context([CounterShard(uuid.UUID(int=0), 0, value, "global")])

    def _json(self, value):
        return int(value)

    def _sort_key(self, data):
        return counter_total(data)


class VarintType(_Simple):
    __slots__ = ()
    marshal_class = "IntegerType"

    def _decode(self, data):
        return int.from_bytes(data, "big", signed=True)

    def _encode(self, value):
        if not _is_int(value):
            raise _bad(self, f"expected int, got {type(value).__name__}")
        return _varint_bytes(value)

    def _json(self, value):
        return value if abs(value) < (1 << 53) else str(value)

    def _sort_key(self, data):
        return self._decode(data)


class DecimalType(_Simple):
    __slots__ = ()
    marshal_class = "DecimalType"

    def _decode(self, data):
        if len(data) < 5:
            raise _bad(self, f"expected a 4-byte scale and at least 1 byte of unscaled value, got {len(data)} bytes")
        scale = _I32.unpack_from(data, 0)[0]
        unscaled = int.from_bytes(data[4:], "big", signed=True)
        digits = tuple(int(c) for c in str(abs(unscaled)))
        return decimal.Decimal((1 if unscaled < 0 else 0, digits, -scale))

    def _encode(self, value):
        if _is_int(value):
            value = decimal.Decimal(value)
        elif isinstance(value, str):
            try:
                value = decimal.Decimal(value)
            except decimal.InvalidOperation:
                raise _bad(self, f"not a decimal: {value!r}") from None
        if not isinstance(value, decimal.Decimal):
            raise _bad(self, f"expected Decimal, got {type(value).__name__}")
        if not value.is_finite():
            raise _bad(self, f"{value} has no CQL decimal form")
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0")
        if sign:
            unscaled = -unscaled
        scale = -exponent
        if not _INT32_MIN <= scale <= _INT32_MAX:
            raise _bad(self, f"scale {scale} out of int32 range")
        return _I32.pack(scale) + _varint_bytes(unscaled)

    def _json(self, value):
        return str(value)

    def _sort_key(self, data):
        return self._decode(data)


class FloatType(_Simple):
    """float: IEEE binary32. Decodes to the exact Python float; NaN payloads survive a round trip."""
    __slots__ = ()
    marshal_class = "FloatType"

    def _decode(self, data):
        if len(data) != 4:
            raise _bad(self, f"expected 4 bytes, got {len(data)}")
        bits = int.from_bytes(data, "big")
        if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:
            # NaN: build the double by hand so a signalling NaN is not quietened by the conversion.
            dbits = ((bits & 0x80000000) << 32) | (0x7FF << 52) | ((bits & 0x007FFFFF) << 29)
            return _F64.unpack(dbits.to_bytes(8, "big"))[0]
        return _F32.unpack(data)[0]

    def _encode(self, value):
        if not isinstance(value, (float, int)) or isinstance(value, bool):
            raise _bad(self, f"expected float, got {type(value).__name__}")
        value = float(value)
        if math.isnan(value):
            dbits = int.from_bytes(_F64.pack(value), "big")
            mant = (dbits >> 29) & 0x007FFFFF
            if mant == 0:
                mant = 0x400000
            return (((dbits >> 32) & 0x80000000) | 0x7F800000 | mant).to_bytes(4, "big")
        try:
            return _F32.pack(value)
        except (OverflowError, struct.error):
            raise _bad(self, f"{value!r} is outside the float32 range") from None

    def _json(self, value):
        return _float32_json(value)

    def _sort_key(self, data):
        return _float_order(_F32.unpack(data)[0])


class DoubleType(_Simple):
    __slots__ = ()
    marshal_class = "DoubleType"

    def _decode(self, data):
        if len(data) != 8:
            raise _bad(self, f"expected 8 bytes, got {len(data)}")
        return _F64.unpack(data)[0]

    def _encode(self, value):
        if not isinstance(value, (float, int)) or isinstance(value, bool):
            raise _bad(self, f"expected float, got {type(value).__name__}")
        return _F64.pack(float(value))

    def _json(self, value):
        return _double_json(value)

    def _sort_key(self, data):
        return _float_order(_F64.unpack(data)[0])


class UuidType(_Simple):
    """uuid and timeuuid (timeuuid values must be version 1 to be encoded)."""
    __slots__ = ()

    def _marshal(self, ctx):
        return MARSHAL_PACKAGE + ("TimeUUIDType" if self.kind == "timeuuid" else "UUIDType")

    def _decode(self, data):
        if len(data) != 16:
            raise _bad(self, f"expected 16 bytes, got {len(data)}")
        return uuid.UUID(bytes=data)

    def _encode(self, value):
        if isinstance(value, str):
            try:
                value = uuid.UUID(value)
            except ValueError:
                raise _bad(self, f"not a UUID: {value!r}") from None
        if not isinstance(value, uuid.UUID):
            raise _bad(self, f"expected UUID, got {type(value).__name__}")
        if self.kind == "timeuuid" and value.version != 1:
            raise _bad(self, f"{value} is not a version 1 (time-based) UUID")
        return value.bytes

    def _json(self, value):
        return str(value)

    def _sort_key(self, data):
        msb = int.from_bytes(data[:8], "big")
        version = (msb >> 12) & 0xF
        if version == 1:
            ts = ((msb & 0x0FFF) << 48) | (((msb >> 16) & 0xFFFF) << 32) | (msb >> 32)
        else:
            ts = msb
        if self.kind == "timeuuid":
            return (ts, _signed_bytes_key(data[8:]))
        return (version, ts, _signed_bytes_key(data[8:]))


class InetType(_Simple):
    __slots__ = ()
    marshal_class = "InetAddressType"

    def _decode(self, data):
        if len(data) == 4:
            return ipaddress.IPv4Address(data)
        if len(data) == 16:
            return ipaddress.IPv6Address(data)
        raise _bad(self, f"expected 4 or 16 bytes, got {len(data)}")

    def _encode(self, value):
        if isinstance(value, str):
            try:
                value = ipaddress.ip_address(value)
            except ValueError:
                raise _bad(self, f"not an IP address: {value!r}") from None
        if not isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            raise _bad(self, f"expected IPv4Address/IPv6Address, got {type(value).__name__}")
        return value.packed

    def _json(self, value):
        return str(value)


_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH_DATE_ORDINAL = _EPOCH_DATE.toordinal()
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class DateType(_Simple):
    """date: u32 days since 1970-01-01 offset by 2^31."""
    __slots__ = ()
    marshal_class = "SimpleDateType"

    def _decode(self, data):
        if len(data) != 4:
            raise _bad(self, f"expected 4 bytes, got {len(data)}")
        days = int.from_bytes(data, "big") - (1 << 31)
        ordinal = days + _EPOCH_DATE_ORDINAL
        if 1 <= ordinal <= datetime.date.max.toordinal():
            return datetime.date.fromordinal(ordinal)
        return CqlDate(days)

    def _encode(self, value):
        if isinstance(value, CqlDate):
            days = value.days
        elif isinstance(value, datetime.datetime):
            raise _bad(self, "expected a date, got a datetime (use .date())")
        elif isinstance(value, datetime.date):
            days = value.toordinal() - _EPOCH_DATE_ORDINAL
        elif _is_int(value):
            days = value
        else:
            raise _bad(self, f"expected date, got {type(value).__name__}")
        if not _INT32_MIN <= days <= _INT32_MAX:
            raise _bad(self, f"{days} days is out of range")
        return (days + (1 << 31)).to_bytes(4, "big")

    def _json(self, value):
        return str(value) if isinstance(value, CqlDate) else value.isoformat()


class TimeType(_Simple):
    """time: i64 nanoseconds since midnight; decodes to CqlTime."""
    __slots__ = ()
    marshal_class = "TimeType"

    def _decode(self, data):
        if len(data) != 8:
            raise _bad(self, f"expected 8 bytes, got {len(data)}")
        return CqlTime(_I64.unpack(data)[0])

    def _encode(self, value):
        if isinstance(value, CqlTime):
            n = value.nanoseconds
        elif isinstance(value, datetime.time):
            n = CqlTime.from_time(value).nanoseconds
        elif _is_int(value):
            n = value
        else:
            raise _bad(self, f"expected CqlTime, got {type(value).__name__}")
        if not _INT64_MIN <= n <= _INT64_MAX:
            raise _bad(self, f"{n} out of range")
        return _I64.pack(n)

    def _json(self, value):
        return str(value)

    def _sort_key(self, data):
        return _I64.unpack(data)[0]


class TimestampType(_Simple):
    """timestamp: i64 milliseconds since the epoch; an aware UTC datetime when representable."""
    __slots__ = ()
    marshal_class = "TimestampType"

    def _decode(self, data):
        if len(data) != 8:
            raise _bad(self, f"expected 8 bytes, got {len(data)}")
        ms = _I64.unpack(data)[0]
        try:
            return _EPOCH + datetime.timedelta(milliseconds=ms)
        except OverflowError:
            return CqlTimestamp(ms)

    def _encode(self, value):
        if isinstance(value, CqlTimestamp):
            ms = value.millis
        elif isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.timezone.utc)   # naive datetimes are taken as UTC
            d = value - _EPOCH
            ms = d.days * 86_400_000 + d.seconds * 1000 + d.microseconds // 1000
        elif _is_int(value):
            ms = value
        else:
            raise _bad(self, f"expected datetime, got {type(value).__name__}")
        if not _INT64_MIN <= ms <= _INT64_MAX:
            raise _bad(self, f"{ms} ms out of range")
        return _I64.pack(ms)

    def _json(self, value):
        if isinstance(value, CqlTimestamp):
            return str(value)
        d = value - _EPOCH
        return _format_millis(d.days * 86_400_000 + d.seconds * 1000 + d.microseconds // 1000)

    def _sort_key(self, data):
        return _I64.unpack(data)[0]


class DurationType(_Simple):
    """duration: zig-zag vints months (i32), days (i32), nanoseconds (i64)."""
    __slots__ = ()
    marshal_class = "DurationType"

    def _decode(self, data):
        months, p = read_vint(data, 0)
        days, p = read_vint(data, p)
        nanos, p = read_vint(data, p)
        if p != len(data):
            raise _bad(self, f"{len(data) - p} bytes after the three vints", p)
        if not (_INT32_MIN <= months <= _INT32_MAX and _INT32_MIN <= days <= _INT32_MAX):
            raise _bad(self, "months or days out of int32 range")
        return Duration(months, days, nanos)

    def _encode(self, value):
        if isinstance(value, datetime.timedelta):
            value = Duration(0, 0, (value.days * 86400 + value.seconds) * _NANOS_PER_SECOND
                             + value.microseconds * 1000)
        if not isinstance(value, Duration):
            raise _bad(self, f"expected Duration, got {type(value).__name__}")
        m, d, n = value.months, value.days, value.nanoseconds
        if not (_is_int(m) and _is_int(d) and _is_int(n)):
            raise _bad(self, "months, days and nanoseconds must be ints")
        if not (_INT32_MIN <= m <= _INT32_MAX and _INT32_MIN <= d <= _INT32_MAX and _INT64_MIN <= n <= _INT64_MAX):
            raise _bad(self, f"{value!r} out of range")
        if (m < 0 or d < 0 or n < 0) and (m > 0 or d > 0 or n > 0):
            raise _bad(self, f"{value!r}: months, days and nanoseconds must all have the same sign")
        return encode_vint(m) + encode_vint(d) + encode_vint(n)

    def _json(self, value):
        return str(value)


class EmptyType(_Simple):
    """The compact-storage placeholder type: its only value is zero bytes (EMPTY)."""
    __slots__ = ()
    marshal_class = "EmptyType"

    def _decode(self, data):
        raise _bad(self, f"expected no bytes, got {len(data)}")

    def _encode(self, value):
        raise _bad(self, f"the only value is EMPTY, got {value!r}")


class CustomType(CqlType):
    """A custom (non-CQL) marshal type, kept as raw bytes. ``class_name`` is the marshal string."""
    __slots__ = ("class_name",)
    empty_is_value = True

    def __init__(self, class_name: str, fixed_length: int | None = None):
        super().__init__("custom", "'" + class_name.replace("'", "''") + "'", fixed_length)
        object.__setattr__(self, "class_name", class_name)

    def _key(self):
        return (self.kind, self.class_name, self.fixed_length)

    def _marshal(self, ctx):
        return self.class_name

    def _decode(self, data):
        if self.fixed_length is not None and len(data) != self.fixed_length:
            raise _bad(self, f"expected {self.fixed_length} bytes, got {len(data)}")
        return data

    def _encode(self, value):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise _bad(self, f"expected bytes, got {type(value).__name__}")
        return bytes(value)

    def _json(self, value):
        return "0x" + bytes(value).hex()


ASCII = AsciiType("ascii")
TEXT = TextType("text")
BLOB = BlobType("blob")
BOOLEAN = BooleanType("boolean", 1)
TINYINT = IntegerType("tinyint", 1, None, "ByteType")
SMALLINT = IntegerType("smallint", 2, None, "ShortType")
INT = IntegerType("int", 4, 4, "Int32Type")
BIGINT = IntegerType("bigint", 8, 8, "LongType")
COUNTER = CounterType("counter")
VARINT = VarintType("varint")
DECIMAL = DecimalType("decimal")
FLOAT = FloatType("float", 4)
DOUBLE = DoubleType("double", 8)
UUID = UuidType("uuid", 16)
TIMEUUID = UuidType("timeuuid", 16)
INET = InetType("inet")
DATE = DateType("date")
TIME = TimeType("time")
TIMESTAMP = TimestampType("timestamp", 8)
DURATION = DurationType("duration")
EMPTY_TYPE = EmptyType("empty", 0)

NATIVE_TYPES = {t.kind: t for t in (ASCII, TEXT, BLOB, BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, COUNTER, VARINT,
                                    DECIMAL, FLOAT, DOUBLE, UUID, TIMEUUID, INET, DATE, TIME, TIMESTAMP,
                                    DURATION, EMPTY_TYPE)}
_CQL_KEYWORDS = dict(NATIVE_TYPES, varchar=TEXT)


# --- collections --------------------------------------------------------------------------------------------

def _hashable_values(t: CqlType) -> bool:
    """Whether decoded values of ``t`` are hashable (decides CqlMap vs CqlPairs for map keys)."""
    if t.kind in ("list", "map", "vector"):
        return False
    if t.kind in ("set", "tuple", "udt", "composite"):
        return all(_hashable_values(s) for s in t.subtypes)
    return True


class _Collection(CqlType):
    __slots__ = ()
    _cql_name = ""
    _marshal_name = ""

    def _make_cql(self, parts, multicell):
        body = f"{self._cql_name}<{', '.join(p.cql for p in parts)}>"
        return body if multicell else f"frozen<{body}>"

    def _marshal(self, ctx):
        inner = ",".join(s._marshal("multicell" if self.multicell else "frozen") for s in self.subtypes)
        body = f"{MARSHAL_PACKAGE}{self._marshal_name}({inner})"
        if not self.multicell and ctx != "frozen":
            return f"{MARSHAL_PACKAGE}FrozenType({body})"
        return body

    def _decode(self, data):
        count, pos = _read_i32_len(self, data, 0, "element count")
        if count < 0:
            raise _bad(self, f"negative element count {count}", 0)
        return self._from_serialized(data, pos, count)

    def _check_end(self, data, pos):
        if pos != len(data):
            raise _bad(self, f"{len(data) - pos} bytes after the last element", pos)

    def _decode_elem(self, t, b):
        return None if b is None else t.decode(b)

    def _encode_elem(self, t, v):
        return None if v is None else t.encode(v)


class ListType(_Collection):
    __slots__ = ()
    _cql_name = "list"
    _marshal_name = "ListType"

    def __init__(self, element: CqlType, multicell: bool = False):
        element = element.freeze()
        super().__init__("list", self._make_cql((element,), multicell), None, multicell, (element,))

    @property
    def element_type(self):
        return self.subtypes[0]

    def freeze(self):
        return self if not self.multicell else ListType(self.subtypes[0], False)

    def _from_serialized(self, data, pos, count):
        elems, pos = read_length_prefixed(data, pos, count, "element", self.cql)
        self._check_end(data, pos)
        t = self.subtypes[0]
        return [self._decode_elem(t, b) for b in elems]

    def _encode(self, value):
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise _bad(self, f"expected a list, got {type(value).__name__}")
        t = self.subtypes[0]
        items = [self._encode_elem(t, v) for v in value]
        return _I32.pack(len(items)) + b"".join(_frame(b) for b in items)

    def _json(self, value):
        t = self.subtypes[0]
        return [t.to_json(v) for v in value]

    def _sort_key(self, data):
        elems, _ = read_length_prefixed(data, 4, _I32.unpack_from(data, 0)[0], "element", self.cql)
        t = self.subtypes[0]
        return tuple((0,) if b is None else t.sort_key(b) for b in elems)

    @property
    def path_type(self):
        return TIMEUUID if self.multicell else None

    def element_value_type(self, path):
        if not self.multicell:
            return super().element_value_type(path)
        return self.subtypes[0]

    def decode_cells(self, cells):
        if not self.multicell:
            return super().decode_cells(cells)
        t = self.subtypes[0]
        return [t.decode(v) for _, v in cells]

    def encode_cells(self, value):
        if not self.multicell:
            return super().encode_cells(value)
        t = self.subtypes[0]
        values = [t.encode(v) for v in value]
        return [(u.bytes, v) for u, v in zip(_new_timeuuids(len(values)), values)]


def _sorted_unique(t: CqlType, encoded: list, what: str) -> list:
    """Encoded values sorted in ``t``'s comparison order, duplicates (same bytes) rejected."""
    out = sorted(encoded, key=lambda b: t.sort_key(b))
    for a, b in zip(out, out[1:]):
        if a == b:
            raise _bad(t, f"duplicate {what} {t.decode(a)!r}")
    return out


class SetType(_Collection):
    __slots__ = ()
    _cql_name = "set"
    _marshal_name = "SetType"

    def __init__(self, element: CqlType, multicell: bool = False):
        element = element.freeze()
        super().__init__("set", self._make_cql((element,), multicell), None, multicell, (element,))

    @property
    def element_type(self):
        return self.subtypes[0]

    def freeze(self):
        return self if not self.multicell else SetType(self.subtypes[0], False)

    def _from_serialized(self, data, pos, count):
        elems, pos = read_length_prefixed(data, pos, count, "element", self.cql)
        self._check_end(data, pos)
        t = self.subtypes[0]
        return CqlSet(self._decode_elem(t, b) for b in elems)

    def _encoded_elements(self, value):
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise _bad(self, f"expected a set, got {type(value).__name__}")
        t = self.subtypes[0]
        encoded = []
        for v in value:
            if v is None:
                raise _bad(self, "None is not a set element")
            encoded.append(t.encode(v))
        if isinstance(value, CqlSet):
            return encoded
        return _sorted_unique(t, encoded, "set element")

    def _encode(self, value):
        items = self._encoded_elements(value)
        return _I32.pack(len(items)) + b"".join(_frame(b) for b in items)

    def _json(self, value):
        t = self.subtypes[0]
        return [t.to_json(v) for v in value]

    _sort_key = ListType._sort_key

    @property
    def path_type(self):
        return self.subtypes[0] if self.multicell else None

    def element_value_type(self, path):
        if not self.multicell:
            return super().element_value_type(path)
        return None

    def decode_cells(self, cells):
        if not self.multicell:
            return super().decode_cells(cells)
        t = self.subtypes[0]
        return CqlSet(t.decode(p) for p, _ in cells)

    def encode_cells(self, value):
        if not self.multicell:
            return super().encode_cells(value)
        return [(p, b"") for p in self._encoded_elements(value)]


class MapType(_Collection):
    __slots__ = ()
    _cql_name = "map"
    _marshal_name = "MapType"

    def __init__(self, key: CqlType, value: CqlType, multicell: bool = False):
        key, value = key.freeze(), value.freeze()
        super().__init__("map", self._make_cql((key, value), multicell), None, multicell, (key, value))

    @property
    def key_type(self):
        return self.subtypes[0]

    @property
    def value_type(self):
        return self.subtypes[1]

    def freeze(self):
        return self if not self.multicell else MapType(self.subtypes[0], self.subtypes[1], False)

    def _build(self, pairs):
        if _hashable_values(self.subtypes[0]):
            return CqlMap(pairs)
        return CqlPairs(tuple(p) for p in pairs)

    def _from_serialized(self, data, pos, count):
        if count > (len(data) - pos) // 8 + 1:
            raise _bad(self, f"truncated: {count} entries cannot fit in {len(data) - pos} bytes", 0)
        elems, pos = read_length_prefixed(data, pos, 2 * count, "key/value", self.cql)
        self._check_end(data, pos)
        kt, vt = self.subtypes
        return self._build((self._decode_elem(kt, elems[2 * i]), self._decode_elem(vt, elems[2 * i + 1]))
                           for i in range(count))

    def _encoded_pairs(self, value):
        kt, vt = self.subtypes
        # CqlMap/CqlPairs come from decode and are in Cassandra's order already; anything else is sorted.
        trusted = isinstance(value, (CqlMap, CqlPairs))
        if isinstance(value, Mapping):
            pairs = value.items()
        elif isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise _bad(self, f"expected a mapping, got {type(value).__name__}")
        else:
            pairs = value
        encoded = []
        for pair in pairs:
            k, v = pair
            if k is None:
                raise _bad(self, "None is not a map key")
            encoded.append((kt.encode(k), self._encode_elem(vt, v)))
        if not trusted:
            encoded.sort(key=lambda kv: kt.sort_key(kv[0]))
            for a, b in zip(encoded, encoded[1:]):
                if a[0] == b[0]:
                    raise _bad(self, f"duplicate key {kt.decode(a[0])!r}")
        return encoded

    def _encode(self, value):
        pairs = self._encoded_pairs(value)
        return _I32.pack(len(pairs)) + b"".join(_frame(k) + _frame(v) for k, v in pairs)

    def _json(self, value):
        kt, vt = self.subtypes
        items = value.items()
        if kt.kind in ("ascii", "text"):
            return {kt.to_json(k): vt.to_json(v) for k, v in items}
        return [[kt.to_json(k), vt.to_json(v)] for k, v in items]

    def _sort_key(self, data):
        count = _I32.unpack_from(data, 0)[0]
        elems, _ = read_length_prefixed(data, 4, 2 * count, "key/value", self.cql)
        kt, vt = self.subtypes
        return tuple(((0,) if elems[i] is None else (kt if i % 2 == 0 else vt).sort_key(elems[i]))
                     for i in range(len(elems)))

    @property
    def path_type(self):
        return self.subtypes[0] if self.multicell else None

    def element_value_type(self, path):
        if not self.multicell:
            return super().element_value_type(path)
        return self.subtypes[1]

    def decode_cells(self, cells):
        if not self.multicell:
            return super().decode_cells(cells)
        kt, vt = self.subtypes
        return self._build((kt.decode(p), vt.decode(v)) for p, v in cells)

    def encode_cells(self, value):
        if not self.multicell:
            return super().encode_cells(value)
        out = self._encoded_pairs(value)
        for k, v in out:
            if v is None:
                raise _bad(self, f"None value for key {self.subtypes[0].decode(k)!r}")
        return out


class TupleType(CqlType):
    """tuple<...>: always frozen. Fields are i32-length-prefixed, no count; missing trailing fields are None."""
    __slots__ = ()

    def __init__(self, fields):
        fields = tuple(f.freeze() for f in fields)
        if not fields:
            raise SchemaError("a tuple needs at least one field")
        super().__init__("tuple", "frozen<tuple<" + ", ".join(f.cql for f in fields) + ">>", None, False, fields)

    def _marshal(self, ctx):
        return f"{MARSHAL_PACKAGE}TupleType(" + ",".join(s._marshal("frozen") for s in self.subtypes) + ")"

    def _split(self, data):
        # Fields missing at the end are nulls (fields added to a UDT after the value was written).
        fields, _ = read_length_prefixed(data, 0, None, "field", self.cql)
        if len(fields) > len(self.subtypes):
            raise _bad(self, f"{len(fields)} fields, the type has {len(self.subtypes)}")
        return fields

    def _decode(self, data):
        raw = self._split(data)
        vals = [None if b is None else t.decode(b) for t, b in zip(self.subtypes, raw)]
        return tuple(vals + [None] * (len(self.subtypes) - len(vals)))

    def _encode(self, value):
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise _bad(self, f"expected a tuple, got {type(value).__name__}")
        value = tuple(value)
        if len(value) > len(self.subtypes):
            raise _bad(self, f"{len(value)} values for {len(self.subtypes)} fields")
        value = value + (None,) * (len(self.subtypes) - len(value))
        return b"".join(_frame(None if v is None else t.encode(v)) for t, v in zip(self.subtypes, value))

    def _json(self, value):
        return [t.to_json(v) for t, v in zip(self.subtypes, value)]

    def _sort_key(self, data):
        return tuple((0,) if b is None else t.sort_key(b) for t, b in zip(self.subtypes, self._split(data)))


_IDENT_RE = re.compile(r"[a-z][a-z0-9_]*\Z")


def _maybe_quote(name: str) -> str:
    if _IDENT_RE.match(name) and name not in _RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


# Reserved CQL keywords that must be quoted when used as names (a subset relevant to type/field names).
_RESERVED = frozenset(
    "add aggregate all allow alter and apply asc authorize batch begin by columnfamily create default delete "
    "desc describe drop entries execute from full grant if in index infinity insert into is keyspace limit "
    "materialized mbean mbeans modify nan norecursive not null of on or order primary rename replace revoke "
    "schema select set table to token truncate unlogged unset update use using view where with".split())


class UdtType(CqlType):
    """A user-defined type. ``keyspace``, ``name``, ``field_names``; ``subtypes`` are the field types."""
    __slots__ = ("keyspace", "name", "field_names")

    def __init__(self, keyspace, name, field_names, field_types, multicell=False):
        field_names = tuple(field_names)
        field_types = tuple(t.freeze() for t in field_types)
        if len(field_names) != len(field_types):
            raise SchemaError(f"UDT {keyspace}.{name}: {len(field_names)} field names, {len(field_types)} types")
        if len(set(field_names)) != len(field_names):
            raise SchemaError(f"UDT {keyspace}.{name}: duplicate field names")
        q = _maybe_quote(name)
        super().__init__("udt", q if multicell else f"frozen<{q}>", None, multicell, field_types)
        object.__setattr__(self, "keyspace", keyspace)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "field_names", field_names)

    def _key(self):
        return (self.kind, self.multicell, self.keyspace, self.name, self.field_names, self.subtypes)

    def _udt_args(self):
        return (self.keyspace, self.name, self.field_names, self.subtypes, self.multicell)

    @property
    def field_types(self):
        return self.subtypes

    def freeze(self):
        return self if not self.multicell else UdtType(self.keyspace, self.name, self.field_names,
                                                       self.subtypes, False)

    def _with_multicell(self, multicell):
        if multicell == self.multicell:
            return self
        return UdtType(self.keyspace, self.name, self.field_names, self.subtypes, multicell)

    def _marshal(self, ctx):
        inner = "multicell" if self.multicell else "frozen"
        fields = "".join(f",{n.encode().hex()}:{t._marshal(inner)}" for n, t in zip(self.field_names, self.subtypes))
        body = f"{MARSHAL_PACKAGE}UserType({self.keyspace},{self.name.encode().hex()}{fields})"
        if not self.multicell and ctx != "frozen":
            return f"{MARSHAL_PACKAGE}FrozenType({body})"
        return body

    _split = TupleType._split

    def _decode(self, data):
        raw = self._split(data)
        vals = [None if b is None else t.decode(b) for t, b in zip(self.subtypes, raw)]
        present = len(vals)
        vals += [None] * (len(self.subtypes) - present)
        return UdtValue._decoded(self.field_names, vals, present)

    def _values(self, value):
        if isinstance(value, Mapping):
            unknown = [k for k in value.keys() if k not in self.field_names]
            if unknown:
                raise _bad(self, f"unknown field(s) {unknown}")
            vals = [value.get(n) for n in self.field_names]
        elif isinstance(value, (tuple, list)):
            if len(value) > len(self.subtypes):
                raise _bad(self, f"{len(value)} values for {len(self.subtypes)} fields")
            vals = list(value) + [None] * (len(self.subtypes) - len(value))
        else:
            raise _bad(self, f"expected a mapping, got {type(value).__name__}")
        return vals

    def _encode(self, value):
        vals = self._values(value)
        n = len(vals)
        present = getattr(value, "present", None) if isinstance(value, UdtValue) else None
        if present is not None and all(v is None for v in vals[present:]):
            n = present      # keep the field count the bytes had (values from before ALTER TYPE ADD)
        return b"".join(_frame(None if v is None else t.encode(v))
                        for t, v in zip(self.subtypes[:n], vals[:n]))

    def _json(self, value):
        return {n: t.to_json(value.get(n) if isinstance(value, Mapping) else None)
                for n, t in zip(self.field_names, self.subtypes)}

    _sort_key = TupleType._sort_key

    @property
    def path_type(self):
        return SMALLINT if self.multicell else None

    def _field_index(self, path) -> int:
        path = bytes(path)
        if len(path) != 2:
            raise _bad(self, f"a UDT cell path is a 2-byte field index, got {len(path)} bytes")
        i = _I16.unpack(path)[0]
        if not 0 <= i < len(self.subtypes):
            raise _bad(self, f"cell path names field {i}, the type has {len(self.subtypes)}")
        return i

    def element_value_type(self, path):
        if not self.multicell:
            return super().element_value_type(path)
        return self.subtypes[self._field_index(path)]

    def decode_cells(self, cells):
        if not self.multicell:
            return super().decode_cells(cells)
        vals = [None] * len(self.subtypes)
        for p, v in cells:
            i = self._field_index(p)
            vals[i] = self.subtypes[i].decode(v)
        return UdtValue._decoded(self.field_names, vals, None)

    def encode_cells(self, value):
        if not self.multicell:
            return super().encode_cells(value)
        vals = self._values(value)
        return [(_I16.pack(i), t.encode(v)) for i, (t, v) in enumerate(zip(self.subtypes, vals)) if v is not None]


def _rebuild_udt(keyspace, name, field_names, field_types, multicell):
    return UdtType(keyspace, name, field_names, field_types, multicell)


def udt_type(keyspace: str, name: str, field_names, field_types, frozen: bool = False) -> UdtType:
    """A user-defined type; non-frozen (multi-cell) unless ``frozen``."""
    return UdtType(keyspace, name, field_names, field_types, multicell=not frozen)


class VectorType(CqlType):
    """vector<T, n> (Cassandra 5.0): fixed-length T concatenated; variable-length T as uvint length + bytes."""
    __slots__ = ("dimension",)

    def __init__(self, element: CqlType, dimension: int):
        element = element.freeze()
        if dimension <= 0:
            raise SchemaError(f"vector dimension must be positive, got {dimension}")
        fixed = None if element.fixed_length is None else element.fixed_length * dimension
        super().__init__("vector", f"vector<{element.cql}, {dimension}>", fixed, False, (element,))
        object.__setattr__(self, "dimension", dimension)

    def _key(self):
        return (self.kind, self.subtypes, self.dimension)

    @property
    def element_type(self):
        return self.subtypes[0]

    def _marshal(self, ctx):
        return f"{MARSHAL_PACKAGE}VectorType({self.subtypes[0]._marshal('frozen')} , {self.dimension})"

    def _split(self, data):
        t = self.subtypes[0]
        n = self.dimension
        if t.fixed_length is not None:
            size = t.fixed_length
            if len(data) != size * n:
                raise _bad(self, f"expected {size * n} bytes, got {len(data)}")
            return [data[i * size:(i + 1) * size] for i in range(n)]
        out = []
        pos = 0
        for i in range(n):
            ln, p = read_uvint(data, pos)
            if p + ln > len(data):
                raise _bad(self, f"truncated: element {i} needs {ln} bytes at {p}, {len(data) - p} left", p)
            out.append(data[p:p + ln])
            pos = p + ln
        if pos != len(data):
            raise _bad(self, f"{len(data) - pos} bytes after the last element", pos)
        return out

    def _decode(self, data):
        t = self.subtypes[0]
        return [t.decode(b) for b in self._split(data)]

    def _encode(self, value):
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise _bad(self, f"expected a list, got {type(value).__name__}")
        value = list(value)
        if len(value) != self.dimension:
            raise _bad(self, f"{len(value)} values for dimension {self.dimension}")
        t = self.subtypes[0]
        parts = []
        for v in value:
            if v is None:
                raise _bad(self, "vector elements cannot be null")
            b = t.encode(v)
            if t.fixed_length is not None:
                if len(b) != t.fixed_length:
                    raise _bad(self, f"element {v!r} is not {t.fixed_length} bytes")
                parts.append(b)
            else:
                parts.append(encode_uvint(len(b)) + b)
        return b"".join(parts)

    def _json(self, value):
        t = self.subtypes[0]
        return [t.to_json(v) for v in value]

    def _sort_key(self, data):
        t = self.subtypes[0]
        return tuple(t.sort_key(b) for b in self._split(data))


class CompositeType(CqlType):
    """CompositeType(T1, ...): multi-column partition keys and legacy composites; decodes to a tuple."""
    __slots__ = ()

    def __init__(self, components):
        components = tuple(c.freeze() for c in components)
        m = f"{MARSHAL_PACKAGE}CompositeType(" + ",".join(c._marshal("top") for c in components) + ")"
        super().__init__("composite", "'" + m + "'", None, False, components)

    def _marshal(self, ctx):
        return self.cql[1:-1]

    def _decode(self, data):
        return composite_decode(self.subtypes, data)

    def _encode(self, value):
        return composite_encode(self.subtypes, value)

    def _json(self, value):
        return [t.to_json(v) for t, v in zip(self.subtypes, value)]

    def _sort_key(self, data):
        return tuple(t.sort_key(b) for t, b in zip(self.subtypes, composite_split(data)))


# ---------------------------------------------------------------------------------------------------------------
# Composite partition keys
# ---------------------------------------------------------------------------------------------------------------

def composite_split(data) -> list:
    """The component byte strings of a composite (u16 length, bytes, end-of-component byte per component)."""
    data = bytes(data)
    out = []
    pos = 0
    while pos < len(data):
        if pos + 2 > len(data):
            raise CqlValueError(f"composite: truncated component length at {pos}", position=pos)
        ln = int.from_bytes(data[pos:pos + 2], "big")
        end = pos + 2 + ln
        if end + 1 > len(data):
            raise CqlValueError(f"composite: component {len(out)} needs {ln} bytes and an end byte at {pos + 2}, "
                                f"{len(data) - pos - 2} left", position=pos)
        out.append(data[pos + 2:end])
        pos = end + 1
    return out


def composite_decode(types, data) -> tuple:
    """Composite partition-key bytes -> a tuple of values, one per type."""
    types = list(types)
    parts = composite_split(data)
    if len(parts) != len(types):
        raise CqlValueError(f"composite: {len(parts)} components for {len(types)} types", position=0)
    return tuple(t.decode(p) for t, p in zip(types, parts))


def composite_encode(types, values) -> bytes:
    """Values (one per type) -> composite bytes (u16 length + bytes + 0x00 per component)."""
    types = list(types)
    values = list(values)
    if len(values) != len(types):
        raise CqlValueError(f"composite: {len(values)} values for {len(types)} types")
    out = bytearray()
    for t, v in zip(types, values):
        b = t.encode(v)
        if len(b) > 0xFFFF:
            raise CqlValueError(f"composite: component of {len(b)} bytes is longer than 65535")
        out += len(b).to_bytes(2, "big") + b + b"\x00"
    return bytes(out)


# ---------------------------------------------------------------------------------------------------------------
# Parsing type strings
# ---------------------------------------------------------------------------------------------------------------

_MARSHAL_SIMPLE = {
    "AsciiType": ASCII, "UTF8Type": TEXT, "BytesType": BLOB, "BooleanType": BOOLEAN, "ByteType": TINYINT,
    "ShortType": SMALLINT, "Int32Type": INT, "LongType": BIGINT, "CounterColumnType": COUNTER,
    "IntegerType": VARINT, "DecimalType": DECIMAL, "FloatType": FLOAT, "DoubleType": DOUBLE, "UUIDType": UUID,
    "TimeUUIDType": TIMEUUID, "InetAddressType": INET, "SimpleDateType": DATE, "TimeType": TIME,
    "TimestampType": TIMESTAMP, "DurationType": DURATION, "EmptyType": EMPTY_TYPE,
    # Legacy pre-CQL3 timestamp: same bytes as TimestampType (only its comparator differs), so the same type.
    "DateType": TIMESTAMP,
}
# Known non-CQL marshal classes with a fixed value length.
_CUSTOM_FIXED = {"LexicalUUIDType": 16}
_MARSHAL_PARAMETERIZED = {"ListType", "SetType", "MapType", "TupleType", "UserType", "FrozenType",
                          "ReversedType", "CompositeType", "VectorType"}
_MARSHAL_NAME_RE = re.compile(r"\s*([A-Za-z0-9_.$+&\-]+)\s*")


def _marshal_short(name: str) -> str | None:
    """The class name without the marshal package, or None for a class of another package."""
    if name.startswith(MARSHAL_PACKAGE):
        return name[len(MARSHAL_PACKAGE):]
    if "." not in name:
        return name
    return None


def _looks_like_marshal(text: str) -> bool:
    m = _MARSHAL_NAME_RE.match(text)
    if not m:
        return False
    name = m.group(1)
    if name.startswith(MARSHAL_PACKAGE) or text[m.end():m.end() + 1] == "(":
        return True      # CQL type strings never have parentheses
    short = _marshal_short(name)
    if short is None:
        # Another package: a marshal string if it is a Java-style class path (lowercase package, Capital class).
        parts = name.split(".")
        return len(parts) > 2 and parts[-1][:1].isupper()
    return short in _MARSHAL_SIMPLE or short in _MARSHAL_PARAMETERIZED or short in _CUSTOM_FIXED \
        or (short[:1].isupper() and short.endswith("Type"))


class _MarshalParser:
    """Parser for marshal type strings (``TypeParser`` syntax)."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def error(self, msg):
        return SchemaError(f"cannot parse type {self.text!r} at {self.pos}: {msg}")

    def skip_ws(self):
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self):
        self.skip_ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, ch):
        if self.peek() != ch:
            raise self.error(f"expected {ch!r}")
        self.pos += 1

    def ident(self):
        m = _MARSHAL_NAME_RE.match(self.text, self.pos)
        if not m:
            raise self.error("expected a class name")
        self.pos = m.end()
        return m.group(1)

    def skip_balanced(self):
        """Skip a parenthesised parameter list; returns its text including the parentheses."""
        start = self.pos
        depth = 0
        while self.pos < len(self.text):
            c = self.text[self.pos]
            self.pos += 1
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    return self.text[start:self.pos]
        raise self.error("unbalanced parentheses")

    def parse(self) -> CqlType:
        t = self.parse_type()
        if self.peek():
            raise self.error("unexpected text after the type")
        return t

    def params(self) -> list:
        self.expect("(")
        out = []
        if self.peek() == ")":
            self.pos += 1
            return out
        while True:
            out.append(self.parse_type())
            c = self.peek()
            self.pos += 1
            if c == ")":
                return out
            if c != ",":
                raise self.error("expected ',' or ')'")

    def parse_type(self) -> CqlType:
        self.skip_ws()
        start = self.pos
        name = self.ident()
        short = _marshal_short(name)
        has_params = self.peek() == "("
        if short in _MARSHAL_SIMPLE and not has_params:
            return _MARSHAL_SIMPLE[short]
        if short in _CUSTOM_FIXED and not has_params:
            return CustomType(MARSHAL_PACKAGE + short, _CUSTOM_FIXED[short])
        if short in _MARSHAL_PARAMETERIZED and has_params:
            if short == "UserType":
                return self.user_type()
            if short == "VectorType":
                self.expect("(")
                elem = self.parse_type()
                self.expect(",")
                m = re.compile(r"\s*(\d+)\s*").match(self.text, self.pos)
                if not m:
                    raise self.error("expected a vector dimension")
                self.pos = m.end()
                self.expect(")")
                return VectorType(elem, int(m.group(1)))
            ps = self.params()
            return self.build(short, ps)
        # Anything else (unknown classes, DynamicCompositeType(a=>T), PartitionerDefinedOrder(...), ...) is a
        # custom type kept as raw bytes, named by its full text.
        if has_params:
            self.skip_ws()
            self.skip_balanced()
        full = self.text[start:self.pos].strip()
        if short is not None and "." not in full.split("(")[0]:
            full = MARSHAL_PACKAGE + full
        return CustomType(full)

    def build(self, short, ps) -> CqlType:
        def arity(n):
            if len(ps) != n:
                raise self.error(f"{short} takes {n} parameter(s), got {len(ps)}")
        if short == "ListType":
            arity(1)
            return ListType(ps[0], multicell=True)
        if short == "SetType":
            arity(1)
            return SetType(ps[0], multicell=True)
        if short == "MapType":
            arity(2)
            return MapType(ps[0], ps[1], multicell=True)
        if short == "TupleType":
            if not ps:
                raise self.error("TupleType needs parameters")
            return TupleType(ps)
        if short == "FrozenType":
            arity(1)
            return ps[0].freeze()
        if short == "ReversedType":
            arity(1)
            return ps[0]
        if short == "CompositeType":
            return CompositeType(ps)
        raise self.error(f"unexpected {short}")

    def user_type(self) -> CqlType:
        self.expect("(")
        keyspace = self.ident()
        self.expect(",")
        hexname = self.ident()
        names, types = [], []
        while True:
            c = self.peek()
            self.pos += 1
            if c == ")":
                break
            if c != ",":
                raise self.error("expected ',' or ')'")
            hexfield = self.ident()
            self.expect(":")
            names.append(hexfield)
            types.append(self.parse_type())
        try:
            name = bytes.fromhex(hexname).decode("utf-8")
            field_names = [bytes.fromhex(h).decode("utf-8") for h in names]
        except ValueError:
            raise self.error("UserType names must be hex-encoded UTF-8") from None
        return UdtType(keyspace, name, field_names, types, multicell=True)


_CQL_TOKEN_RE = re.compile(r"""\s*(?:
      (?P<qident>"(?:[^"]|"")*")
    | (?P<string>'(?:[^']|'')*')
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<number>\d+)
    | (?P<punct>[<>,.])
    )""", re.VERBOSE)


class _CqlParser:
    """Parser for CQL type strings (``frozen<map<text, int>>``)."""

    def __init__(self, text, keyspace, udts):
        self.text = text
        self.keyspace = keyspace
        self.udts = udts or {}
        self.tokens = []
        pos = 0
        text_end = len(text.rstrip())
        while pos < text_end:
            m = _CQL_TOKEN_RE.match(text, pos)
            if not m or m.end() == pos:
                raise SchemaError(f"cannot parse type {text!r}: unexpected character at {pos}")
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def error(self, msg):
        return SchemaError(f"cannot parse type {self.text!r}: {msg}")

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else (None, None)

    def next(self):
        tok = self.peek()
        if tok[0] is None:
            raise self.error("unexpected end")
        self.i += 1
        return tok

    def expect(self, value):
        kind, v = self.next()
        if v != value:
            raise self.error(f"expected {value!r}, got {v!r}")

    def parse(self):
        t = self.parse_type()
        if self.i != len(self.tokens):
            raise self.error(f"unexpected {self.peek()[1]!r}")
        return t

    def parse_type(self) -> CqlType:
        kind, v = self.next()
        if kind == "string":
            return _parse_marshal(v[1:-1].replace("''", "'"))
        if kind == "ident":
            low = v.lower()
            nxt = self.peek()[1]
            if nxt == "<":
                if low == "frozen":
                    self.expect("<")
                    t = self.parse_type()
                    self.expect(">")
                    return t.freeze()
                if low in ("list", "set"):
                    self.expect("<")
                    e = self.parse_type()
                    self.expect(">")
                    return (ListType if low == "list" else SetType)(e, multicell=True)
                if low == "map":
                    self.expect("<")
                    k = self.parse_type()
                    self.expect(",")
                    val = self.parse_type()
                    self.expect(">")
                    return MapType(k, val, multicell=True)
                if low == "tuple":
                    self.expect("<")
                    fields = [self.parse_type()]
                    while self.peek()[1] == ",":
                        self.next()
                        fields.append(self.parse_type())
                    self.expect(">")
                    return TupleType(fields)
                if low == "vector":
                    self.expect("<")
                    e = self.parse_type()
                    self.expect(",")
                    nk, n = self.next()
                    if nk != "number":
                        raise self.error(f"expected a vector dimension, got {n!r}")
                    self.expect(">")
                    return VectorType(e, int(n))
                raise self.error(f"unknown parameterized type {v!r}")
            if low in _CQL_KEYWORDS and nxt != ".":
                return _CQL_KEYWORDS[low]
            return self.user_type(low)
        if kind == "qident":
            return self.user_type(v[1:-1].replace('""', '"'))
        raise self.error(f"unexpected {v!r}")

    def user_type(self, first: str) -> CqlType:
        keyspace, name = self.keyspace, first
        if self.peek()[1] == ".":
            self.next()
            kind, v = self.next()
            if kind == "ident":
                name = v.lower()
            elif kind == "qident":
                name = v[1:-1].replace('""', '"')
            else:
                raise self.error(f"expected a type name after '{first}.'")
            keyspace = first
        if keyspace is not None:
            t = self.udts.get((keyspace, name))
        else:
            found = [t for (ks, n), t in self.udts.items() if n == name]
            if len(found) > 1:
                raise self.error(f"type name {name!r} is ambiguous without a keyspace")
            t = found[0] if found else None
        if t is None:
            where = f"{keyspace}.{name}" if keyspace is not None else name
            raise self.error(f"unknown user type {where}")
        if not isinstance(t, UdtType):
            raise self.error(f"{name!r} in the user types is not a UDT")
        return t._with_multicell(True)     # top level: non-frozen unless wrapped in frozen<>


def _parse_marshal(text: str) -> CqlType:
    return _MarshalParser(text).parse()


def marshal_is_reversed(text: str) -> bool:
    """Whether a marshal type string is ``ReversedType(...)`` (a DESC clustering column)."""
    m = _MARSHAL_NAME_RE.match(text)
    return bool(m) and _marshal_short(m.group(1)) == "ReversedType"


def parse_type(text: str, keyspace: str | None = None, udts: Mapping | None = None) -> CqlType:
    """Parse a CQL type string (``frozen<list<int>>``, UDT names resolved through ``udts``, keyed by
    (keyspace, name)) or a Cassandra marshal class string (``org.apache.cassandra.db.marshal.Int32Type``).
    Raises SchemaError for anything unparseable or an unknown UDT."""
    if not isinstance(text, str) or not text.strip():
        raise SchemaError(f"empty type string {text!r}")
    if not udts:
        return _parse_without_udts(text, keyspace)
    if _looks_like_marshal(text):
        return _parse_marshal(text)
    return _CqlParser(text, keyspace, udts).parse()


@functools.lru_cache(maxsize=4096)
def _parse_without_udts(text: str, keyspace: str | None) -> CqlType:
    # Types are immutable, so parsed strings can be shared (headers and schemas repeat the same few strings).
    if _looks_like_marshal(text):
        return _parse_marshal(text)
    return _CqlParser(text, keyspace, None).parse()
