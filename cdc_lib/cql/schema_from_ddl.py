"""Schema from CQL text: the output of ``cqlsh -e 'DESCRIBE SCHEMA'`` (best with ``WITH INTERNALS``).

Reads CREATE KEYSPACE / TYPE / TABLE / MATERIALIZED VIEW, ``USE``, ``ALTER TABLE ... ADD`` and
``ALTER TABLE ... DROP [USING TIMESTAMP t]``, DROP TABLE/TYPE/KEYSPACE; every other statement (INSERT,
CREATE INDEX, CREATE FUNCTION, GRANT, ...) is skipped. The table id must be given by the ``ID = <uuid>``
table option (DESCRIBE ... WITH INTERNALS prints it): commit-log mutations name tables only by id.

COMPACT STORAGE tables get the internal layout Cassandra 3.0+ gives them (``CreateTableStatement
.metadataBuilder``, ``CompactTables``), because that is what their mutations are written against:

* with clustering columns ("dense"): the columns as declared; if no regular column is declared, a regular
  column ``value`` of type ``empty`` is added. Flags: ``dense``, plus ``compound`` with 2+ clustering columns.
* without clustering columns ("static compact"): every declared non-key column becomes STATIC, and a
  clustering column ``column1 text`` plus a regular column ``value blob`` (``counter`` in counter tables)
  are added (names made unique as ``column2``/``value1``... if taken). No ``compound``/``dense`` flag.

Other tables have the ``compound`` flag; a table with counter columns also has ``counter``.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from cdc_lib.errors import SchemaError

from .masks import check_mask
from .schema import (CLUSTERING, DEFAULT_GC_GRACE_SECONDS, PARTITION_KEY, REGULAR, STATIC, ColumnMask,
                     ColumnMetadata, DroppedColumn, Schema, TableMetadata)
from .system_schema import name_uuid_from_bytes
from .types import CqlType, parse_type, udt_type

log = logging.getLogger(__name__)

_TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>--[^\n]*|//[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^']|'')*')
  | (?P<dollar>\$\$.*?\$\$)
  | (?P<qident>"(?:[^"]|"")*")
  | (?P<uuid>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![\w-]))
  | (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w.]))
  | (?P<word>[A-Za-z0-9_]+)
  | (?P<punct>.)
""", re.VERBOSE | re.DOTALL)


@dataclass
class _Tok:
    kind: str          # string, dollar, qident, uuid, number, word, punct
    text: str
    start: int
    end: int

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""


def _tokenize(text: str, source: str) -> list:
    toks = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        kind = m.lastgroup
        if kind == "punct" and (m.group() in ("'", '"') or text.startswith(("/*", "$$"), pos)):
            line = text.count("\n", 0, pos) + 1
            raise SchemaError(f"{source}:{line}: unterminated {m.group()!r} literal or comment")
        if kind not in ("ws", "comment"):
            toks.append(_Tok(kind, m.group(), m.start(), m.end()))
        pos = m.end()
    return toks


def _split_statements(toks: list) -> list:
    out, cur = [], []
    for t in toks:
        if t.kind == "punct" and t.text == ";":
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        out.append(cur)
    return out


@dataclass
class _Table:
    keyspace: str
    name: str
    columns: dict = field(default_factory=dict)      # name -> (type text, static)
    masks: dict = field(default_factory=dict)        # name -> ColumnMask (Cassandra 5 MASKED WITH)
    partition_key: list = field(default_factory=list)
    clustering: list = field(default_factory=list)
    desc: set = field(default_factory=set)
    table_id: Optional[uuid.UUID] = None
    cdc: bool = False
    gc_grace_seconds: int = DEFAULT_GC_GRACE_SECONDS
    compact: bool = False
    dropped: dict = field(default_factory=dict)      # name -> DroppedColumn
    line: int = 0


