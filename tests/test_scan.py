"""The CQL scan of the ``cql`` backfill, without a cluster: token ranges, rows -> cell-log records, the kept copy of
a scanned range, and the request's checks. (Against a real node: ``test_backfill_real.py``.)

The expected records are written out by hand from the bytes CQL would send (the native protocol's serialization),
so no codec of ``cdc_lib.cql.types`` is on the expected side.
"""
from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from cdc_lib.celllog.schema import encode_clustering
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.cql.tokens import MAX_TOKEN, MIN_TOKEN
from cdc_lib.cql.tokens import token as murmur3
from cdc_lib.errors import ConfigError, FormatError
from cdc_lib.scan import ScanError, TableScan, TokenRange, split_ring
from cdc_lib.scan.reader import read_scanned_range
from cdc_lib.scan.rows import LIST_PATH_BASE, RecordColumns, list_path
from cdc_lib.state.batch import process_partition
from cdc_lib.storage.objects import ObjectStore

LIVE = (1 << 31) - 1
DDL = """
CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};
CREATE TYPE ks.addr (street text, city text, zip int);
CREATE TABLE ks.t (k int, c int, s text static, v text, st set<text>, m map<text, int>, l list<int>, u addr,
    fl frozen<list<int>>, PRIMARY KEY (k, c)) WITH ID = 5a1e6f20-0000-4000-8000-000000000001 AND cdc = true;
CREATE TABLE ks.ctr (k int PRIMARY KEY, n counter) WITH ID = 5a1e6f20-0000-4000-8000-000000000002 AND cdc = true;
CREATE TABLE ks.two (a text, b int, v int, PRIMARY KEY ((a, b))) WITH ID = 5a1e6f20-0000-4000-8000-000000000003;
"""


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def coll(*elements) -> bytes:
    """A serialized collection: i32 count, then each element i32-length-prefixed (None: length -1)."""
    return i32(len(elements)) + b"".join(b"\xff\xff\xff\xff" if e is None else i32(len(e)) + e for e in elements)


def mapping(*pairs) -> bytes:
    """A serialized map: i32 count of pairs, then key and value, each i32-length-prefixed."""
    return i32(len(pairs)) + b"".join(i32(len(k)) + k + i32(len(v)) + v for k, v in pairs)


def udt(*fields) -> bytes:
    return b"".join(b"\xff\xff\xff\xff" if f is None else i32(len(f)) + f for f in fields)


@pytest.fixture(scope="module")
def schema():
    return load_cql_schema(DDL)


def _records(scan, rows, now=1000, source="cql:r/ks.t/0") -> list:
    out = RecordColumns()
    scan.records(rows, now, source, 0, out)
    return out.take().to_pylist()


def _row(k, c, s=None, s_t=None, v=None, v_t=None, st=None, st_t=None, m=None, m_t=None, l=None, l_t=None,
         u=None, u_t=None, fl=None, fl_t=None):
    """A row as the scan's SELECT returns it (timed columns: value, WRITETIME, TTL), column order of ks.t:
    s, v, st, m, l, u, fl (the table's column order)."""
    def timed(value, times):
        wt, ttl = times if times is not None else (None, None)
        return [value, wt, ttl]
    return tuple([None if k is None else i32(k), None if c is None else i32(c)]
                 + timed(s, s_t) + timed(v, v_t) + timed(st, st_t) + timed(m, m_t) + timed(l, l_t)
                 + timed(u, u_t) + timed(fl, fl_t))


def test_the_query_selects_each_column_with_its_write_time_and_ttl(schema):
    scan = TableScan(schema.by_name("ks", "t"))
    assert [c.name for c in scan.columns] == ["s", "v", "st", "m", "l", "u", "fl"]
    assert scan.query == ('SELECT "k", "c", "s", WRITETIME("s"), TTL("s"), "v", WRITETIME("v"), TTL("v"), '
                          '"st", WRITETIME("st"), TTL("st"), "m", WRITETIME("m"), TTL("m"), "l", WRITETIME("l"), '
                          'TTL("l"), "u", WRITETIME("u"), TTL("u"), "fl", WRITETIME("fl"), TTL("fl") '
                          'FROM "ks"."t" WHERE token("k") > %s AND token("k") <= %s')
    two = TableScan(schema.by_name("ks", "two"))
    assert two.query.endswith('WHERE token("a", "b") > %s AND token("a", "b") <= %s')


