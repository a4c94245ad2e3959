"""A workload for a real Cassandra cluster, written through cassandra-driver, with the table states CQL showed.

``Recorder`` runs each statement and then reads every table it touched with ``SELECT *`` (consistency ALL), so
each table's history of states is what a reader saw after every write: the ``states`` that
``tests/event_invariant.py`` checks the published events against.

The statements cover what the pipeline must get right (issue 7): every CQL type (vector, duration, counters,
UDTs, frozen and non-frozen collections, tuples), static columns, a composite partition key, DESC clustering,
every deletion kind (cell, row, range with both bounds and with open ends, partition, collection element,
collection overwrite), TTLs on INSERT and UPDATE, ``USING TIMESTAMP`` writes that arrive out of order, logged
and unlogged batches, LWTs, ``ALTER TYPE``/``ALTER TABLE ... ADD``/``DROP`` between writes, and a table
without ``cdc = true`` written into the same segments; plus the statements of issue 14 (collection overwrites,
INSERTs with collections over existing rows, batches mixing statements on one partition, static overwrites).

Keys whose writes carry explicit timestamps (``ooo``) get them so that an older write reaches the pipeline in a
later batch than the newer one (a real late arrival), or loses entirely: within one batch the pipeline applies
a partition's mutations in write-time order (README, "Change events"), which is what readers saw only when the
writes arrived in that order.
"""
from __future__ import annotations

import datetime
import decimal
import time
import uuid

from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement
from cassandra.util import Date, Duration, Time

from cdc_lib.cql.schema_from_cluster import load_from_cluster
from cdc_lib.demo.compare import select_json

KS = "it"
SCRATCH_KS = "it_scratch"
CDC_TABLES = ("types", "orders", "series", "counters", "evolve", "ooo", "i14", "ttl", "bulk")
NOT_CDC_TABLE = "plain"


def schema_statements(rf: int) -> list:
    return [
        f"CREATE KEYSPACE IF NOT EXISTS {KS} WITH replication = {{'class': 'NetworkTopologyStrategy', 'datacenter1': {rf}}}",
        f"CREATE KEYSPACE IF NOT EXISTS {SCRATCH_KS} WITH replication = {{'class': 'NetworkTopologyStrategy', "
        f"'datacenter1': {rf}}}",
        *types_table_statements(KS, cdc=True),
        f"""CREATE TABLE IF NOT EXISTS {KS}.orders (
            customer text, day date, placed timestamp, id int, note text static, status text, total decimal,
            items map<text, int>, tags set<text>,
            PRIMARY KEY ((customer, day), placed, id)) WITH CLUSTERING ORDER BY (placed DESC, id ASC) AND cdc = true""",
        f"""CREATE TABLE IF NOT EXISTS {KS}.series (k int, c1 int, c2 text, v text, PRIMARY KEY (k, c1, c2))
            WITH CLUSTERING ORDER BY (c1 DESC, c2 ASC) AND cdc = true""",
        f"CREATE TABLE IF NOT EXISTS {KS}.counters (k text, c int, hits counter, bytes counter, PRIMARY KEY (k, c)) "
        "WITH cdc = true",
        f"CREATE TABLE IF NOT EXISTS {KS}.evolve (k int PRIMARY KEY, a text, b int) WITH cdc = true",
        f"CREATE TABLE IF NOT EXISTS {KS}.ooo (k int, c int, a text, b text, PRIMARY KEY (k, c)) WITH cdc = true",
        f"""CREATE TABLE IF NOT EXISTS {KS}.i14 (k int, c int, s text static, v text, m map<text, int>, l list<int>, st set<int>,
            PRIMARY KEY (k, c)) WITH cdc = true""",
        f"CREATE TABLE IF NOT EXISTS {KS}.ttl (k int PRIMARY KEY, v text, w text) WITH cdc = true",
        f"CREATE TABLE IF NOT EXISTS {KS}.bulk (k int PRIMARY KEY, data blob) WITH cdc = true",
        f"CREATE TABLE IF NOT EXISTS {KS}.{NOT_CDC_TABLE} (k int PRIMARY KEY, v text, n int)",
    ]


