"""Random schemas and random mutations over them, as model objects the reference encoder turns into the exact
bytes Cassandra writes (for the cell-log reader tests). Values are random bytes of the right length (the cell
log keeps values serialized, so only fixed/variable lengths matter to a decoder).

Covered: 0-3 clustering columns (fixed and variable, ASC/DESC), static columns, simple columns of fixed and
variable length, non-frozen list/set/map/UDT columns (complex: cell paths, complex deletions), dropped columns
(still named by old data), counters, tables with more than 64 columns (the large subset encoding), partition
deletions, static rows, row liveness with and without TTL (and cells using the row's timestamp/TTL), regular and
shadowable row deletions, cell tombstones, expiring cells, empty values, range tombstones with bounds and
boundaries (and null/empty bound values), empty updates, multi-table mutations, extreme timestamps and local
deletion times (messaging 13's unsigned ones past 2038).
"""
from __future__ import annotations

import random
import uuid

from cdc_lib.commitlog.model import (BoundKind, Cell, DeletionTime, LivenessInfo, Mutation, PartitionUpdate,
                                     RangeTombstoneMarker, Row)
from cdc_lib.commitlog.mutation import _column_order, finish_update
from cdc_lib.cql.schema import (CLUSTERING, PARTITION_KEY, REGULAR, STATIC, ColumnMetadata, DroppedColumn, Schema,
                                TableMetadata)
from cdc_lib.cql.types import parse_type as T
SIMPLE = ["ascii", "bigint", "blob", "boolean", "date", "decimal", "double", "duration", "float", "inet", "int",
          "smallint", "text", "time", "timestamp", "timeuuid", "tinyint", "uuid", "varint", "counter"]
KEYABLE = [t for t in SIMPLE if t not in ("duration", "counter")]


def _ident(rnd, used):
    while True:
        n = "c_" + "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rnd.randint(1, 9)))
        if rnd.random() < 0.05:
            n += "\u00e9"                            # non-ASCII column names are UTF-8 in the header
        if n not in used:
            used.add(n)
            return n


def _col_type(rnd, depth=0) -> str:
    r = rnd.random()
    if depth < 2 and r < 0.1:
        return f"frozen<list<{_col_type(rnd, depth + 1)}>>"
    if depth < 2 and r < 0.15:
        return f"frozen<map<{rnd.choice(KEYABLE)}, {_col_type(rnd, depth + 1)}>>"
    if depth < 2 and r < 0.2:
        return f"tuple<{rnd.choice(KEYABLE)}, {_col_type(rnd, depth + 1)}>"
    return rnd.choice([t for t in SIMPLE if t != "counter"])


def random_table(rnd: random.Random, i: int, keyspace: str = "ks") -> TableMetadata:
    used = set()
    cols = {}
    pk = [ColumnMetadata(_ident(rnd, used), T(rnd.choice(KEYABLE)), PARTITION_KEY, j)
          for j in range(rnd.randint(1, 2))]
    ck = [ColumnMetadata(_ident(rnd, used), T(rnd.choice(KEYABLE)), CLUSTERING, j, rnd.random() < 0.4)
          for j in range(rnd.choice([0, 1, 1, 2, 3]))]
    for c in pk + ck:
        cols[c.name] = c
    counter = rnd.random() < 0.1
    n_regular = rnd.choice([1, 2, 4, 7]) if rnd.random() < 0.9 else rnd.randint(64, 80)
    for _ in range(n_regular):
        if counter:
            typ = "counter"
        else:
            r = rnd.random()
            if r < 0.15:
                typ = f"{rnd.choice(['list', 'set'])}<{rnd.choice(KEYABLE)}>"
            elif r < 0.25:
                typ = f"map<{rnd.choice(KEYABLE)}, {rnd.choice(SIMPLE[:-1])}>"
            else:
                typ = _col_type(rnd)
        kind = STATIC if ck and not counter and rnd.random() < 0.15 else REGULAR
        c = ColumnMetadata(_ident(rnd, used), T(typ), kind)
        cols[c.name] = c
    dropped = {}
    if not counter and rnd.random() < 0.3:
        for _ in range(rnd.randint(1, 2)):
            typ = rnd.choice(["int", "text", "bigint", "list<int>", "map<text, blob>", "uuid"])
            name = _ident(rnd, used)
            dropped[name] = DroppedColumn(name, T(typ), 1_600_000_000_000_000)
    flags = frozenset({"compound", "counter"} if counter else {"compound"})
    return TableMetadata(keyspace, f"t{i}", uuid.UUID(int=rnd.getrandbits(128)), pk, ck, cols, dropped, flags)