def test_a_row_becomes_the_cells_cassandra_stores(schema):
    """Simple, expiring, set, map, UDT (a null field has no cell) and frozen cells, each with its own write time;
    the static row once per partition; the row marker at the row's lowest write time."""
    scan = TableScan(schema.by_name("ks", "t"))
    r1 = _row(1, 10, s=b"st", s_t=(i64(50), None), v=b"hello", v_t=(i64(100), i32(30)),
              st=coll(b"a", b"b"), st_t=(coll(i64(101), i64(102)), coll(None, i32(7))),
              m=mapping((b"x", i32(1))), m_t=(coll(i64(103)), coll(None)),
              u=udt(b"main", None, i32(5)), u_t=(coll(i64(104), None, i64(105)), coll(None, None, None)),
              fl=coll(i32(1), i32(2)), fl_t=(i64(99), None))
    r2 = _row(1, 11, s=b"st", s_t=(i64(50), None), v=b"x", v_t=(i64(200), None))
    recs = _records(scan, [r1, r2])
    pk = i32(1)
    ck10, ck11 = encode_clustering([i32(10)]), encode_clustering([i32(11)])
    got = [(r["clustering"], r["is_static"], r["kind"], r["column"], r["path"], r["value"], r["timestamp"], r["ttl"],
            r["local_deletion_time"]) for r in recs]
    assert got == [
        (b"", True, "cell", "s", None, b"st", 50, 0, LIVE),
        (ck10, False, "cell", "v", None, b"hello", 100, 30, 1030),
        (ck10, False, "cell", "st", b"a", b"", 101, 0, LIVE),
        (ck10, False, "cell", "st", b"b", b"", 102, 7, 1007),
        (ck10, False, "cell", "m", b"x", i32(1), 103, 0, LIVE),
        (ck10, False, "cell", "u", b"\x00\x00", b"main", 104, 0, LIVE),
        (ck10, False, "cell", "u", b"\x00\x02", i32(5), 105, 0, LIVE),
        (ck10, False, "cell", "fl", None, coll(i32(1), i32(2)), 99, 0, LIVE),
        (ck10, False, "row_liveness", None, None, None, 99, 0, LIVE),
        (ck11, False, "cell", "v", None, b"x", 200, 0, LIVE),       # the partition's static row came with r1
        (ck11, False, "row_liveness", None, None, None, 200, 0, LIVE),
    ]
    assert {(r["partition_key"], r["token"], r["table_id"], r["segment"], r["mutation_id"]) for r in recs} == \
        {(pk, murmur3(pk), "5a1e6f20-0000-4000-8000-000000000001", "cql:r/ks.t/0", None)}
    assert [r["position"] for r in recs] == [0] * 9 + [1] * 2 and [r["seq"] for r in recs[:3]] == [0, 1, 2]


def test_row_marker_expires_with_the_last_cell_only_when_every_cell_expires(schema):
    scan = TableScan(schema.by_name("ks", "t"))
    all_expire = _row(2, 1, v=b"a", v_t=(i64(10), i32(100)), st=coll(b"z"), st_t=(coll(i64(12)), coll(i32(300))))
    one_lives = _row(3, 1, v=b"a", v_t=(i64(10), i32(100)), st=coll(b"z"), st_t=(coll(i64(12)), coll(None)))
    key_only = _row(4, 1)
    markers = [(r["timestamp"], r["ttl"], r["local_deletion_time"]) for r in
               _records(scan, [all_expire, one_lives, key_only], now=5000) if r["kind"] == "row_liveness"]
    assert markers == [(10, 300, 5300), (10, 0, LIVE), (0, 0, LIVE)]