def types_table_statements(keyspace: str, *, cdc: bool) -> list:
    """The UDT ``addr`` and the table ``types``: a column of every CQL type (``types_row`` fills it)."""
    return [
        f"CREATE TYPE IF NOT EXISTS {keyspace}.addr (street text, city text, zip int)",
        f"""CREATE TABLE IF NOT EXISTS {keyspace}.types (
            id int, ck text,
            a_ascii ascii, a_bigint bigint, a_blob blob, a_boolean boolean, a_date date, a_decimal decimal,
            a_double double, a_duration duration, a_float float, a_inet inet, a_int int, a_smallint smallint,
            a_text text, a_time time, a_timestamp timestamp, a_timeuuid timeuuid, a_tinyint tinyint, a_uuid uuid,
            a_varchar varchar, a_varint varint, a_vector vector<float, 3>,
            l list<int>, s set<text>, m map<text, int>,
            fl frozen<list<text>>, fs frozen<set<int>>, fm frozen<map<int, text>>,
            tup tuple<int, text, double>, udt frozen<addr>, udt_cells addr,
            nested frozen<map<text, frozen<list<int>>>>, l_udt list<frozen<addr>>,
            PRIMARY KEY (id, ck))""" + (" WITH cdc = true" if cdc else "")]


class Udt:
    """A UDT value for the driver, by field name (a tuple would be positional and break after ALTER TYPE)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class Recorder:
    """Runs statements and keeps, per table, the states ``SELECT *`` showed after each of them."""

    def __init__(self, session, *, tables=CDC_TABLES + (NOT_CDC_TABLE,)):
        self.session = session
        self.read_cl = ConsistencyLevel.ALL
        self.write_cl = ConsistencyLevel.QUORUM
        self.names = tables
        self.states: dict = {t: [{}] for t in tables}       # every table starts empty
        self.statements = 0
        self.refresh()

    def refresh(self) -> None:
        """Table metadata after a schema change (the states are read with the columns of the moment)."""
        self.schema = load_from_cluster(self.session, [KS])
        self.tables = {t: self.schema.by_name(KS, t) for t in self.names}

    def capture(self, *tables) -> None:
        for t in tables or self.names:
            state = select_json(self.session, self.tables[t], self.read_cl)
            if state != self.states[t][-1]:
                self.states[t].append(state)

    def run(self, cql, params=None, *, touches, cl=None):
        """Execute one statement (text or prepared), then read the tables it touched."""
        stmt = cql if not isinstance(cql, str) else SimpleStatement(cql)
        stmt.consistency_level = cl if cl is not None else self.write_cl
        result = self.session.execute(stmt, params)
        self.statements += 1
        self.capture(*([touches] if isinstance(touches, str) else touches))
        return result

    def ddl(self, cql) -> None:
        self.session.execute(cql)
        self.refresh()


def micros() -> int:
    return int(time.time() * 1_000_000)


# ------------------------------------------------------------------------------------------------ values

def types_insert(keyspace: str) -> str:
    """The INSERT of a ``types_row`` (a prepared statement's text)."""
    return (f"INSERT INTO {keyspace}.types (id, ck, a_ascii, a_bigint, a_blob, a_boolean, a_date, a_decimal, "
            "a_double, a_duration, a_float, a_inet, a_int, a_smallint, a_text, a_time, a_timestamp, a_timeuuid, "
            "a_tinyint, a_uuid, a_varchar, a_varint, a_vector, l, s, m, fl, fs, fm, tup, udt, udt_cells, nested, "
            "l_udt) VALUES (" + ", ".join(["?"] * 34) + ")")


TYPES_INSERT = types_insert(KS)


def types_row(i: int) -> tuple:
    """Row ``i`` of the types table: ordinary values, then edge values of every type as ``i`` grows."""
    edge = i % 3
    return (
        i, f"ck{i}",
        ["plain", "", "~" * 20][edge],
        [i * 1_000_003, -(1 << 63), (1 << 63) - 1][edge],
        [bytes(range(i % 7 + 1)), b"", b"\x00\xff" * 40][edge],
        bool(i % 2),
        [Date(datetime.date(2025, 11, 13)), Date(-(1 << 31) + 5), Date(datetime.date(1900, 1, 1))][edge],
        [decimal.Decimal("12.50"), decimal.Decimal("-0.000000000000000000000000000000001"),
         decimal.Decimal("123456789012345678901234567890.123456789")][edge],
        [0.1 * i, float("inf"), -1.5e-308][edge],
        [Duration(1, 2, 3_000_000_000), Duration(0, 0, 1), Duration(-14, -3, -7)][edge],
        [1.5, 3.4028234663852886e38, -1e-45][edge],                 # float32: exact, FLT_MAX, smallest subnormal
        ["10.0.0.%d" % i, "::1", "2001:db8::ff00:42:8329"][edge],
        [i, -(1 << 31), (1 << 31) - 1][edge],
        [i, -32768, 32767][edge],
        [f"text {i}", "héllo wörld ✓ 日本", ""][edge],
        [Time(datetime.time(12, 30, 15, 250000)), Time(0), Time(86_399_999_999_999)][edge],
        [datetime.datetime(2025, 11, 13, 10, 0, i), datetime.datetime(1960, 2, 29, 23, 59, 59, 999000),
         datetime.datetime(2262, 1, 1)][edge],
        uuid.uuid1(),
        [i, -128, 127][edge],
        uuid.UUID(int=i * 7919 + 1),
        [f"varchar {i}", "ünï", ""][edge],
        [i * 10 ** 20, -(10 ** 40), 0][edge],
        [[0.5, -1.25, float(i)], [0.0, -0.0, 1e-38], [3.4e38, -3.4e38, 2.5]][edge],
        [[1, 2, i], [], [-(1 << 31)]][edge] or None,
        [{"a", f"s{i}"}, {"ü"}, {""}][edge],
        [{"x": i, "y": -i}, {"": 0}, {"k": (1 << 31) - 1}][edge],
        [["f", str(i)], [], [""]][edge],
        [{1, 2, i}, set(), {-5}][edge],
        [{1: "one", i: "i"}, {}, {0: ""}][edge],
        [(i, "t", 2.5), (None, "only text", None), (-1, "", float("-inf"))][edge],
        Udt(street=f"{i} Main St", city="Utrecht", zip=3500 + i),
        Udt(street="Canal", city=["Amsterdam", "", None][edge], zip=[1000, None, 0][edge]),
        [{"a": [1, 2], "b": []}, {"": [0]}, {"z": [i]}][edge],
        [[Udt(street="x", city="y", zip=1)], [Udt(street="", city=None, zip=None)], [Udt(street="p", city="q", zip=i)]][edge],
    )


# ------------------------------------------------------------------------------------------------ phases

def create_schema(session, rf: int) -> None:
    # IF NOT EXISTS: under load the driver may send a statement again after a connection error, when Cassandra
    # had already applied it (AlreadyExists on a fresh cluster)
    for cql in schema_statements(rf):
        session.execute(cql)


def phase_one(rec: Recorder) -> None:
    """Inserts of every type, then every kind of change and deletion."""
    s = rec.session
    ins = s.prepare(TYPES_INSERT)
    for i in range(1, 10):
        rec.run(ins, types_row(i), touches="types")
    t = f"{KS}.types"
    rec.run(f"UPDATE {t} SET a_text = 'updated', a_int = 42 WHERE id = 1 AND ck = 'ck1'", touches="types")
    rec.run(f"UPDATE {t} SET l = l + [7, 8], s = s + {{'added'}}, m['new'] = 5 WHERE id = 1 AND ck = 'ck1'",
            touches="types")
    rec.run(f"UPDATE {t} SET l = [100], m = {{'over': 1}} WHERE id = 2 AND ck = 'ck2'", touches="types")
    rec.run(f"DELETE a_text, a_double FROM {t} WHERE id = 1 AND ck = 'ck1'", touches="types")       # cells
    rec.run(f"DELETE m['x'] FROM {t} WHERE id = 1 AND ck = 'ck1'", touches="types")                # element
    rec.run(f"UPDATE {t} SET s = s - {{'a'}}, l = l - [7] WHERE id = 1 AND ck = 'ck1'", touches="types")
    rec.run(f"DELETE l[0] FROM {t} WHERE id = 1 AND ck = 'ck1'", touches="types")                   # list index
    rec.run(f"UPDATE {t} SET udt_cells.city = 'Rotterdam' WHERE id = 4 AND ck = 'ck4'", touches="types")
    rec.run(f"UPDATE {t} SET udt_cells = {{street: 'New', city: 'Delft', zip: 2600}} WHERE id = 5 AND ck = 'ck5'",
            touches="types")
    rec.run(f"UPDATE {t} USING TTL 3600 SET a_text = 'expires in an hour', a_bigint = 7 "
            "WHERE id = 6 AND ck = 'ck6'", touches="types")
    rec.run(f"INSERT INTO {t} (id, ck, a_int, a_text) VALUES (20, 'ttl', 1, 'row with ttl') USING TTL 3600",
            touches="types")
    rec.run(f"INSERT INTO {t} (id, ck, a_int, a_smallint) VALUES (21, 'empty', blobAsInt(0x), 3)", touches="types")
    rec.run(f"INSERT INTO {t} (id, ck, a_text, l) VALUES (22, 'nulls', null, null)", touches="types")
    rec.run(f"DELETE FROM {t} WHERE id = 3 AND ck = 'ck3'", touches="types")                           # row
    rec.run(f"DELETE FROM {t} WHERE id = 7", touches="types")                                          # partition

    o = f"{KS}.orders"
    day1, day2 = "2025-11-13", "2025-11-14"
    for n in range(1, 9):
        rec.run(f"INSERT INTO {o} (customer, day, placed, id, status, total, items, tags) VALUES "
                f"('ann', '{day1}', '2025-11-13 10:0{n}:00+0000', {n}, 'new', {n}.25, {{'pen': {n}}}, {{'web'}})",
                touches="orders")
    rec.run(f"INSERT INTO {o} (customer, day, placed, id, status) VALUES ('ann', '{day2}', "
            "'2025-11-14 09:00:00+0000', 1, 'new')", touches="orders")
    rec.run(f"UPDATE {o} SET note = 'vip customer' WHERE customer = 'ann' AND day = '{day1}'", touches="orders")
    rec.run(f"INSERT INTO {o} (customer, day, note) VALUES ('bob', '{day1}', 'static only')", touches="orders")
    rec.run(f"UPDATE {o} SET status = 'paid', items['ink'] = 2, tags = tags + {{'gift'}} WHERE customer = 'ann' "
            f"AND day = '{day1}' AND placed = '2025-11-13 10:02:00+0000' AND id = 2", touches="orders")
    rec.run(f"DELETE FROM {o} WHERE customer = 'ann' AND day = '{day1}' AND placed > '2025-11-13 10:06:00+0000' "
            "AND placed <= '2025-11-13 10:07:00+0000'", touches="orders")                    # both bounds
    rec.run(f"DELETE FROM {o} WHERE customer = 'ann' AND day = '{day1}' AND placed < '2025-11-13 10:02:00+0000'",
            touches="orders")                                                                # open start
    rec.run(f"DELETE items['pen'] FROM {o} WHERE customer = 'ann' AND day = '{day1}' "
            "AND placed = '2025-11-13 10:03:00+0000' AND id = 3", touches="orders")

    sr = f"{KS}.series"
    for k in (1, 2):
        for c1 in range(1, 10):
            for c2 in ("a", "b", "c"):
                rec.run(f"INSERT INTO {sr} (k, c1, c2, v) VALUES ({k}, {c1}, '{c2}', 'v{k}{c1}{c2}')", touches="series")
    rec.run(f"DELETE FROM {sr} WHERE k = 1 AND c1 >= 3 AND c1 < 6", touches="series")       # both bounds, DESC
    rec.run(f"DELETE FROM {sr} WHERE k = 1 AND c1 > 8", touches="series")                    # open end
    rec.run(f"DELETE FROM {sr} WHERE k = 2 AND c1 = 5 AND c2 > 'a'", touches="series")        # prefix + range
    rec.run(f"DELETE FROM {sr} WHERE k = 2 AND c1 <= 2", touches="series")                    # open start

    for n in range(6):
        rec.run(f"UPDATE {KS}.counters SET hits = hits + {n + 1}, bytes = bytes + {100 * n} "
                f"WHERE k = 'page{n % 2}' AND c = {n % 3}", touches="counters")
    rec.run(f"UPDATE {KS}.counters SET hits = hits - 2 WHERE k = 'page0' AND c = 0", touches="counters")

    for k in range(1, 5):
        rec.run(f"INSERT INTO {KS}.evolve (k, a, b) VALUES ({k}, 'a{k}', {k * 10})", touches="evolve")
    rec.ddl(f"ALTER TABLE {KS}.evolve ADD c list<text>")
    rec.run(f"UPDATE {KS}.evolve SET c = ['added'], a = 'a1 again' WHERE k = 1", touches="evolve")
    rec.run(f"INSERT INTO {KS}.evolve (k, a, b, c) VALUES (5, 'a5', 50, ['x', 'y'])", touches="evolve")

    # explicit timestamps, far above the client's: the out-of-order writes of phase two arrive below them
    base = micros() + 3_600_000_000
    for k in range(1, 4):
        rec.run(f"INSERT INTO {KS}.ooo (k, c, a) VALUES ({k}, 1, 'newer') USING TIMESTAMP {base + 2000}",
                touches="ooo")
    rec.ooo_base = base

    issue14(rec, part=1)
    rec.run(f"INSERT INTO {KS}.{NOT_CDC_TABLE} (k, v, n) VALUES (1, 'not captured', 1)", touches=NOT_CDC_TABLE)
    rec.run(f"UPDATE {KS}.{NOT_CDC_TABLE} SET v = 'still not captured' WHERE k = 1", touches=NOT_CDC_TABLE)
    rec.run(f"INSERT INTO {KS}.{NOT_CDC_TABLE} (k, v, n) VALUES (2, 'gone soon', 2)", touches=NOT_CDC_TABLE)

    lwt(rec, part=1)
    bulk(rec, range(0, 70))
    rec.run(f"DELETE FROM {KS}.{NOT_CDC_TABLE} WHERE k = 2", touches=NOT_CDC_TABLE)


def short_ttls(rec: Recorder, ttl: int) -> float:
    """Rows and cells that expire soon (INSERT and UPDATE): visible to the next batch, gone by the last one.
    Returns when the last of them expires (epoch seconds)."""
    for k in range(1, 4):
        rec.run(f"INSERT INTO {KS}.ttl (k, v) VALUES ({k}, 'short {k}') USING TTL {ttl}", touches="ttl")
    rec.run(f"INSERT INTO {KS}.ttl (k, v, w) VALUES (10, 'stays', 'w stays')", touches="ttl")
    rec.run(f"UPDATE {KS}.ttl USING TTL {ttl} SET w = 'short cell' WHERE k = 11", touches="ttl")   # no row marker
    rec.run(f"UPDATE {KS}.ttl USING TTL {ttl} SET w = 'expiring cell' WHERE k = 10", touches="ttl")
    rec.run(f"INSERT INTO {KS}.ttl (k, v) VALUES (12, 'an hour') USING TTL 3600", touches="ttl")
    return time.time() + ttl


def issue14(rec: Recorder, part: int) -> None:
    """Issue 14's statements: events must follow mutations, not timestamps."""
    t = f"{KS}.i14"
    if part == 1:
        rec.run(f"INSERT INTO {t} (k, c, v, m, l, st) VALUES (1, 1, 'a', {{'x': 1}}, [1, 2], {{1}})", touches="i14")
        rec.run(f"INSERT INTO {t} (k, c, v, m) VALUES (1, 1, 'b', {{'y': 2}})", touches="i14")    # over a row
        rec.run(f"UPDATE {t} SET m = {{'z': 3}}, l = [9] WHERE k = 1 AND c = 1", touches="i14")   # overwrite
        rec.run(f"INSERT INTO {t} (k, c, v) VALUES (1, 2, 'second')", touches="i14")
        rec.run(f"UPDATE {t} SET s = 'static one' WHERE k = 1", touches="i14")                  # every row
        rec.run(f"UPDATE {t} SET s = 'static two' WHERE k = 1", touches="i14")                  # overwrite
        rec.run(f"BEGIN BATCH INSERT INTO {t} (k, c, v, m) VALUES (1, 3, 'in batch', {{'b': 1}}); "
                f"UPDATE {t} SET v = 'batch update', m = {{'bb': 2}} WHERE k = 1 AND c = 1; "
                f"UPDATE {t} SET s = 'static in batch' WHERE k = 1; "
                f"DELETE FROM {t} WHERE k = 1 AND c = 2; APPLY BATCH", touches="i14")          # logged, 1 partition
        rec.run(f"BEGIN UNLOGGED BATCH INSERT INTO {t} (k, c, v) VALUES (2, 1, 'u1'); "
                f"INSERT INTO {t} (k, c, v, l) VALUES (2, 2, 'u2', [1]); "
                f"UPDATE {t} SET st = {{5, 6}} WHERE k = 2 AND c = 1; APPLY BATCH", touches="i14")
        ts = micros()
        rec.run(f"BEGIN BATCH USING TIMESTAMP {ts} INSERT INTO {t} (k, c, v, m) VALUES (2, 3, 'ts batch', {{'t': 1}}); "
                f"UPDATE {t} SET m = {{'t2': 2}} WHERE k = 2 AND c = 1; APPLY BATCH", touches="i14")
        rec.run(f"BEGIN UNLOGGED BATCH USING TIMESTAMP {micros()} "
                f"UPDATE {t} SET l = [7, 7], v = 'unlogged ts' WHERE k = 2 AND c = 2; "
                f"INSERT INTO {t} (k, c, s) VALUES (2, 9, 'static+row'); APPLY BATCH", touches="i14")
    else:
        # a range deletion and an insert inside it, one mutation; a partition deletion and an insert at the same
        # timestamp (the deletion wins the tie: the row stays deleted); logged batch over two partitions
        rec.run(f"BEGIN BATCH DELETE FROM {t} WHERE k = 2 AND c >= 1 AND c <= 5; "
                f"INSERT INTO {t} (k, c, v) VALUES (2, 3, 'back inside the range'); APPLY BATCH", touches="i14")
        rec.run(f"BEGIN BATCH DELETE FROM {t} WHERE k = 1; INSERT INTO {t} (k, c, v) VALUES (1, 4, 'tie'); "
                "APPLY BATCH", touches="i14")
        rec.run(f"BEGIN BATCH INSERT INTO {t} (k, c, v, m) VALUES (3, 1, 'p3', {{'q': 1}}); "
                f"INSERT INTO {t} (k, c, v) VALUES (4, 1, 'p4'); "
                f"INSERT INTO {KS}.orders (customer, day, placed, id, status) VALUES ('cat', '2025-11-15', "
                "'2025-11-15 08:00:00+0000', 1, 'batched'); APPLY BATCH", touches=("i14", "orders"))
        rec.run(f"INSERT INTO {t} (k, c, v, m, l) VALUES (3, 1, 'p3 again', {{'r': 2}}, [3])", touches="i14")


def lwt(rec: Recorder, part: int) -> None:
    t = f"{KS}.types"
    if part == 1:
        rec.run(f"INSERT INTO {t} (id, ck, a_text) VALUES (30, 'lwt', 'first') IF NOT EXISTS", touches="types")
        rec.run(f"INSERT INTO {t} (id, ck, a_text) VALUES (30, 'lwt', 'not applied') IF NOT EXISTS",
                touches="types")
        rec.run(f"UPDATE {t} SET a_text = 'cas applied' WHERE id = 30 AND ck = 'lwt' IF a_text = 'first'",
                touches="types")
    else:
        rec.run(f"UPDATE {t} SET a_text = 'cas not applied' WHERE id = 30 AND ck = 'lwt' IF a_text = 'nope'",
                touches="types")
        rec.run(f"INSERT INTO {t} (id, ck, a_text) VALUES (31, 'lwt', 'doomed') IF NOT EXISTS", touches="types")
        rec.run(f"DELETE FROM {t} WHERE id = 31 AND ck = 'lwt' IF EXISTS", touches="types")


def bulk(rec: Recorder, keys) -> None:
    """~16 KiB per row: enough data that segments (1 MiB) fill and close on their own."""
    ins = rec.session.prepare(f"INSERT INTO {KS}.bulk (k, data) VALUES (?, ?)")
    ins.consistency_level = rec.write_cl
    for k in keys:
        rec.session.execute(ins, (k, bytes([k % 251]) * 16384))
        rec.statements += 1
    rec.capture("bulk")


def phase_two(rec: Recorder) -> None:
    """Schema changes between writes; late writes with older timestamps."""
    rec.ddl(f"ALTER TYPE {KS}.addr ADD country text")
    t = f"{KS}.types"
    rec.run(f"UPDATE {t} SET udt = {{street: 'Dam', city: 'Amsterdam', zip: 1012, country: 'NL'}}, "
            f"l_udt = l_udt + [{{street: 's', city: 'c', zip: 2, country: 'BE'}}] WHERE id = 1 AND ck = 'ck1'",
            touches="types")
    rec.run(f"UPDATE {t} SET udt_cells.country = 'DE' WHERE id = 5 AND ck = 'ck5'", touches="types")
    rec.ddl(f"ALTER TABLE {KS}.evolve DROP b")
    rec.run(f"INSERT INTO {KS}.evolve (k, a, c) VALUES (6, 'a6', ['after drop'])", touches="evolve")
    rec.run(f"UPDATE {KS}.evolve SET a = 'a2 after drop' WHERE k = 2", touches="evolve")
    base = rec.ooo_base
    rec.run(f"UPDATE {KS}.ooo USING TIMESTAMP {base + 1000} SET a = 'older, loses' WHERE k = 1 AND c = 1",
            touches="ooo")                                                              # arrives late, loses
    rec.run(f"UPDATE {KS}.ooo USING TIMESTAMP {base + 1000} SET b = 'older, but b was never set' "
            "WHERE k = 2 AND c = 1", touches="ooo")                                     # late, partly wins
    rec.run(f"DELETE FROM {KS}.ooo USING TIMESTAMP {base + 500} WHERE k = 3 AND c = 1", touches="ooo")  # loses
    rec.run(f"INSERT INTO {KS}.ooo (k, c, a, b) VALUES (4, 1, 'x', 'y') USING TIMESTAMP {base + 3000}",
            touches="ooo")
    issue14(rec, part=2)
    lwt(rec, part=2)
    rec.run(f"INSERT INTO {KS}.{NOT_CDC_TABLE} (k, v, n) VALUES (3, 'after the alter', 3)", touches=NOT_CDC_TABLE)


def phase_three(rec: Recorder) -> None:
    """More of everything, so the last segments hold a bit of every table."""
    t = f"{KS}.types"
    rec.run(f"UPDATE {t} SET a_varint = -99999999999999999999999, a_vector = [1.0, 2.0, 3.0] "
            "WHERE id = 8 AND ck = 'ck8'", touches="types")
    rec.run(f"DELETE udt_cells FROM {t} WHERE id = 4 AND ck = 'ck4'", touches="types")
    rec.run(f"INSERT INTO {t} (id, ck, a_int) VALUES (9, 'ck9b', 99) USING TTL 3600", touches="types")
    rec.run(f"UPDATE {KS}.orders SET status = 'shipped', total = 99.99 WHERE customer = 'ann' AND day = '2025-11-13' "
            "AND placed = '2025-11-13 10:04:00+0000' AND id = 4", touches="orders")
    rec.run(f"DELETE note FROM {KS}.orders WHERE customer = 'ann' AND day = '2025-11-13'", touches="orders")
    rec.run(f"DELETE FROM {KS}.orders WHERE customer = 'bob' AND day = '2025-11-13'", touches="orders")
    rec.run(f"UPDATE {KS}.counters SET hits = hits + 10 WHERE k = 'page1' AND c = 1", touches="counters")
    rec.run(f"INSERT INTO {KS}.series (k, c1, c2, v) VALUES (1, 4, 'b', 'back')", touches="series")
    rec.run(f"INSERT INTO {KS}.evolve (k, a, c) VALUES (7, 'a7', null)", touches="evolve")
    rec.run(f"UPDATE {KS}.{NOT_CDC_TABLE} SET n = 5 WHERE k = 3", touches=NOT_CDC_TABLE)


# ------------------------------------------------------------------------------------------------ the commit log

def wait_for(what: str, done, timeout: float = 120.0, every: float = 0.25):
    """``done()``'s first true value, polled every ``every`` s; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = done()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def _completed(cluster, i: int) -> set:
    from cdc_lib.agent.cdc_raw import scan_cdc_raw
    return {s.name for s in scan_cdc_raw(cluster.node(i).cdc_raw).segments if s.idx is not None and s.idx.completed}


def switch_segments(session, cluster, nodes, scratch_keyspace: str = SCRATCH_KS, *, quiet: bool = True) -> None:
    """A forced switch on every live node: dropping a table recycles every commit-log segment (the active one is
    closed and, holding CDC data, gets a COMPLETED idx). Waits until each node completed one more segment and,
    when ``quiet`` (nobody writes meanwhile), none is left with a live idx. ``scratch_keyspace`` must exist."""
    from cdc_lib.agent.cdc_raw import scan_cdc_raw
    before = {i: _completed(cluster, i) for i in nodes}
    name = f"s{uuid.uuid4().hex[:8]}"
    session.execute(f"CREATE TABLE IF NOT EXISTS {scratch_keyspace}.{name} (k int PRIMARY KEY)")
    session.execute(f"DROP TABLE IF EXISTS {scratch_keyspace}.{name}")

    def switched():
        for i in nodes:
            segments = scan_cdc_raw(cluster.node(i).cdc_raw).segments
            if quiet and any(s.idx is not None and not s.idx.completed for s in segments):
                return False
            if not _completed(cluster, i) - before[i]:
                return False
        return True
    wait_for("the segment switch", switched)
