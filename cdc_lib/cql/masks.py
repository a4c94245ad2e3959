"""Cassandra 5 column masks (``CREATE TABLE ... (email text MASKED WITH mask_inner(1, 3), ...)``), applied to the
values change events carry, as Cassandra applies them to the rows a user without ``UNMASK`` reads.

The native functions, with Cassandra's rules (``null`` stays ``null``):

* ``mask_null()``: null.
* ``mask_default()``: a fixed value of the column's type: ``****`` for text, 0 for numbers, false, the epoch
  (dates, timestamps), the nil UUID, 0.0.0.0, an empty blob or collection; user types, tuples and vectors, which
  have no single default, become null.
* ``mask_replace(r)``: the literal ``r``.
* ``mask_inner(begin, end[, padding])`` (text): every character but the first ``begin`` and last ``end``
  becomes ``padding`` (``*``); a null count is 0.
* ``mask_outer(begin, end[, padding])`` (text): the first ``begin`` and last ``end`` characters become
  ``padding``.
* ``mask_hash([algorithm])``: the digest (SHA-256 unless named) of the value's serialized bytes, a blob.

A user-defined masking function cannot be computed outside Cassandra: a schema naming one is an error
(``check_mask``), not a column shipped in clear.
"""
from __future__ import annotations

import hashlib

from cdc_lib.errors import SchemaError

from .schema import ColumnMask, ColumnMetadata
from .types import CqlType, parse_type

BLOB = parse_type("blob")
_TEXT_KINDS = ("text", "ascii")
_FIXED_DEFAULTS = {"date": b"\x80\x00\x00\x00", "varint": b"\x00", "decimal": b"\x00\x00\x00\x00\x00",
                   "inet": b"\x00\x00\x00\x00", "duration": b"\x00\x00\x00", "blob": b"", "smallint": b"\x00\x00",
                   "tinyint": b"\x00", "time": b"\x00" * 8}
_EMPTY_COLLECTION = b"\x00\x00\x00\x00"
FUNCTIONS = ("mask_null", "mask_default", "mask_replace", "mask_inner", "mask_outer", "mask_hash")


def check_mask(mask: ColumnMask, t: CqlType, where: str) -> ColumnMask:
    """``mask`` if it can be applied to a column of type ``t``; SchemaError naming ``where`` otherwise."""
    f, args = mask.function, mask.args
    problem = None
    if f not in FUNCTIONS:
        problem = (f"masking function {f!r} is not one of Cassandra's ({', '.join(FUNCTIONS)}); a user-defined "
                   "mask cannot be computed outside Cassandra")
    elif f in ("mask_null", "mask_default") and args:
        problem = f"{f}() takes no argument"
    elif f in ("mask_inner", "mask_outer"):
        if t.kind not in _TEXT_KINDS:
            problem = f"{f} masks text columns, not {t.cql}"
        elif len(args) not in (2, 3) or not all(a is None or (isinstance(a, int) and a >= 0) for a in args[:2]):
            problem = f"{f}(begin, end[, padding]) takes two counts (>= 0 or null) and a padding character"
        elif len(args) == 3 and not (isinstance(args[2], str) and len(args[2]) == 1):
            problem = f"{f}: padding {args[2]!r} is not one character"
    elif f == "mask_replace":
        if len(args) != 1:
            problem = "mask_replace(replacement) takes one value"
        else:
            try:
                t.encode(args[0])
            except Exception as e:  # noqa: BLE001 - whatever the type refuses
                problem = f"mask_replace: {args[0]!r} is not a {t.cql} ({e})"
    elif f == "mask_hash":
        if len(args) > 1 or (args and (not isinstance(args[0], str) or
                                       args[0].lower().replace("-", "") not in hashlib.algorithms_available)):
            problem = f"mask_hash([algorithm]): unknown algorithm {args[0] if args else ''!r}"
    if problem:
        raise SchemaError(f"{where}: {problem}")
    return mask


def masked_json(col: ColumnMetadata, value) -> object:
    """The JSON form of ``value`` of column ``col`` as the events carry it: masked if the column has a mask."""
    mask = col.mask
    if mask is None:
        return col.type.to_json(value)
    if value is None:
        return None
    f, args = mask.function, mask.args
    t = col.type
    if f == "mask_null":
        return None
    if f == "mask_hash":
        algorithm = (args[0] if args else "sha256").lower().replace("-", "")
        return BLOB.to_json(hashlib.new(algorithm, t.encode(value)).digest())
    if f == "mask_default":
        return t.to_json(_default(t))
    if f == "mask_replace":
        return t.to_json(t.decode(t.encode(args[0])))
    begin, end = args[0] or 0, args[1] or 0
    pad = args[2] if len(args) == 3 else "*"
    n = len(value)
    if f == "mask_inner":
        keep_head, keep_tail = min(begin, n), min(end, n)
        if keep_head + keep_tail >= n:
            return value
        return value[:keep_head] + pad * (n - keep_head - keep_tail) + value[n - keep_tail:]
    # mask_outer
    head, tail = min(begin, n), min(end, n)
    if head + tail >= n:
        return pad * n
    return pad * head + value[head:n - tail] + pad * tail


def _default(t: CqlType):
    if t.kind in _TEXT_KINDS:
        return "****"
    if t.kind == "counter":
        return 0                # events carry a counter's total
    if t.kind in ("list", "set", "map"):
        return t.decode(_EMPTY_COLLECTION) if not t.multicell else _empty_multicell(t)
    if t.kind in _FIXED_DEFAULTS:
        return t.decode(_FIXED_DEFAULTS[t.kind])
    if t.fixed_length:
        return t.decode(b"\x00" * t.fixed_length)
    return None            # user types, tuples, vectors, custom types: no single default


def _empty_multicell(t: CqlType):
    return {} if t.kind == "map" else []