def test_a_partition_with_only_static_data_has_no_row(schema):
    """SELECT shows a static-only partition as one row whose clustering columns are null."""
    recs = _records(TableScan(schema.by_name("ks", "t")), [_row(5, None, s=b"lonely", s_t=(i64(7), None))])
    assert [(r["kind"], r["is_static"], r["clustering"], r["value"]) for r in recs] == \
        [("cell", True, b"", b"lonely")]


def test_a_list_is_loaded_as_an_overwrite_at_its_latest_write_under_made_up_paths(schema):
    """CQL shows no list element ids: the list is a collection deletion at its latest element's write time T and
    the elements at T + 1, under made-up time-based UUIDs that sort like the list (from 2010-01-01, after every
    prepend and before every append Cassandra makes)."""
    import uuid
    scan = TableScan(schema.by_name("ks", "t"))
    row = _row(6, 1, l=coll(i32(7), i32(8), i32(9)), l_t=(coll(i64(100), i64(160), i64(140)), coll(None, i32(9), None)))
    cells = [r for r in _records(scan, [row], now=500) if r["column"] == "l"]
    assert [(r["kind"], r["path"], r["value"], r["timestamp"], r["ttl"], r["local_deletion_time"]) for r in cells] == [
        ("complex_deletion", None, None, 160, 0, 500),
        ("cell", list_path(0), i32(7), 161, 0, LIVE), ("cell", list_path(1), i32(8), 161, 9, 509),
        ("cell", list_path(2), i32(9), 161, 0, LIVE)]
    paths = [uuid.UUID(bytes=list_path(i)) for i in range(3)]
    assert {p.version for p in paths} == {1}
    # 100-ns ticks from 1582-10-15: 2010-01-01T00:00:00Z, then one tick per element
    assert [p.time for p in paths] == [LIST_PATH_BASE + i for i in range(3)]
    assert LIST_PATH_BASE == (1262304000000 * 10_000 + 0x01B21DD213814000)


def test_the_commit_logs_copies_of_scanned_list_elements_never_show_twice(schema):
    """The commit log brings the list's real elements (written before the scan, even before CDC was enabled, in a
    segment that also holds CDC writes): the loaded overwrite covers them. A later append lands after the list."""
    from cdc_lib.celllog.schema import CELL_LOG_SCHEMA
    table = schema.by_name("ks", "t")
    pk, ck = i32(6), encode_clustering([i32(1)])
    scanned = _records(TableScan(table), [_row(6, 1, l=coll(i32(7), i32(8)),
                                              l_t=(coll(i64(100), i64(110)), coll(None, None)))])
    res = process_partition(table, pk, murmur3(pk), scanned, None, 1000, create_op="r")
    assert res.events[0]["after"]["l"] == [7, 8]

    def element(path: bytes, value: int, ts: int) -> dict:
        rec = {f.name: None for f in CELL_LOG_SCHEMA}
        rec.update(segment="CommitLog-7-1.log", segment_id=1, position=ts, entry_index=0, seq=0,
                   table_id=str(table.id), keyspace="ks", table="t", partition_key=pk, token=murmur3(pk),
                   clustering=ck, is_static=False, kind="cell", column="l", path=path, value=i32(value), timestamp=ts,
                   ttl=0, local_deletion_time=LIVE, mutation_id=bytes([ts % 256]) * 16)
        return rec
    real = [element(uuid_bytes(5), 7, 100), element(uuid_bytes(6), 8, 110)]
    again = process_partition(table, pk, murmur3(pk), real, res.state, 1001)
    assert again.events == []
    later = process_partition(table, pk, murmur3(pk), [element(uuid_bytes(9), 9, 200)], res.state, 1002)
    assert [e["after"]["l"] for e in later.events] == [[7, 8, 9]]