class _Statement:
    """A cursor over one statement's tokens."""

    def __init__(self, toks: list, text: str, source: str):
        self.toks = toks
        self.text = text
        self.source = source
        self.i = 0

    # --- navigation ---
    def peek(self, k: int = 0) -> Optional[_Tok]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def at_end(self) -> bool:
        return self.i >= len(self.toks)

    def next(self) -> _Tok:
        t = self.peek()
        if t is None:
            raise self.error("unexpected end of statement")
        self.i += 1
        return t

    def line(self, tok: Optional[_Tok] = None) -> int:
        tok = tok or self.peek() or (self.toks[-1] if self.toks else None)
        return self.text.count("\n", 0, tok.start) + 1 if tok else 0

    def error(self, message: str) -> SchemaError:
        return SchemaError(f"{self.source}:{self.line()}: {message}")

    def is_word(self, *words: str, k: int = 0) -> bool:
        t = self.peek(k)
        return t is not None and t.kind == "word" and t.upper in words

    def accept_words(self, *words: str) -> bool:
        """Consume the keyword sequence if it is next."""
        for k, w in enumerate(words):
            if not self.is_word(w, k=k):
                return False
        self.i += len(words)
        return True

    def expect_word(self, *words: str) -> None:
        if not self.accept_words(*words):
            got = self.peek().text if self.peek() else "end of statement"
            raise self.error(f"expected {' '.join(words)}, got {got!r}")

    def is_punct(self, p: str) -> bool:
        t = self.peek()
        return t is not None and t.kind == "punct" and t.text == p

    def accept_punct(self, p: str) -> bool:
        if self.is_punct(p):
            self.i += 1
            return True
        return False

    def expect_punct(self, p: str) -> None:
        if not self.accept_punct(p):
            got = self.peek().text if self.peek() else "end of statement"
            raise self.error(f"expected {p!r}, got {got!r}")

    # --- CQL pieces ---
    def identifier(self) -> str:
        """An identifier: unquoted ones are case-insensitive (lower-cased), quoted ones keep their case."""
        t = self.next()
        if t.kind == "qident":
            return t.text[1:-1].replace('""', '"')
        if t.kind == "word":
            return t.text.lower()
        raise self.error(f"expected an identifier, got {t.text!r}")

    def qualified_name(self, current_keyspace: Optional[str]) -> tuple:
        first = self.identifier()
        if self.accept_punct("."):
            return first, self.identifier()
        if current_keyspace is None:
            raise self.error(f"{first} is not qualified by a keyspace and no USE statement precedes it")
        return current_keyspace, first

    def if_not_exists(self) -> None:
        self.accept_words("IF", "NOT", "EXISTS")

    def type_text(self) -> str:
        """The source text of a CQL type: tokens up to a ',' or ')' outside angle brackets, or a keyword."""
        start = self.peek()
        if start is None:
            raise self.error("expected a type")
        depth = 0
        end = start
        while not self.at_end():
            t = self.peek()
            if t.kind == "punct":
                if t.text == "<":
                    depth += 1
                elif t.text == ">":
                    depth -= 1
                elif t.text in ",)" and depth == 0:
                    break
            elif depth == 0 and t is not start and t.kind == "word" and t.upper in ("STATIC", "PRIMARY", "MASKED"):
                break
            end = self.next()
        return self.text[start.start:end.end]

    def skip_value(self) -> str:
        """Skip one option value (literal, map, identifier...); returns its source text."""
        start = self.peek()
        if start is None:
            raise self.error("expected a value")
        if start.kind == "punct" and start.text in "{[(":
            closing = {"{": "}", "[": "]", "(": ")"}
            stack = []
            while True:
                t = self.next()
                if t.kind == "punct" and t.text in closing:
                    stack.append(closing[t.text])
                elif t.kind == "punct" and stack and t.text == stack[-1]:
                    stack.pop()
                    if not stack:
                        return self.text[start.start:t.end]
        self.i += 1
        return start.text


def _unquote_string(s: str) -> str:
    return s[1:-1].replace("''", "'") if s.startswith("'") else s