def random_schema(rnd: random.Random) -> Schema:
    s = Schema()
    for i in range(rnd.randint(1, 3)):
        s.add(random_table(rnd, i))
    return s


class MutationGen:
    """Random valid mutations of ``schema``'s tables; ``mv`` 13 allows local deletion times past 2038."""

    def __init__(self, rnd: random.Random, schema: Schema, mv: int = 12):
        self.rnd = rnd
        self.schema = schema
        self.tables = list(schema.tables.values())
        self.mv = mv

    # -- times -------------------------------------------------------------------------------------------
    def ts(self):
        r = self.rnd.random()
        if r < 0.03:
            return self.rnd.choice([-(1 << 63) + 1, (1 << 63) - 1, 0, -1, 1])
        if r < 0.1:
            return self.rnd.randint(-(1 << 62), 1 << 62)
        return 1_700_000_000_000_000 + self.rnd.randint(-10**12, 10**12)

    def ldt(self):
        r = self.rnd.random()
        if self.mv >= 13 and r < 0.15:
            return self.rnd.randint(1 << 31, (1 << 32) - 3)     # unsigned, past 2038
        if r < 0.05:
            return self.rnd.choice([0, 1, (1 << 31) - 2])
        return 1_700_000_000 + self.rnd.randint(-10**6, 10**6)

    def ttl(self):
        return self.rnd.choice([1, 60, 3600, 86400, 630720000, self.rnd.randint(1, 10**6)])

    def deletion(self):
        return DeletionTime(self.ts(), self.ldt())

    # -- values ------------------------------------------------------------------------------------------
    def value(self, t) -> bytes:
        if self.rnd.random() < 0.05:
            return b""
        f = t.fixed_length
        if f is not None:
            return self.rnd.randbytes(f)
        n = self.rnd.choice([0, 1, 2, 5, 16, 40, 130, 300]) if self.rnd.random() < 0.97 else self.rnd.randint(0, 70000)
        return self.rnd.randbytes(n)

    def clustering(self, table, n=None, allow_null=False):
        out = []
        for c in table.clustering[:len(table.clustering) if n is None else n]:
            r = self.rnd.random()
            if allow_null and r < 0.05:
                out.append(None)
            elif r < 0.08:
                out.append(b"")
            else:
                f = c.type.fixed_length
                out.append(self.rnd.randbytes(f) if f is not None else
                           self.rnd.randbytes(self.rnd.choice([1, 3, 8, 20, 300])))
        return tuple(out)

    # -- rows --------------------------------------------------------------------------------------------
    def cells(self, table, kind, liveness):
        rnd = self.rnd
        cols = [c for c in table.columns.values() if c.kind == kind]
        cols += [d for d in table.dropped.values() if kind == REGULAR]
        cells, cdels = [], {}
        for col in cols:
            if rnd.random() < 0.4:
                continue
            t = col.type
            ts = liveness.timestamp if liveness is not None and rnd.random() < 0.5 else self.ts()
            if t.multicell:
                if rnd.random() < 0.35:
                    cdels[col.name] = self.deletion()
                paths = sorted({rnd.randbytes(rnd.choice([4, 8, 16])) for _ in range(rnd.randint(0, 3))})
                for p in paths:
                    cells.append(self.cell(col.name, t.subtypes[-1] if t.kind != "udt" else T("blob"), ts,
                                           liveness, path=p))
            else:
                cells.append(self.cell(col.name, t, ts, liveness))
        return cells, cdels

    def cell(self, name, t, ts, liveness, path=None):
        rnd = self.rnd
        r = rnd.random()
        if r < 0.15:
            return Cell(name, b"", ts, 0, self.ldt(), path, True)
        if r < 0.35:
            if liveness is not None and liveness.ttl and rnd.random() < 0.6:
                return Cell(name, self.value(t) if path is None else rnd.randbytes(3), ts, liveness.ttl,
                            liveness.local_expiration_time, path)
            return Cell(name, self.value(t) if path is None else rnd.randbytes(3), ts, self.ttl(), self.ldt(), path)
        value = self.value(t) if path is None else rnd.randbytes(rnd.choice([0, 1, 4, 9]))
        return Cell(name, value, ts, path=path)

    def liveness(self):
        r = self.rnd.random()
        if r < 0.4:
            return None
        if r < 0.7:
            return LivenessInfo(self.ts())
        return LivenessInfo(self.ts(), self.ttl(), self.ldt())

    def row(self, table):
        rnd = self.rnd
        lv = self.liveness()
        cells, cdels = self.cells(table, REGULAR, lv)
        deletion = self.deletion() if rnd.random() < 0.15 else None
        shadowable = deletion is not None and rnd.random() < 0.3
        if lv is None and not cells and not cdels and deletion is None:
            lv = LivenessInfo(self.ts())
        return Row(self.clustering(table), lv, deletion, shadowable, cells, cdels)

    def markers(self, table):
        rnd = self.rnd
        n = len(table.clustering)
        out = []
        k = rnd.randint(0, n)
        first = rnd.choice([BoundKind.INCL_START_BOUND, BoundKind.EXCL_START_BOUND])
        out.append(RangeTombstoneMarker(first, self.clustering(table, k, True), self.deletion()))
        for _ in range(rnd.choice([0, 0, 1, 2])):
            # a boundary closes the open range with that range's deletion and opens the next with its own
            kind = rnd.choice([BoundKind.EXCL_END_INCL_START_BOUNDARY, BoundKind.INCL_END_EXCL_START_BOUNDARY])
            opened = out[-1].deletion if out[-1].deletion is not None else out[-1].start_deletion
            out.append(RangeTombstoneMarker(kind, self.clustering(table, rnd.randint(0, n), True), None,
                                            opened, self.deletion()))
        last = rnd.choice([BoundKind.INCL_END_BOUND, BoundKind.EXCL_END_BOUND])
        d = out[-1].deletion if out[-1].deletion is not None else out[-1].start_deletion
        out.append(RangeTombstoneMarker(last, self.clustering(table, rnd.randint(0, n), True), d))
        return out

    def update(self, table, key):
        rnd = self.rnd
        u = PartitionUpdate(table.id, key, table)
        if rnd.random() < 0.03:
            u.is_empty = True
            return u
        if rnd.random() < 0.15:
            u.partition_deletion = self.deletion()
        if table.static_columns and rnd.random() < 0.3:
            cells, cdels = self.cells(table, STATIC, None)
            if cells or cdels:
                u.static_row = Row((), None, None, False, cells, cdels, True)
        unf = []
        for _ in range(rnd.choice([0, 1, 1, 1, 2, 4])):
            unf.append(self.row(table))
        if table.clustering and rnd.random() < 0.25:
            unf += self.markers(table)
        if not unf and u.static_row is None and u.partition_deletion is None:
            unf.append(self.row(table))
        u.unfiltereds = unf
        finish_update(u)
        if rnd.random() < 0.2:
            # a header listing more columns than the rows use: rows then carry a column subset
            extra = [c.name for c in table.regular_columns if c.name not in u.regular_columns]
            if extra:
                u.regular_columns = tuple(sorted(set(u.regular_columns) | set(rnd.sample(extra, min(len(extra),
                                                 rnd.randint(1, 70)))), key=_column_order(table)))
        return u

    def mutation(self) -> Mutation:
        rnd = self.rnd
        key = rnd.randbytes(rnd.choice([0, 1, 4, 8, 15, 16, 17, 33]))
        tables = rnd.sample(self.tables, rnd.randint(1, min(3, len(self.tables)))) if rnd.random() < 0.2 \
            else [rnd.choice(self.tables)]
        return Mutation([self.update(t, key) for t in tables], messaging_version=self.mv)