def uuid_bytes(minutes_after_2024: int) -> bytes:
    """A time-based UUID as Cassandra makes for an append (a time now-ish)."""
    import uuid
    t = (1704067200 + 60 * minutes_after_2024) * 10_000_000 + 0x01B21DD213814000
    return uuid.UUID(fields=(t & 0xFFFFFFFF, (t >> 32) & 0xFFFF, (t >> 48) & 0x0FFF, 0x81, 0x01, 0x123456789ABC),
                     version=1).bytes


def test_before_cassandra_5_elements_take_the_rows_lowest_write_time(schema):
    """Without element times (WRITETIME() of a non-frozen column is refused before 5.0), elements get the row's
    lowest known write time: any later write wins over them."""
    scan = TableScan(schema.by_name("ks", "t"), element_times=False)
    assert 'WRITETIME("st")' not in scan.query and 'WRITETIME("v")' in scan.query
    row = (i32(7), i32(1), None, None, None, b"v", i64(300), None, coll(b"a"), None, None, None, None, None,
           None, None, None)
    recs = _records(scan, [row])
    assert [(r["kind"], r["column"], r["timestamp"]) for r in recs] == \
        [("cell", "v", 300), ("cell", "st", 300), ("row_liveness", None, 300)]


def test_counter_tables_are_refused_with_the_reason(schema):
    with pytest.raises(ScanError, match="ks.ctr has counter columns.*mode sstables"):
        TableScan(schema.by_name("ks", "ctr"))


def test_a_damaged_value_names_the_table_column_and_row(schema):
    scan = TableScan(schema.by_name("ks", "t"))
    bad = _row(8, 1, st=i32(3) + i32(1) + b"a", st_t=(coll(i64(1)), coll(None)))
    with pytest.raises(ScanError, match=r"ks.t.st \(row 0 of cql:r/ks.t/0\): truncated collection"):
        _records(scan, [bad])
    short = _row(8, 1, st=coll(b"a", b"b"), st_t=(coll(i64(1)), coll(None)))
    with pytest.raises(ScanError, match="2 elements but 1 WRITETIME"):
        _records(scan, [short])
    cut = _row(8, 1, u=udt(b"main")[:-1], u_t=(coll(i64(1)), coll(None)))      # a field's bytes cut short
    with pytest.raises(ScanError, match=r"ks.t.u \(row 0 of cql:r/ks.t/0\): truncated UDT field: UDT field 0 needs 4"):
        _records(scan, [cut])
    negative = _row(8, 1, st=i32(1) + i32(-2), st_t=(coll(i64(1)), coll(None)))   # only -1 is a null
    with pytest.raises(ScanError, match=r"ks.t.st \(row 0 of cql:r/ks.t/0\): collection 0 has negative length -2"):
        _records(scan, [negative])


def test_scanned_rows_merge_into_read_events_of_the_rows_select_shows(schema):
    """The state engine turns a scanned row into one 'r' event whose image is the row, and merging the same
    records again changes nothing (a rerun, or the commit log bringing a write the scan saw)."""
    table = schema.by_name("ks", "t")
    row = _row(9, 2, s=b"S", s_t=(i64(5), None), v=b"val", v_t=(i64(10), None), st=coll(b"p", b"q"),
               st_t=(coll(i64(11), i64(12)), coll(None, None)), l=coll(i32(3), i32(4)),
               l_t=(coll(i64(13), i64(14)), coll(None, None)))
    recs = _records(TableScan(table), [row])
    pk = i32(9)
    res = process_partition(table, pk, murmur3(pk), recs, None, 2000, create_op="r")
    assert [e["op"] for e in res.events] == ["r"]
    after = res.events[0]["after"]
    assert (after["k"], after["c"], after["s"], after["v"], list(after["st"]), after["l"]) == \
        (9, 2, "S", "val", ["p", "q"], [3, 4])
    assert res.events[0]["source"]["segment"] == "cql:r/ks.t/0"
    again = process_partition(table, pk, murmur3(pk), recs, res.state, 2001, create_op="r")
    assert again.events == [] and not again.changed