class _Loader:
    def __init__(self, source: str, allow_missing_ids: bool, warn_missing_ids: bool = True):
        self.source = source
        self.allow_missing_ids = allow_missing_ids
        self.warn_missing_ids = warn_missing_ids
        self.keyspace: Optional[str] = None
        self.keyspaces: set = set()
        self.types: dict = {}          # (ks, name) -> UdtType (non-frozen)
        self.tables: dict = {}         # (ks, name) -> _Table

    # --- statements ---
    def run(self, text: str) -> None:
        for toks in _split_statements(_tokenize(text, self.source)):
            st = _Statement(toks, text, self.source)
            try:
                self.statement(st)
            except SchemaError:
                raise
            except (ValueError, KeyError) as e:
                raise st.error(str(e)) from e

    def statement(self, st: _Statement) -> None:
        if st.accept_words("USE"):
            self.keyspace = st.identifier()
            return
        if st.accept_words("CREATE"):
            if st.accept_words("KEYSPACE") or st.accept_words("SCHEMA"):
                st.if_not_exists()
                self.keyspaces.add(st.identifier())
            elif st.accept_words("TYPE"):
                self.create_type(st)
            elif st.accept_words("TABLE") or st.accept_words("COLUMNFAMILY"):
                self.create_table(st)
            elif st.accept_words("MATERIALIZED", "VIEW"):
                self.create_view(st)
            return                     # indexes, functions, aggregates, triggers, roles: not needed
        if st.accept_words("ALTER"):
            if st.accept_words("TABLE") or st.accept_words("COLUMNFAMILY"):
                self.alter_table(st)
            elif st.accept_words("TYPE"):
                self.alter_type(st)
            return
        if st.accept_words("DROP"):
            self.drop(st)
            return
        # INSERT, UPDATE, DELETE, BEGIN/APPLY BATCH, GRANT, ...: data or permissions, not schema

    def create_type(self, st: _Statement) -> None:
        st.if_not_exists()
        ks, name = st.qualified_name(self.keyspace)
        st.expect_punct("(")
        names, types = [], []
        while not st.accept_punct(")"):
            names.append(st.identifier())
            at = st.peek()
            types.append(self.parse(st, st.type_text(), ks, at))
            st.accept_punct(",")
        self.types[(ks, name)] = udt_type(ks, name, names, types, False)

    def alter_type(self, st: _Statement) -> None:
        st.accept_words("IF", "EXISTS")
        ks, name = st.qualified_name(self.keyspace)
        udt = self.types.get((ks, name))
        if udt is None:
            raise st.error(f"ALTER TYPE of unknown type {ks}.{name}")
        names, types = list(udt.field_names), list(udt.subtypes)
        if st.accept_words("ADD"):
            st.accept_words("IF", "NOT", "EXISTS")
            names.append(st.identifier())
            at = st.peek()
            types.append(self.parse(st, st.type_text(), ks, at))
        elif st.accept_words("RENAME"):
            st.accept_words("IF", "EXISTS")
            while True:
                old = st.identifier()
                st.expect_word("TO")
                new = st.identifier()
                if old not in names:
                    raise st.error(f"RENAME of unknown field {old} in type {ks}.{name}")
                names[names.index(old)] = new
                if not st.accept_words("AND"):
                    break
        else:
            return
        self.types[(ks, name)] = udt_type(ks, name, names, types, False)

    def parse(self, st: _Statement, type_text: str, keyspace: str, at: Optional[_Tok] = None) -> CqlType:
        try:
            return parse_type(type_text, keyspace, self.types)
        except SchemaError as e:
            line = st.line(at) if at is not None else st.line()
            raise SchemaError(f"{self.source}:{line}: type {type_text!r}: {e}") from None

    def column_type(self, st: _Statement, keyspace: str) -> str:
        """A column's type text, checked now so an error names the column's own line."""
        at = st.peek()
        type_text = st.type_text()
        self.parse(st, type_text, keyspace, at)
        return type_text

    def create_table(self, st: _Statement) -> None:
        st.if_not_exists()
        first = st.peek()
        ks, name = st.qualified_name(self.keyspace)
        table = _Table(ks, name, line=st.line(first))
        st.expect_punct("(")
        while not st.accept_punct(")"):
            if st.is_word("PRIMARY") and st.is_word("KEY", k=1):
                st.i += 2
                self.primary_key(st, table)
            else:
                col = st.identifier()
                if col in table.columns:
                    raise st.error(f"column {col} defined twice in {ks}.{name}")
                type_text = self.column_type(st, ks)
                static = False
                while True:
                    if st.accept_words("STATIC"):
                        static = True
                    elif st.accept_words("PRIMARY", "KEY"):
                        table.partition_key = [col]
                    elif st.accept_words("MASKED", "WITH"):
                        table.masks[col] = _mask_call(st)
                    else:
                        break
                table.columns[col] = (type_text, static)
            if not st.accept_punct(","):
                st.expect_punct(")")
                break
        if st.accept_words("WITH"):
            self.table_options(st, table)
        self.tables[(ks, name)] = table

    def primary_key(self, st: _Statement, table: _Table) -> None:
        st.expect_punct("(")
        if st.accept_punct("("):
            table.partition_key = [st.identifier()]
            while st.accept_punct(","):
                table.partition_key.append(st.identifier())
            st.expect_punct(")")
        else:
            table.partition_key = [st.identifier()]
        table.clustering = []
        while st.accept_punct(","):
            table.clustering.append(st.identifier())
        st.expect_punct(")")

    def table_options(self, st: _Statement, table: _Table) -> None:
        while True:
            if st.accept_words("CLUSTERING", "ORDER", "BY"):
                st.expect_punct("(")
                while True:
                    col = st.identifier()
                    if st.accept_words("DESC"):
                        table.desc.add(col)
                    else:
                        st.accept_words("ASC")
                    if not st.accept_punct(","):
                        break
                st.expect_punct(")")
            elif st.accept_words("COMPACT", "STORAGE"):
                table.compact = True
            else:
                opt = st.identifier()
                st.expect_punct("=")
                value = st.skip_value()
                if opt == "id":
                    try:
                        table.table_id = uuid.UUID(_unquote_string(value))
                    except ValueError:
                        raise st.error(f"table option ID = {value} is not a UUID") from None
                elif opt == "cdc":
                    table.cdc = _unquote_string(value).lower() == "true"
                elif opt == "gc_grace_seconds":
                    if not value.isdigit():
                        raise st.error(f"table option gc_grace_seconds = {value}: a number of seconds (>= 0)")
                    table.gc_grace_seconds = int(value)
            if not st.accept_words("AND"):
                break
        if not st.at_end():
            raise st.error(f"unexpected {st.peek().text!r} after the table options")

    def create_view(self, st: _Statement) -> None:
        st.if_not_exists()
        first = st.peek()
        ks, name = st.qualified_name(self.keyspace)
        st.expect_word("AS", "SELECT")
        selected = None
        if not st.accept_punct("*"):
            selected = [st.identifier()]
            while st.accept_punct(","):
                selected.append(st.identifier())
        st.expect_word("FROM")
        base_ks, base_name = st.qualified_name(ks)
        base = self.tables.get((base_ks, base_name))
        while not st.at_end() and not (st.is_word("PRIMARY") and st.is_word("KEY", k=1)):
            st.next()                  # the WHERE clause
        if st.at_end():
            raise st.error(f"materialized view {ks}.{name} has no PRIMARY KEY")
        st.i += 2
        view = _Table(ks, name, line=st.line(first))
        self.primary_key(st, view)
        if st.accept_words("WITH"):
            self.table_options(st, view)
        if view.table_id is None:
            return                     # without an id its mutations cannot be matched: not a table for us
        if base is None:
            raise st.error(f"materialized view {ks}.{name} selects from unknown table {base_ks}.{base_name}")
        keys = set(view.partition_key) | set(view.clustering)
        for col in view.partition_key + view.clustering:
            if col not in base.columns:
                raise st.error(f"materialized view {ks}.{name}: key column {col} is not in {base_ks}.{base_name}")
        for col, (type_text, static) in base.columns.items():
            if static:                 # views never carry static columns
                continue
            if col in keys or selected is None or col in selected:
                view.columns[col] = (type_text, False)
        self.tables[(ks, name)] = view

    def alter_table(self, st: _Statement) -> None:
        st.accept_words("IF", "EXISTS")
        ks, name = st.qualified_name(self.keyspace)
        table = self.tables.get((ks, name))
        if table is None:
            raise st.error(f"ALTER TABLE of unknown table {ks}.{name}")
        if st.accept_words("ADD"):
            st.accept_words("IF", "NOT", "EXISTS")
            paren = st.accept_punct("(")
            while True:
                col = st.identifier()
                type_text = self.column_type(st, ks)
                static = st.accept_words("STATIC")
                table.columns[col] = (type_text, static)
                if not st.accept_punct(","):
                    break
            if paren:
                st.expect_punct(")")
        elif st.accept_words("DROP"):
            st.accept_words("IF", "EXISTS")
            paren = st.accept_punct("(")
            cols = [st.identifier()]
            while st.accept_punct(","):
                cols.append(st.identifier())
            if paren:
                st.expect_punct(")")
            when = None
            if st.accept_words("USING", "TIMESTAMP"):
                tok = st.next()
                if tok.kind != "number":
                    raise st.error(f"USING TIMESTAMP takes a number, got {tok.text!r}")
                when = int(tok.text)
            if when is None:
                # Cassandra stamps the drop with the time it runs; a file without the timestamp means "now".
                when = time.time_ns() // 1000
            for col in cols:
                if col not in table.columns:
                    raise st.error(f"ALTER TABLE {ks}.{name} DROP of unknown column {col}")
                if col in table.partition_key or col in table.clustering:
                    raise st.error(f"cannot drop primary key column {col} of {ks}.{name}")
                type_text, static = table.columns.pop(col)
                ctype = self.parse(st, type_text, ks)
                table.dropped[col] = DroppedColumn(col, ctype, when, STATIC if static else REGULAR)
        elif st.accept_words("RENAME"):
            while True:
                old = st.identifier()
                st.expect_word("TO")
                new = st.identifier()
                if old not in table.columns:
                    raise st.error(f"RENAME of unknown column {old} in {ks}.{name}")
                table.columns = {new if k == old else k: v for k, v in table.columns.items()}
                table.partition_key = [new if k == old else k for k in table.partition_key]
                table.clustering = [new if k == old else k for k in table.clustering]
                table.desc = {new if k == old else k for k in table.desc}
                if not st.accept_words("AND"):
                    break
        elif st.accept_words("WITH"):
            self.table_options(st, table)
        elif st.accept_words("ALTER"):     # ALTER col TYPE t (before 3.10)
            col = st.identifier()
            st.expect_word("TYPE")
            if col not in table.columns:
                raise st.error(f"ALTER of unknown column {col} in {ks}.{name}")
            table.columns[col] = (self.column_type(st, ks), table.columns[col][1])

    def drop(self, st: _Statement) -> None:
        if st.accept_words("TABLE") or st.accept_words("COLUMNFAMILY") or st.accept_words("MATERIALIZED", "VIEW"):
            st.accept_words("IF", "EXISTS")
            self.tables.pop(st.qualified_name(self.keyspace), None)
        elif st.accept_words("TYPE"):
            st.accept_words("IF", "EXISTS")
            self.types.pop(st.qualified_name(self.keyspace), None)
        elif st.accept_words("KEYSPACE") or st.accept_words("SCHEMA"):
            st.accept_words("IF", "EXISTS")
            ks = st.identifier()
            self.keyspaces.discard(ks)
            self.tables = {k: v for k, v in self.tables.items() if k[0] != ks}
            self.types = {k: v for k, v in self.types.items() if k[0] != ks}

    # --- building ---
    def build(self) -> Schema:
        schema = Schema()
        for (ks, name), udt in self.types.items():
            schema.types[(ks, name)] = udt
        for t in self.tables.values():
            meta = self.build_table(t)
            if meta.id in schema.tables:
                other = schema.tables[meta.id]
                raise SchemaError(f"{self.source}:{t.line}: table id {meta.id} of {meta.qualified_name} is "
                                  f"also the id of {other.qualified_name}")
            schema.add(meta)
        return schema

    def build_table(self, t: _Table) -> TableMetadata:
        qualified = f"{t.keyspace}.{t.name}"
        where = f"{self.source}:{t.line}"
        if not t.partition_key:
            raise SchemaError(f"{where}: table {qualified} has no PRIMARY KEY")
        for col in t.partition_key + t.clustering:
            if col not in t.columns:
                raise SchemaError(f"{where}: table {qualified}: key column {col} is not defined")
        for col in t.desc:
            if col not in t.clustering:
                raise SchemaError(f"{where}: table {qualified}: CLUSTERING ORDER names {col}, not a clustering column")
        table_id = t.table_id
        if table_id is None:
            if not self.allow_missing_ids:
                raise SchemaError(f"{where}: table {qualified} has no ID option: its commit-log mutations cannot "
                                  f"be matched to it (use DESCRIBE ... WITH INTERNALS, or allow_missing_ids)")
            table_id = name_uuid_from_bytes(t.keyspace.encode("utf-8") + t.name.encode("utf-8"))
            if self.warn_missing_ids:
                log.warning("%s: table %s has no ID option; using the made-up id %s, which no commit log will "
                            "contain", where, qualified, table_id)

        def typ(col):
            try:
                return parse_type(t.columns[col][0], t.keyspace, self.types)
            except SchemaError as e:
                raise SchemaError(f"{where}: {qualified}.{col}: {e}") from None

        pk = [ColumnMetadata(c, typ(c), PARTITION_KEY, i) for i, c in enumerate(t.partition_key)]
        ck = [ColumnMetadata(c, typ(c), CLUSTERING, i, c in t.desc) for i, c in enumerate(t.clustering)]
        keys = set(t.partition_key) | set(t.clustering)
        others = [(c, typ(c), static) for c, (_, static) in t.columns.items() if c not in keys]
        counter = any(ct.kind == "counter" for _, ct, _ in others)
        flags = set()
        if counter:
            flags.add("counter")
        statics = [(c, ct) for c, ct, s in others if s]
        regulars = [(c, ct) for c, ct, s in others if not s]
        if t.compact:
            if statics:
                raise SchemaError(f"{where}: {qualified}: static columns are not supported with COMPACT STORAGE")
            if any(ct.multicell for _, ct, _ in others):
                raise SchemaError(f"{where}: {qualified}: non-frozen collections are not supported with "
                                  f"COMPACT STORAGE")
            used = set(t.columns)
            if ck:                     # dense
                flags.add("dense")
                if len(ck) > 1:
                    flags.add("compound")
                if len(regulars) > 1:
                    raise SchemaError(f"{where}: {qualified}: COMPACT STORAGE with clustering columns allows at "
                                      f"most one other column, got {len(regulars)}")
                if not regulars:
                    regulars = [(_unique("value", used, first_bare=True), parse_type("empty"))]
            else:                      # static compact: user columns are static, plus column1/value
                if not regulars:
                    raise SchemaError(f"{where}: {qualified}: COMPACT STORAGE without clustering columns needs "
                                      f"at least one non-key column")
                statics, regulars = regulars, []
                ck = [ColumnMetadata(_unique("column", used, first_bare=False), parse_type("text"), CLUSTERING, 0)]
                value_type = parse_type("counter" if counter else "blob")
                regulars = [(_unique("value", used, first_bare=True), value_type)]
        else:
            flags.add("compound")
        # key columns in key order, then static and regular columns as declared (DESCRIBE declares them by
        # name, which is the order the system_schema sources give)
        columns = {c.name: c for c in pk + ck}
        columns.update((c, ColumnMetadata(c, ct, STATIC)) for c, ct in statics)
        columns.update((c, ColumnMetadata(c, ct, REGULAR)) for c, ct in regulars)
        for c, mask in t.masks.items():
            columns[c] = dataclasses.replace(columns[c], mask=check_mask(mask, columns[c].type,
                                                                         f"{where}: {qualified}.{c}"))
        return TableMetadata(t.keyspace, t.name, table_id, pk, ck, columns, dict(t.dropped), frozenset(flags),
                             t.cdc, t.gc_grace_seconds)