def test_token_ranges_cover_the_ring_exactly_once_cut_at_the_nodes_tokens():
    import random
    rnd = random.Random(9)
    for nodes, splits in ((0, 1), (0, 16), (1, 16), (3, 16), (48, 16), (5, 200)):
        ring = sorted(rnd.randrange(MIN_TOKEN + 1, MAX_TOKEN) for _ in range(nodes))
        ranges = split_ring(ring, splits)
        assert ranges[0].start == MIN_TOKEN and ranges[-1].end == MAX_TOKEN
        assert all(a.end == b.start for a, b in zip(ranges, ranges[1:]))      # contiguous: no gap, no overlap
        assert all(not (r.start < t < r.end) for r in ranges for t in ring)   # none straddles a node's token
        assert len(ranges) >= max(splits, nodes + 1) * 0.7
    assert 7 in TokenRange(0, 7) and 0 not in TokenRange(0, 7)
    with pytest.raises(ValueError):
        split_ring([], 0)


def test_a_scanned_range_is_kept_and_read_back_instead_of_scanned_again(tmp_path):
    """A rerun of a batch (or a recomputed Spark task) merges the very rows the first attempt read."""
    from cdc_lib.celllog.schema import CELL_LOG_SCHEMA
    store = ObjectStore.from_url(str(tmp_path))
    first = pa.RecordBatch.from_pylist([{
        "segment": "cql:x", "segment_id": 0, "position": 0, "entry_index": 0, "seq": 0, "table_id": "t",
        "keyspace": "ks", "table": "t", "partition_key": b"k", "token": 1, "clustering": b"", "is_static": False,
        "kind": "row_liveness", "timestamp": 5, "ttl": 0, "local_deletion_time": LIVE}], schema=CELL_LOG_SCHEMA)
    calls = []

    def scan_rows(stats):
        calls.append(1)
        stats.update(rows=1, pages=[[1, 1_700_000_000_000_000], [MAX_TOKEN, 1_700_000_000_000_500]])
        yield first
    stats: dict = {}
    got = list(read_scanned_range(store, "backfill/c/r/ks.t/0.arrow", scan_rows, stats))
    assert got == [first] and stats["rows"] == 1 and stats["from_store"] == 0 and len(calls) == 1
    assert store.info("backfill/c/r/ks.t/0.arrow").checksum is not None
    again_stats: dict = {}
    again = list(read_scanned_range(store, "backfill/c/r/ks.t/0.arrow", scan_rows, again_stats))
    assert again == [first] and len(calls) == 1
    assert again_stats == {"rows": 1, "pages": stats["pages"], "from_store": 1}
    # an Arrow stream without the scan's closing batch is not taken for a complete scan
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, CELL_LOG_SCHEMA) as w:
        w.write_batch(first)
    data = sink.getvalue().to_pybytes()
    from cdc_lib.storage.objects import sha256_bytes
    store.put_bytes("backfill/c/r/ks.t/1.arrow", data, checksum=sha256_bytes(data))
    with pytest.raises(FormatError, match="without its closing batch"):
        list(read_scanned_range(store, "backfill/c/r/ks.t/1.arrow", scan_rows, {}))


def test_the_cql_request_checks_its_arguments_before_it_connects(tmp_path):
    from cdc_lib import pipeline as P
    from cdc_lib.pipeline.backfill import request_backfill
    (tmp_path / "schema.cql").write_text(DDL)
    (tmp_path / "store").mkdir()
    cfg = P.PipelineConfig(store_url=str(tmp_path / "store"), cluster="c1", schema_file=str(tmp_path / "schema.cql"),
                           cassandra_hosts=["127.0.0.1"], cassandra_port=1)
    with pytest.raises(ConfigError, match="mode cql takes no purpose: purpose belongs to mode replay"):
        request_backfill(cfg, mode="cql", purpose="rebuild")
    with pytest.raises(ConfigError, match="mode replay takes no splits: splits belongs to mode cql"):
        request_backfill(cfg, mode="replay", splits=4)
    with pytest.raises(ConfigError, match="ks.two is not a captured table"):        # cdc = false
        request_backfill(cfg, mode="cql", tables="ks.two")
    with pytest.raises(ScanError, match="counter columns"):
        request_backfill(cfg, mode="cql", tables=["ks.ctr"])
    with pytest.raises(ConfigError, match="splits must be at least 1"):
        request_backfill(cfg, mode="cql", splits=0)
    with pytest.raises(ConfigError, match="consistency 'SERIAL'"):
        request_backfill(cfg, mode="cql", consistency="serial")
    with pytest.raises(ConfigError, match="cannot connect to 127.0.0.1 port 1"):
        request_backfill(cfg, mode="cql")        # every captured table but the counter one: then it connects
    cfg.cassandra_hosts = []
    with pytest.raises(ConfigError, match="needs cassandra_hosts"):
        request_backfill(cfg, mode="cql")


def test_a_partitions_horizon_is_when_the_scan_read_it():
    """Page by page: the first page that could hold the token (a wide partition's first page); tokens of no
    scanned range have none; a newer scan of a range replaces what was known of it."""
    from cdc_lib.scan.horizon import Horizon
    h = Horizon([(-100, 0, [(-50, 10), (-20, 20), (0, 30)]), (0, 100, [(100, 40)])])
    assert [h.at(t) for t in (-100, -99, -50, -49, -20, -1, 0, 1, 100, 101)] == \
        [None, 10, 10, 20, 20, 30, 30, 40, 40, None]
    h2 = h.merged(-100, 0, [(0, 99)])
    assert [h2.at(t) for t in (-99, 0, 50)] == [99, 99, 40]
    assert Horizon.from_json(h2.to_json()).ranges == h2.ranges


def test_commit_log_changes_older_than_the_scans_read_make_no_event(schema):
    """A set element written and removed before the scan read the row: the scan shows the row without it. The
    commit log brings both changes after the scan; merged with events, the element would come back for a moment.
    Older than the partition's horizon, they are merged without an event; a later change is an event."""
    table = schema.by_name("ks", "t")
    pk, ck = i32(3), encode_clustering([i32(1)])
    scanned = _records(TableScan(table), [_row(3, 1, v=b"v", v_t=(i64(100), None), st=coll(b"e0"),
                                              st_t=(coll(i64(100)), coll(None)))])
    loaded = process_partition(table, pk, murmur3(pk), scanned, None, 1000, create_op="r").state

    def rec(kind, path, value, ts, mid):
        return _log_record(table, pk, ck, kind, "st", path, value, ts, mid)
    older = [rec("cell", b"x", b"", 200, 1), rec("cell_tombstone", b"x", None, 300, 2)]
    loud = process_partition(table, pk, murmur3(pk), older[:1], loaded, 1001)
    assert [list(e["after"]["st"]) for e in loud.events] == [["e0", "x"]]    # what the horizon prevents
    quiet = process_partition(table, pk, murmur3(pk), older, loaded, 1001, quiet_before=400)
    assert quiet.events == []
    later = process_partition(table, pk, murmur3(pk), [rec("cell", b"y", b"", 500, 3)], quiet.state, 1002,
                              quiet_before=400)
    assert [(list(e["before"]["st"]), list(e["after"]["st"])) for e in later.events] == [(["e0"], ["e0", "y"])]


def _log_record(table, pk: bytes, ck: bytes, kind: str, column: str, path, value, ts: int, mid: int) -> dict:
    """A cell-log record of ``ks.t`` (one cell or cell tombstone of row ``ck``), as the commit log gives it."""
    from cdc_lib.celllog.schema import CELL_LOG_SCHEMA
    r = {f.name: None for f in CELL_LOG_SCHEMA}
    r.update(segment="CommitLog-7-1.log", segment_id=1, position=ts, entry_index=0, seq=0, table_id=str(table.id),
             keyspace="ks", table="t", partition_key=pk, token=murmur3(pk), clustering=ck, is_static=False,
             kind=kind, column=column, path=path, value=value, timestamp=ts, ttl=0,
             local_deletion_time=LIVE if kind == "cell" else 1, mutation_id=bytes([mid]) * 16)
    return r