def _mask_call(st: "_Statement") -> ColumnMask:
    """``DEFAULT`` or ``[system.]mask_fn(literal, ...)`` after ``MASKED WITH`` (literals: numbers, 'strings',
    null)."""
    if st.accept_words("DEFAULT"):
        return ColumnMask("mask_default")
    name = st.identifier()
    if st.accept_punct("."):
        name = st.identifier()
    args: list = []
    st.expect_punct("(")
    while not st.accept_punct(")"):
        t = st.next()
        if t.kind == "number":
            args.append(float(t.text) if any(ch in t.text for ch in ".eE") else int(t.text))
        elif t.kind == "string":
            args.append(t.text[1:-1].replace("''", "'"))
        elif t.kind == "word" and t.upper == "NULL":
            args.append(None)
        else:
            raise st.error(f"mask {name}: argument {t.text!r} is not a number, a 'string' or null")
        if not st.accept_punct(","):
            st.expect_punct(")")
            break
    return ColumnMask(name.lower(), tuple(args))


def _unique(base: str, used: set, first_bare: bool) -> str:
    """CompactTables.DefaultNames: ``value``, ``value1``, ... / ``column1``, ``column2``, ... not yet used."""
    i = 0 if first_bare else 1
    while True:
        candidate = base if i == 0 else f"{base}{i}"
        i += 1
        if candidate not in used:
            used.add(candidate)
            return candidate


def load_cql_schema(text_or_path: Union[str, Path], *, allow_missing_ids: bool = False,
                    warn_missing_ids: bool = True, source: Optional[str] = None) -> Schema:
    """A Schema from CQL DDL text, or from the file at ``text_or_path`` (a Path, or a str naming a file).

    Raises SchemaError (with file:line) for statements it cannot read and for tables without an ``ID``
    option, unless ``allow_missing_ids`` (then the id is made up deterministically and, if
    ``warn_missing_ids``, a warning logged; SSTable readers take table ids from directories and need none).
    """
    text = None
    if isinstance(text_or_path, Path):
        path = text_or_path
    elif not any(ch in text_or_path for ch in "\n;("):   # no statement is that short: it names a file
        path = Path(text_or_path)
    else:
        path = None
        text = text_or_path
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise SchemaError(f"cannot read CQL schema {path}: {e}") from e
        source = source or str(path)
    loader = _Loader(source or "<cql>", allow_missing_ids, warn_missing_ids)
    loader.run(text)
    return loader.build()