def test_a_deletion_the_scan_saw_makes_no_event_after_an_older_write_merged_quietly(schema):
    """v written at 200, deleted at 450; the scan asked for the page at 400 and read the row after 450: it shows
    the row without v (and no tombstone: a scan shows none). The commit log brings both: the write, older than
    the horizon, is merged quietly and brings v back in the state for a moment; the deletion is newer. Consumers
    hold the scan's row, so there is no event: an update from v = 'old' to no v would show a state they never
    had after the one they hold (seen on a real cluster: tests/test_backfill_real.py)."""
    table = schema.by_name("ks", "t")
    pk, ck = i32(3), encode_clustering([i32(1)])
    scanned = _records(TableScan(table), [_row(3, 1, st=coll(b"e0"), st_t=(coll(i64(100)), coll(None)))])
    loaded = process_partition(table, pk, murmur3(pk), scanned, None, 1000, create_op="r").state
    log = [_log_record(table, pk, ck, "cell", "v", None, b"old", 200, 1),
           _log_record(table, pk, ck, "cell_tombstone", "v", None, None, 450, 2)]
    res = process_partition(table, pk, murmur3(pk), log, loaded, 1001, quiet_before=400)
    assert res.events == []
    # the same records without the horizon: the event the scan's row contradicts
    loud = process_partition(table, pk, murmur3(pk), log, loaded, 1001)
    assert [(e["before"]["v"], e["after"]["v"]) for e in loud.events] == [(None, "old"), ("old", None)]


def test_a_write_merged_quietly_shows_in_the_next_event_of_the_batch_after_the_row_consumers_hold(schema):
    """A write older than the horizon that the scan did not show (in flight while the page was read) is merged
    without an event; a newer change of the same row in the same batch is an event from the row as the scan
    showed it to the row with both."""
    table = schema.by_name("ks", "t")
    pk, ck = i32(3), encode_clustering([i32(1)])
    scanned = _records(TableScan(table), [_row(3, 1, st=coll(b"e0"), st_t=(coll(i64(100)), coll(None)))])
    loaded = process_partition(table, pk, murmur3(pk), scanned, None, 1000, create_op="r").state
    log = [_log_record(table, pk, ck, "cell", "st", b"x", b"", 200, 1),
           _log_record(table, pk, ck, "cell", "st", b"y", b"", 500, 2)]
    res = process_partition(table, pk, murmur3(pk), log, loaded, 1001, quiet_before=400)
    assert [(sorted(e["before"]["st"]), sorted(e["after"]["st"])) for e in res.events] == \
        [(["e0"], ["e0", "x", "y"])]


BIGINT_TABLE = ("CREATE TABLE testtypes1.bigint (id int PRIMARY KEY, bigintval bigint) "
                "WITH ID = bfd81e60-dce7-11eb-b28f-9116fc548b6b AND cdc = true;")


def test_loaded_sources_merge_alike_on_spark_and_in_the_process(tmp_path, corpus, spark_session):
    """Token ranges and an SSTable of a snapshot, one Spark task each: the same events and state as in the
    transform's own process (the ranges come from the store, as on a rerun: no cluster needed; the SSTable is a
    real Cassandra 3.11 one of the corpus, shipped as an agent ships a snapshot)."""
    from cdc_lib.sinks.delta import read_outbox, read_state
    from cdc_lib.spark.merge_job import run_batch
    from cdc_lib.storage.layout import Layout
    from cdc_lib.storage.objects import sha256_file
    schema = load_cql_schema(DDL + "CREATE KEYSPACE testtypes1 WITH replication = {'class': 'SimpleStrategy', "
                             "'replication_factor': 1};\n" + BIGINT_TABLE)
    store = ObjectStore.from_url(str(tmp_path / "store"))
    table = schema.by_name("ks", "t")
    scan = TableScan(table)
    sources = []
    for i, rows in enumerate(([_row(k, c, v=b"v%d" % c, v_t=(i64(10 + c), None), st=coll(b"a"),
                                    st_t=(coll(i64(5)), coll(None))) for k in (1, 2) for c in range(3)],
                              [_row(7, None, s=b"S", s_t=(i64(3), None)), _row(8, 1)])):
        key = f"backfill/c1/cql-1-x/ks.t/{i}.arrow"

        def scan_rows(stats, rows=rows, i=i):
            out = RecordColumns()
            scan.records(rows, 1000, f"cql:cql-1-x/ks.t/{i}", 0, out)
            stats.update(rows=len(rows), pages=[[MAX_TOKEN if i else 0, 1_000_000]])
            yield out.take()
        list(read_scanned_range(store, key, scan_rows, {}))
        sources.append({"kind": "cql", "table": "ks.t", "index": i, "of": 2, "start": MIN_TOKEN if i == 0 else 0,
                        "end": 0 if i == 0 else MAX_TOKEN, "key": key, "source": f"cql:cql-1-x/ks.t/{i}",
                        "element_times": True})
    table_dir = "bigint-bfd81e60dce711ebb28f9116fc548b6b"
    files = []
    for f in sorted((corpus / "sstables" / "3.11-types" / "data" / table_dir).iterdir()):
        key = Layout.snapshot_file("c1", "n1", "s1", "testtypes1", table_dir, f.name)
        store.put_file(f, key, checksum=sha256_file(f)[0])
        files.append({"key": key, "name": f.name, "dir": f"testtypes1/{table_dir}", "size": f.stat().st_size,
                      "path": str(tmp_path / "store" / key)})
    data_size = next(f["size"] for f in files if f["name"].endswith("-Data.db"))
    sources.append({"kind": "sstable", "id": "n1/bigint", "table": "testtypes1.bigint", "node": "n1", "files": files,
                    "size": data_size, "source": f"n1/testtypes1/{table_dir}/md-1-big-Data.db"})
    got = {}
    for name, session in (("driver", None), ("spark", spark_session)):
        root = str(tmp_path / name)
        loaded = []
        res = run_batch(session, sources, root=root, schema=schema, batch_id="b1", batch_seq=1, now=2000,
                        store_url=str(tmp_path / "store"), create_op="r", on_loaded=loaded.extend)
        rows = list(read_outbox(root, "b1"))
        state = read_state(root, "ks", "t").to_pylist()
        bigint = read_state(root, "testtypes1", "bigint").to_pylist()
        got[name] = ([(r["op"], r["key_json"], r["event_json"]) for r in rows],
                     sorted((r["k"], r["c"], r["v"], r["_cdc_live"]) for r in state),
                     [(r["id"], r["bigintval"]) for r in bigint],
                     sorted((str(s["index"]), s.get("rows"), s.get("partitions")) for s in loaded), res.events)
    assert got["driver"] == got["spark"]
    events, state, bigint, loaded, n = got["driver"]
    # 6 rows, a static-only partition, a key-only row; the SSTable's one row
    assert [op for op, _, _ in events] == ["r"] * 9 and n == 9
    assert bigint == [(1, 1234567)]
    assert loaded == [("0", 6, None), ("1", 2, None), ("n1/bigint", None, 1)]


def test_a_long_ranges_read_times_are_kept_coarse_and_never_later_than_the_read():
    from cdc_lib.scan.horizon import Horizon
    from cdc_lib.scan.reader import coarse_pages
    pages = [(t * 10, 1000 + t) for t in range(1, 1001)]                   # 1000 pages, the last ends at 10000
    kept = coarse_pages(pages, 64)
    assert len(kept) <= 64 and kept[-1][0] == 10_000
    exact, coarse = Horizon([(0, 10_000, pages)]), Horizon([(0, 10_000, kept)])
    assert all(coarse.at(t) <= exact.at(t) for t in range(1, 10_001, 7))
    assert coarse_pages(pages[:5], 64) == pages[:5]
