"""The node-side agent: what a Cassandra operator would see in cdc_raw and in the store."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_storage import _s3_store

from cdc_lib import settings as config
from cdc_lib.agent.cdc_raw import holds_data, read_idx, scan_cdc_raw, synced_file_end
from cdc_lib.agent.shipper import Agent
from cdc_lib.agent.space import SpaceMonitor, default_cdc_total_space
from cdc_lib.cli.agent import agent_main, build_parser, load_agent_config
from cdc_lib.errors import ConfigError
from cdc_lib.settings import AgentConfig
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import ObjectStore, sha256_bytes

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
REAL_SEGMENT = CORPUS / "commitlog" / "4.0.11" / "CommitLog-7-1699285478684.log"
REAL_LZ4_SEGMENT = CORPUS / "commitlog" / "2.2-lz4" / "CommitLog-5-1438186885380.log"
MiB = 1024 * 1024


class SimulatedCrash(BaseException):
    """Raised from a hook: the process 'dies' there (BaseException, so the agent does not catch it)."""


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture(scope="module")
def segment_bytes() -> bytes:
    return REAL_SEGMENT.read_bytes()


@pytest.fixture
def node(tmp_path):
    """A node's directories: commitlog (where Cassandra writes), cdc_raw, and the agent's state dir."""
    for d in ("commitlog", "cdc_raw", "state", "store"):
        (tmp_path / d).mkdir()
    return tmp_path


def make_config(node: Path, **kw) -> AgentConfig:
    kw.setdefault("cdc_total_space", 1024 * MiB)
    return AgentConfig(cdc_raw=node / "cdc_raw", store_url=str(node / "store"), cluster="prod", node="cass-1",
                       state_dir=node / "state", **kw)


def variant(data: bytes, n: int) -> bytes:
    """A distinct segment body (the agent ships bytes; it does not care that the header id differs)."""
    return data[:-8] + n.to_bytes(8, "big")


def add_311_segment(node: Path, seg_id: int, data: bytes) -> Path:
    """Cassandra 3.11: the finished segment is renamed from commitlog/ into cdc_raw/."""
    src = node / "commitlog" / f"CommitLog-6-{seg_id}.log"
    src.write_bytes(data)
    dst = node / "cdc_raw" / src.name
    os.rename(src, dst)
    return dst


def add_40_segment(node: Path, seg_id: int, data: bytes) -> tuple[Path, Path]:
    """Cassandra 4.0: the live segment is hard-linked into cdc_raw at creation. Returns (original, link)."""
    orig = node / "commitlog" / f"CommitLog-7-{seg_id}.log"
    orig.write_bytes(data)
    link = node / "cdc_raw" / orig.name
    os.link(orig, link)
    return orig, link


def write_idx(node: Path, seg_id: int, text: str, suffix: str = "_cdc.idx") -> Path:
    p = node / "cdc_raw" / f"CommitLog-7-{seg_id}{suffix}"
    p.write_text(text)  # rewritten in place, as Java's FileWriter does
    return p


def store_of(node: Path) -> ObjectStore:
    return ObjectStore.from_url(str(node / "store"))


def incoming(name: str) -> str:
    return Layout.incoming("prod", "cass-1", name)


# ------------------------------------------------------------------------------------------------ idx files
@pytest.mark.parametrize("text, expected", [
    ("1234", (1234, False)), ("5678\nCOMPLETED", (5678, True)), ("5678\nCOMPLETED\n", (5678, True)),
    ("", None), ("56", (56, False)), ("5678\nCOMPL", None), ("x12", None), ("12\nDONE", None),
])
def test_read_idx(tmp_path, text, expected):
    p = tmp_path / "CommitLog-7-1_cdc.idx"
    p.write_text(text)
    got = read_idx(p)
    assert (None if got is None else (got.offset, got.completed)) == expected


@settings(max_examples=300, deadline=None)
@given(offset=st.integers(0, 2 ** 31 - 1), completed=st.booleans(), data=st.data())
def test_a_half_rewritten_idx_never_overstates_progress(tmp_path_factory, offset, completed, data):
    """Whatever prefix of the idx a reader catches, it never claims more than was written."""
    full = f"{offset}\nCOMPLETED" if completed else f"{offset}"
    seen = full[:data.draw(st.integers(0, len(full)))]
    p = tmp_path_factory.getbasetemp() / "CommitLog-7-1_cdc.idx"  # rewritten in place, like Cassandra does
    p.write_text(seen)
    got = read_idx(p)
    if got is not None:
        assert got.offset <= offset
        assert not got.completed or (completed and seen == full and got.offset == offset)


def test_read_idx_of_a_missing_file_is_unknown(tmp_path):
    assert read_idx(tmp_path / "CommitLog-7-1_cdc.idx") is None


# ------------------------------------------------------------------------------------------------ shipping
def test_311_segment_renamed_in_is_shipped_verified_and_removed(node, segment_bytes):
    path = add_311_segment(node, 1500000000000, segment_bytes)
    agent = Agent(make_config(node))
    assert agent.run_once() == 1
    store = store_of(node)
    key = incoming(path.name)
    assert store.get_bytes(key) == segment_bytes
    assert store.info(key).checksum == sha256_bytes(segment_bytes)
    assert not path.exists()
    assert list((node / "cdc_raw").iterdir()) == []
    m = agent.metrics()
    assert (m["segments_shipped"], m["bytes_shipped"], m["upload_failures"]) == (1, len(segment_bytes), 0)
    assert m["cdc_raw_bytes"] == 0 and m["last_shipped_segment"] == path.name


def test_40_segment_waits_for_completed_idx(node, segment_bytes):
    seg_id = 1699285478684
    orig, link = add_40_segment(node, seg_id, segment_bytes)
    store = store_of(node)
    agent = Agent(make_config(node))

    def shipped_nothing():
        assert agent.run_once() == 0
        assert link.exists() and store.list() == []

    shipped_nothing()  # linked, no idx yet: live
    idx = write_idx(node, seg_id, "1234")
    shipped_nothing()  # synced up to 1234, still being written
    write_idx(node, seg_id, "")
    shipped_nothing()  # caught mid-rewrite: empty
    write_idx(node, seg_id, "5678\nCOMPL")
    shipped_nothing()  # caught mid-rewrite: partial
    assert agent.metrics()["live_segments"] == 1 and agent.metrics()["pending_segments"] == 0
    idx = write_idx(node, seg_id, "5678\nCOMPLETED")
    completed_at = time.time() - 90           # Cassandra wrote COMPLETED 90 s ago; the agent sees it only now
    os.utime(link, (completed_at - 30, completed_at - 30))
    os.utime(idx, (completed_at, completed_at))
    assert agent.run_once() == 1
    assert store.get_bytes(incoming(link.name)) == segment_bytes
    # the close time travels with the object (where the pipeline's end-to-end lag starts), not the ship time
    assert float(store.info(incoming(link.name)).attributes["closed_at"]) == pytest.approx(completed_at, abs=1e-3)
    assert not link.exists() and not idx.exists()
    assert orig.exists()  # the commitlog/ file is Cassandra's to delete; only the link was ours
    assert agent.metrics()["segments_shipped"] == 1


def _segment(directory: Path, seg_id: int, *, entries: int = 0, compression=None, close: bool = True) -> Path:
    from cdc_lib.commitlog import writer
    w = writer.SegmentWriter(directory, seg_id, version=7, compression=compression, segment_size=64 * 1024)
    for i in range(entries):
        w.add(os.urandom(40 + i))
    if close:
        w.close()
    else:
        w.sync()
        w._f.close()
    return Path(w.path)


def _shutdown_leftover(node: Path, seg_id: int, **kw) -> Path:
    """What a clean Cassandra 4.0+/5.0 shutdown leaves: the pre-allocated segment, linked into cdc_raw when it
    was created, then deleted from commitlog/ without its link: no idx, link count 1."""
    orig = _segment(node / "commitlog", seg_id, **kw)
    link = node / "cdc_raw" / orig.name
    os.link(orig, link)
    orig.unlink()
    return link


@pytest.mark.parametrize("compression", [None, "LZ4Compressor"])
def test_empty_segment_left_by_a_clean_shutdown_is_removed_after_the_grace(node, compression):
    link = _shutdown_leftover(node, 1795000000001, compression=compression, close=False)
    assert holds_data(link) is False
    (seg,) = scan_cdc_raw(node / "cdc_raw").segments
    assert seg.orphaned and not seg.complete and seg.links == 1
    waiting = Agent(make_config(node, orphan_grace_s=3600))
    assert waiting.run_once() == 0 and link.exists()        # too recent: Cassandra may still be at it
    assert waiting.metrics()["orphaned_segments"] == 1 and waiting.metrics()["live_segments"] == 0
    assert "1 empty segment(s) a Cassandra shutdown left" in waiting.pass_summary()
    agent = Agent(make_config(node, orphan_grace_s=0))
    assert agent.run_once() == 0
    assert not link.exists() and store_of(node).list() == []
    assert agent.metrics()["empty_segments_removed"] == 1 and agent.metrics()["cdc_raw_bytes"] == 0


def test_segments_that_look_orphaned_but_are_not_are_kept_or_shipped(node, segment_bytes):
    # live: still in commitlog/ (2 links), no idx yet
    live = _segment(node / "commitlog", 1795000000002, close=False)
    os.link(live, node / "cdc_raw" / live.name)
    # no longer in commitlog/, no idx, but it holds entries (never seen from Cassandra): shipped, never deleted
    with_data = _shutdown_leftover(node, 1795000000003, entries=5)
    assert holds_data(with_data) is True
    with_data_bytes = with_data.read_bytes()
    # Cassandra 3.11 renames finished segments in: link count 1 and no idx is how a complete one looks
    old = add_311_segment(node, 1795000000004, segment_bytes)
    agent = Agent(make_config(node, orphan_grace_s=0))
    assert agent.run_once() == 2
    store = store_of(node)
    assert store.get_bytes(incoming(with_data.name)) == with_data_bytes and not with_data.exists()
    assert sorted(store.list("incoming/")) == sorted([incoming(with_data.name), incoming(old.name)])
    assert (node / "cdc_raw" / live.name).exists() and agent.metrics()["empty_segments_removed"] == 0


def test_holds_data_of_real_and_written_segments(tmp_path):
    assert holds_data(REAL_SEGMENT) is True
    assert holds_data(_segment(tmp_path, 5, entries=3, compression="ZstdCompressor")) is True
    assert holds_data(_segment(tmp_path, 6, compression="ZstdCompressor")) is False     # empty final section
    assert holds_data(_segment(tmp_path, 7)) is False                                   # header + zero tail
    short = tmp_path / "CommitLog-7-8.log"
    short.write_bytes(b"\x00\x00\x00\x07")
    assert holds_data(short) is None


def test_legacy_cdc_idx_suffix_is_understood_and_removed(node, segment_bytes):
    _, link = add_40_segment(node, 42, segment_bytes)
    idx = write_idx(node, 42, "99", suffix="-CDC.idx")
    agent = Agent(make_config(node))
    assert agent.run_once() == 0
    write_idx(node, 42, "99\nCOMPLETED", suffix="-CDC.idx")
    assert agent.run_once() == 1
    assert not link.exists() and not idx.exists()


def test_segments_ship_oldest_id_first(node, segment_bytes):
    ids = [1700000000300, 1700000000100, 1700000000200]  # created in this (odd) order
    for i, seg_id in enumerate(ids):
        add_311_segment(node, seg_id, variant(segment_bytes, i))
    order: list[str] = []
    agent = Agent(make_config(node), hooks={"after_upload": order.append})
    assert agent.run_once() == 3
    assert order == [f"CommitLog-6-{i}.log" for i in sorted(ids)]
    assert store_of(node).list("incoming/") == sorted(incoming(n) for n in order)


def test_unrelated_files_in_cdc_raw_are_left_alone(node, segment_bytes):
    (node / "cdc_raw" / "README").write_text("not a segment")
    (node / "cdc_raw" / "CommitLog-7-abc.log").write_text("bad name")
    add_311_segment(node, 7, segment_bytes)
    assert Agent(make_config(node)).run_once() == 1
    assert sorted(p.name for p in (node / "cdc_raw").iterdir()) == ["CommitLog-7-abc.log", "README"]


# ------------------------------------------------------------------------------------------------ crashes
class CountingStore(ObjectStore):
    """A local store that counts uploads, to prove a restart does not upload again what was done."""

    def __init__(self, url):
        s = ObjectStore.from_url(url)
        super().__init__(s.fs, s.root, s.url, local=True)
        self.put_calls = 0

    def put_file(self, *a, **kw):
        self.put_calls += 1
        return super().put_file(*a, **kw)


CRASH_POINTS = ["mid_upload", "after_upload", "after_record", "after_delete_segment", "after_delete_idx"]


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
@pytest.mark.parametrize("layout", ["3.11", "4.0"])
def test_crash_at_any_step_neither_loses_nor_duplicates(node, segment_bytes, crash_at, layout, monkeypatch):
    bodies = {}
    for i, seg_id in enumerate([101, 102, 103]):
        body = variant(segment_bytes, i)
        if layout == "3.11":
            name = add_311_segment(node, seg_id, body).name
        else:
            name = add_40_segment(node, seg_id, body)[1].name
            write_idx(node, seg_id, f"{len(body)}\nCOMPLETED")
        bodies[name] = body
    victim = sorted(bodies)[1]  # crash while shipping the second segment

    def crash(name):
        if name == victim:
            raise SimulatedCrash(crash_at)

    store1 = CountingStore(str(node / "store"))
    if crash_at == "mid_upload":  # the object's bytes are written, its sidecar is not
        real = store1._write_sidecar

        def sidecar(key, checksum, attributes=None):
            if key.endswith(victim):
                raise SimulatedCrash(crash_at)
            real(key, checksum, attributes)

        monkeypatch.setattr(store1, "_write_sidecar", sidecar)
        hooks = {}
    else:
        hooks = {crash_at: crash}
    with pytest.raises(SimulatedCrash):
        Agent(make_config(node), store1, hooks=hooks).run_once()
    # nothing is lost at the moment of the crash: the victim is either still local or complete in the store
    victim_local = (node / "cdc_raw" / victim).exists()
    store = store_of(node)
    assert victim_local or store.info(incoming(victim)).checksum == sha256_bytes(bodies[victim])

    store2 = CountingStore(str(node / "store"))
    restarted = Agent(make_config(node), store2)
    restarted.run_once()
    assert store2.list() == sorted(incoming(n) for n in bodies)  # exactly one object per segment
    for name, body in bodies.items():
        assert store2.get_bytes(incoming(name)) == body
        assert store2.info(incoming(name)).checksum == sha256_bytes(body)
    assert list((node / "cdc_raw").iterdir()) == []
    assert list((node / "state" / "shipped").iterdir()) == []
    # after the crash only what is not complete in the store is uploaded: the third segment, and the victim
    # too if its upload was cut short
    expected_uploads = {"mid_upload": 2, "after_upload": 1}.get(crash_at, 1)
    assert store2.put_calls == expected_uploads


def test_segment_already_archived_by_the_pipeline_is_not_shipped_again(node, segment_bytes):
    path = add_311_segment(node, 5, segment_bytes)
    store = store_of(node)
    store.put_bytes(incoming(path.name), segment_bytes, checksum=sha256_bytes(segment_bytes))
    store.move(incoming(path.name), Layout.archived("prod", "cass-1", path.name))
    assert Agent(make_config(node)).run_once() == 1
    assert store.list() == [Layout.archived("prod", "cass-1", path.name)]
    assert not path.exists()


def test_key_conflict_keeps_both_copies(node, segment_bytes):
    path = add_311_segment(node, 9, segment_bytes)
    store = store_of(node)
    other = variant(segment_bytes, 99)
    store.put_bytes(incoming(path.name), other, checksum=sha256_bytes(other))
    agent = Agent(make_config(node))
    agent.run_once()
    assert store.get_bytes(incoming(path.name)) == other  # never overwritten
    quarantined = [k for k in store.list("quarantined/") if not k.endswith(".reason.json")]
    assert len(quarantined) == 1 and store.get_bytes(quarantined[0]) == segment_bytes
    assert "conflict" in store.get_json(Layout.reason(quarantined[0]))["reason"]
    assert agent.metrics()["conflicts"] == 1 and not path.exists()


# ------------------------------------------------------------------------------------------------ failures
class FlakyStore(ObjectStore):
    def __init__(self, url, failures):
        s = ObjectStore.from_url(url)
        super().__init__(s.fs, s.root, s.url, local=True)
        self.failures = failures
        self.put_calls = 0

    def put_file(self, *a, **kw):
        self.put_calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise OSError("connection reset by peer")
        return super().put_file(*a, **kw)


def test_upload_failure_keeps_the_file_backs_off_and_retries(node, segment_bytes, caplog):
    path = add_311_segment(node, 1, segment_bytes)
    clock = FakeClock()
    store = FlakyStore(str(node / "store"), failures=2)
    agent = Agent(make_config(node, poll_interval=1.0, max_backoff=30.0), store, clock=clock)
    with caplog.at_level(logging.ERROR, logger="cassandra_cdc.agent"):
        assert agent.run_once() == 0
    assert path.exists() and store.list() == []
    m = agent.metrics()
    assert m["upload_failures"] == 1 and "connection reset" in m["last_error"]
    assert any("connection reset" in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records)
    agent.run_once()  # still inside the back-off delay: no attempt
    assert store.put_calls == 1
    clock.now += 2.1
    agent.run_once()  # second failure: the delay doubles
    assert store.put_calls == 2 and agent.metrics()["consecutive_failures"] == 2
    clock.now += 2.1
    agent.run_once()
    assert store.put_calls == 2
    clock.now += 2.0
    assert agent.run_once() == 1
    assert not path.exists() and store.get_bytes(incoming(path.name)) == segment_bytes
    assert agent.metrics()["consecutive_failures"] == 0 and agent.metrics()["upload_failures"] == 2


def test_status_file_reports_the_counters(node, segment_bytes):
    add_311_segment(node, 1, segment_bytes)
    agent = Agent(make_config(node))
    agent.run_once()
    import json
    status = json.loads((node / "state" / "status.json").read_text())
    for k in ("segments_shipped", "bytes_shipped", "upload_failures", "last_error", "cdc_raw_bytes"):
        assert status[k] == agent.metrics()[k]
    assert status["segments_shipped"] == 1


# ------------------------------------------------------------------------------------------------ live prefix
def test_live_prefix_is_shipped_in_chunks_and_survives_a_restart(node, segment_bytes):
    seg_id = 77
    _, link = add_40_segment(node, seg_id, segment_bytes)
    store = store_of(node)
    cfg = make_config(node, ship_live_prefix=True)
    agent = Agent(cfg)
    prefix = Layout.live_prefix("prod", "cass-1", link.name)
    agent.run_once()
    assert store.list(prefix) == []  # no idx yet: nothing is known to be synced
    write_idx(node, seg_id, "1234")
    agent.run_once()
    write_idx(node, seg_id, "")  # mid-rewrite: no change
    agent.run_once()
    write_idx(node, seg_id, "5678")
    agent.run_once()
    chunks = store.list(prefix)
    assert chunks == [Layout.live_chunk("prod", "cass-1", link.name, 0, 1234),
                      Layout.live_chunk("prod", "cass-1", link.name, 1234, 5678)]
    assert b"".join(store.get_bytes(k) for k in chunks) == segment_bytes[:5678]
    assert all(store.info(k).checksum for k in chunks)
    assert link.exists() and store.list() == chunks  # not COMPLETED: the local file stays, no segment object

    # a restarted agent continues where the store says it was, without re-shipping or overlapping
    restarted = Agent(cfg)
    restarted.run_once()
    assert store.list(prefix) == chunks
    write_idx(node, seg_id, "9000")
    restarted.run_once()
    assert store.list(prefix)[-1] == Layout.live_chunk("prod", "cass-1", link.name, 5678, 9000)
    write_idx(node, seg_id, f"{len(segment_bytes)}\nCOMPLETED")
    assert restarted.run_once() == 1
    assert store.get_bytes(incoming(link.name)) == segment_bytes and not link.exists()
    assert restarted.metrics()["live_bytes_shipped"] == 9000 - 5678


def test_live_chunk_cut_short_is_shipped_again(node, segment_bytes):
    _, link = add_40_segment(node, 5, segment_bytes)
    write_idx(node, 5, "4000")
    store = store_of(node)
    key = Layout.live_chunk("prod", "cass-1", link.name, 0, 3000)
    store.put_bytes(key, segment_bytes[:3000])  # a crash left the bytes without their sidecar
    Agent(make_config(node, ship_live_prefix=True)).run_once()
    chunks = store.list(Layout.live_prefix("prod", "cass-1", link.name))
    assert chunks == [Layout.live_chunk("prod", "cass-1", link.name, 0, 4000)]
    assert store.get_bytes(chunks[0]) == segment_bytes[:4000]


def test_synced_file_end_maps_logical_offsets_of_a_real_compressed_segment(tmp_path):
    data = REAL_LZ4_SEGMENT.read_bytes()
    header = 18 + int.from_bytes(data[12:14], "big")
    # first section: marker at the header end, U (uncompressed length) 8 bytes further
    first_next = int.from_bytes(data[header:header + 4], "big")
    first_u = int.from_bytes(data[header + 8:header + 12], "big")
    logical_after_first = header + 8 + first_u
    assert synced_file_end(REAL_LZ4_SEGMENT, logical_after_first) == first_next
    assert synced_file_end(REAL_LZ4_SEGMENT, logical_after_first + 1) is None  # not a section boundary
    cut = tmp_path / REAL_LZ4_SEGMENT.name
    cut.write_bytes(data[:first_next + 5])  # the second section is not written yet
    second_u = int.from_bytes(data[first_next + 8:first_next + 12], "big")
    assert synced_file_end(cut, logical_after_first) == first_next
    assert synced_file_end(cut, logical_after_first + 8 + second_u) is None


def test_synced_file_end_of_compressed_segments_written_section_by_section(tmp_path):
    from cdc_lib.commitlog import writer
    w = writer.SegmentWriter(tmp_path, 123, version=7, compression="DeflateCompressor")
    boundaries = []
    for i in range(5):
        for j in range(10):
            w.add(os.urandom(50 + i * j))
        logical = w.sync()
        w._f.flush()  # what Cassandra's flush makes visible to the agent
        boundaries.append((logical, os.path.getsize(w.path)))
    w.close()
    for logical, physical in boundaries:
        assert synced_file_end(Path(w.path), logical) == physical
    assert synced_file_end(Path(w.path), boundaries[0][0] - 1) is None


def test_live_prefix_of_a_compressed_40_segment_cuts_at_section_ends(node):
    """commitlog_compression on 4.0: the idx offset is logical, the chunks must end where a section ends."""
    from cdc_lib.commitlog import writer
    w = writer.SegmentWriter(node / "commitlog", 321, version=7, compression="DeflateCompressor")
    link = node / "cdc_raw" / w.name
    os.link(w.path, link)  # Cassandra links the segment into cdc_raw when it creates it
    agent = Agent(make_config(node, ship_live_prefix=True))
    store = store_of(node)
    for section in range(3):
        for i in range(20):
            w.add(bytes([section, i]) * (40 + i))
        w.sync()
        w._f.flush()  # the flush that precedes Cassandra's idx update
        w.write_cdc_index(node / "cdc_raw")
        agent.run_once()
    w.close()
    chunks = store.list(Layout.live_prefix("prod", "cass-1", w.name))
    assert len(chunks) == 3
    final = Path(w.path).read_bytes()
    ends = [Layout.parse_live_chunk(k)[1] for k in chunks]
    assert b"".join(store.get_bytes(k) for k in chunks) == final[:ends[-1]]
    assert ends[-1] < len(final)  # the section written at close is not in any chunk
    w.write_cdc_index(node / "cdc_raw", completed=True)
    assert agent.run_once() == 1
    assert store.get_bytes(incoming(w.name)) == final and not link.exists()


def test_synced_file_end_of_an_uncompressed_segment_is_the_idx_offset(tmp_path, segment_bytes):
    assert synced_file_end(REAL_SEGMENT, 5678) == 5678
    short = tmp_path / REAL_SEGMENT.name
    short.write_bytes(segment_bytes[:100])
    assert synced_file_end(short, 5678) is None


# ------------------------------------------------------------------------------------------------ space
def test_space_warning_when_cdc_raw_is_half_full(node, segment_bytes, caplog):
    for i in range(3):
        _, link = add_40_segment(node, 10 + i, variant(segment_bytes, i))  # live: cannot be shipped yet
    agent = Agent(make_config(node, cdc_total_space=4 * MiB))
    with caplog.at_level(logging.WARNING, logger="cassandra_cdc.agent"):
        agent.run_once()
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("3.0 MiB" in m and "75%" in m and "4 MiB" in m for m in msgs), msgs
    assert agent.metrics()["cdc_raw_bytes"] == 3 * len(segment_bytes)
    assert agent.metrics()["cdc_usage_fraction"] == pytest.approx(0.75)


def test_space_monitor_warns_when_arrival_outpaces_shipping(caplog):
    mon = SpaceMonitor(1000 * MiB, window=60, repeat_every=30)
    with caplog.at_level(logging.WARNING, logger="cassandra_cdc.agent"):
        assert mon.observe(0, 10 * MiB, 0) == []
        assert mon.observe(20, 30 * MiB, 5 * MiB) == []  # not a full half-window of history yet
        warnings = mon.observe(40, 50 * MiB, 10 * MiB)
    # 40 MiB more in cdc_raw and 10 MiB shipped in 40 s: 1.25 MiB/s arrive, 0.25 MiB/s leave
    assert len(warnings) == 1
    assert "1.25 MiB/s arrive" in warnings[0] and "0.25 MiB/s shipped" in warnings[0]
    assert "950.0 MiB left" in warnings[0] and "full in about 950 s" in warnings[0]
    assert mon.observe(41, 51 * MiB, 10 * MiB) == []  # rate-limited
    assert any("grows faster" in r.getMessage() for r in caplog.records)


def test_space_monitor_is_quiet_when_shipping_keeps_up():
    mon = SpaceMonitor(1000 * MiB, window=60)
    shipped = 0
    for t in range(0, 200, 5):
        shipped += 32 * MiB
        assert mon.observe(t, 64 * MiB if t % 10 else 32 * MiB, shipped) == []


def test_default_cdc_total_space_follows_cassandra(tmp_path):
    import shutil
    volume_mib = shutil.disk_usage(tmp_path).total // MiB
    assert default_cdc_total_space(tmp_path) == min(4096, volume_mib // 8) * MiB


# ------------------------------------------------------------------------------------------------ config
def test_config_precedence_flags_env_yaml_defaults(tmp_path):
    yml = tmp_path / "cdc.yaml"
    yml.write_text(
        "store_url: s3://bucket/prod\ncluster: main\npoll_interval: 9\n"
        "storage_options: {endpoint_url: 'http://127.0.0.1:1'}\n"
        "pipeline: {batch_size: 10}\n"
        "agent:\n  cdc_raw: /var/lib/cassandra/cdc_raw\n  poll_interval: 5\n  cdc_total_space: 2GiB\n")
    env = {"CASSANDRA_CDC_POLL_INTERVAL": "3", "CASSANDRA_CDC_NODE": "from-env",
           "CASSANDRA_CDC_SHIP_LIVE_PREFIX": "yes"}
    cfg = config.load(AgentConfig, flags={"poll_interval": 0.5, "node": None}, env=env, config_file=yml,
                      section="agent")
    assert cfg.poll_interval == 0.5  # flag beats env, section and top level
    assert cfg.node == "from-env"  # env beats the default; a flag left at None does not count
    assert cfg.ship_live_prefix is True
    assert cfg.cdc_total_space == 2 * 1024 ** 3
    assert cfg.cdc_raw == Path("/var/lib/cassandra/cdc_raw")
    assert cfg.store_url == "s3://bucket/prod" and cfg.cluster == "main"
    assert cfg.storage_options == {"endpoint_url": "http://127.0.0.1:1"}
    assert cfg.state_dir == Path("/var/lib/cassandra/cassandra-cdc-agent")
    cfg2 = config.load(AgentConfig, env={}, config_file=yml, section="agent")
    assert cfg2.poll_interval == 5  # the agent section beats the shared top level
    assert cfg2.max_backoff == 60.0  # default


def test_config_file_from_environment_and_json_options(tmp_path):
    yml = tmp_path / "a.yaml"
    yml.write_text("cluster: c\n")
    env = {"CASSANDRA_CDC_CONFIG": str(yml), "CASSANDRA_CDC_CDC_RAW": str(tmp_path),
           "CASSANDRA_CDC_STORE_URL": "memory://x", "CASSANDRA_CDC_STORAGE_OPTIONS": '{"anon": true}'}
    cfg = config.load(AgentConfig, env=env, section="agent")
    assert cfg.cluster == "c" and cfg.storage_options == {"anon": True}


@pytest.mark.parametrize("yaml_text, env, message", [
    ("agent: {cdc_raw: /x, store_url: /s, cluster: c, poll_intervall: 1}\n", {}, "poll_intervall"),
    ("colour: blue\n", {}, "colour"),
    ("cdc_raw: /x\nstore_url: /s\ncluster: c\n", {"CASSANDRA_CDC_CDC_TOTAL_SPACE": "lots"},
     "CASSANDRA_CDC_CDC_TOTAL_SPACE"),
    ("cdc_raw: /x\nstore_url: /s\ncluster: c\n", {"CASSANDRA_CDC_POLL_INTERVAL": "soon"}, "poll_interval"),
    ("cdc_raw: /x\nstore_url: /s\n", {}, "--cluster"),
    ("cdc_raw: /x\nstore_url: /s\ncluster: a/b\n", {}, "cluster"),
    ("cdc_raw: /x\nstore_url: /s\ncluster: c\npoll_interval: 0\n", {}, "poll_interval"),
    ("[1, 2]\n", {}, "mapping"),
    ("a: [\n", {}, "YAML"),
])
def test_bad_settings_raise_config_error_naming_the_setting(tmp_path, yaml_text, env, message):
    yml = tmp_path / "bad.yaml"
    yml.write_text(yaml_text)
    with pytest.raises(ConfigError) as e:
        config.load(AgentConfig, env=env, config_file=yml, section="agent")
    assert message in str(e.value)


@pytest.mark.parametrize("text, size", [("4096MiB", 4096 * MiB), ("2GiB", 2 * 1024 ** 3), ("10MB", 10 ** 7),
                                        ("1048576", MiB), (512, 512), ("1.5KiB", 1536)])
def test_parse_size(text, size):
    assert config.parse_size(text) == size


def test_flags_reach_the_config(tmp_path):
    args = build_parser().parse_args([
        "--cdc-raw", str(tmp_path), "--store-url", "memory://s", "--cluster", "c", "--node", "n1",
        "--storage-option", "endpoint_url=http://127.0.0.1:9", "--storage-option", "anon=true",
        "--ship-live-prefix", "--cdc-total-space", "100MiB", "--poll-interval", "0.25"])
    cfg = load_agent_config(args, env={})
    assert cfg.storage_options == {"endpoint_url": "http://127.0.0.1:9", "anon": True}
    assert (cfg.node, cfg.ship_live_prefix, cfg.cdc_total_space, cfg.poll_interval) == ("n1", True, 100 * MiB, 0.25)


def test_agent_main_once_and_config_errors(node, segment_bytes, capsys, monkeypatch):
    """Exit statuses (cli.exits): 0 done, 1 usage/configuration error, 3 a segment could not be shipped; --once
    says in one line what it did and what cdc_raw still holds."""
    for var in [v for v in os.environ if v.startswith("CASSANDRA_CDC_")]:
        monkeypatch.delenv(var)
    argv = ["--cdc-raw", str(node / "cdc_raw"), "--store-url", str(node / "store"), "--cluster", "prod",
            "--node", "cass-1", "--state-dir", str(node / "state"), "--once"]
    assert agent_main(argv) == 0
    assert capsys.readouterr().out == f"cassandra-cdc agent: nothing shipped; {node / 'cdc_raw'} holds no segment\n"
    add_311_segment(node, 3, segment_bytes)
    add_40_segment(node, 4, segment_bytes)
    write_idx(node, 4, "1234")
    assert agent_main(argv) == 0
    assert store_of(node).list() == [incoming("CommitLog-6-3.log")]
    assert capsys.readouterr().out == (
        f"cassandra-cdc agent: shipped 1 segment(s), {len(segment_bytes):,} bytes, to {store_of(node).url}; "
        f"{node / 'cdc_raw'} holds 1 live segment(s), shipped once their _cdc.idx says COMPLETED\n")

    assert agent_main(["--store-url", str(node / "store"), "--cluster", "prod", "--once"]) == 1
    assert capsys.readouterr().err == ("cassandra-cdc agent: AgentConfig: missing required setting(s): "
                                       "--cdc-raw / CASSANDRA_CDC_CDC_RAW\n")
    assert agent_main(argv[:-1] + ["--cdc-raw", str(node / "missing"), "--once"]) == 1
    assert capsys.readouterr().err == f"cassandra-cdc agent: cdc_raw directory {node / 'missing'} does not exist\n"
    with pytest.raises(SystemExit) as e:
        agent_main(["--no-such-flag"])
    assert e.value.code == 1
    assert capsys.readouterr().err.endswith("cassandra-cdc agent: error: unrecognized arguments: --no-such-flag\n")


def test_agent_once_that_cannot_ship_exits_3_and_says_why(node, segment_bytes, capsys, monkeypatch):
    from cdc_lib.cli import agent as agent_cli
    add_311_segment(node, 5, segment_bytes)
    monkeypatch.setattr(agent_cli, "Agent", lambda cfg: Agent(cfg, FlakyStore(str(node / "store"), failures=1)))
    argv = ["--cdc-raw", str(node / "cdc_raw"), "--store-url", str(node / "store"), "--cluster", "prod",
            "--node", "cass-1", "--state-dir", str(node / "state"), "--once"]
    assert agent_main(argv) == 3
    assert capsys.readouterr().out == (
        f"cassandra-cdc agent: nothing shipped; {node / 'cdc_raw'} holds 1 completed segment(s) not shipped "
        "(last error: CommitLog-6-5.log: OSError: connection reset by peer)\n")


def test_unreadable_idx_is_named_in_a_rate_limited_warning(node, segment_bytes, caplog, capsys):
    """A garbage _cdc.idx keeps its segment waiting; the agent names it (not for a rewrite caught half-way)."""
    _, link = add_40_segment(node, 8, segment_bytes)
    idx = write_idx(node, 8, "garbage")
    clock = FakeClock()
    agent = Agent(make_config(node), clock=clock)
    with caplog.at_level(logging.WARNING, logger="cassandra_cdc.agent"):
        agent.run_once()
        clock.now += 29                                   # not yet: could be a rewrite in progress
        agent.run_once()
        assert [r for r in caplog.records if "unreadable" in r.getMessage()] == []
        clock.now += 2
        agent.run_once()
        clock.now += 300                                  # still broken: not repeated within 10 minutes
        agent.run_once()
        warned = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
        assert warned == [f"{idx} has been unreadable for 31 s (it holds b'garbage'; Cassandra writes '<offset>' or "
                          f"'<offset>\\nCOMPLETED'): {link.name} is not shipped until the idx is readable"]
        clock.now += 300
        agent.run_once()
        assert len([r for r in caplog.records if "unreadable" in r.getMessage()]) == 2
    assert agent.metrics()["unreadable_idx"] == 1 and link.exists()
    assert agent.pass_summary() == (f"nothing shipped; {node / 'cdc_raw'} holds 1 segment(s) waiting on an "
                                    f"unreadable _cdc.idx: {idx}")
    write_idx(node, 8, f"{len(segment_bytes)}\nCOMPLETED")
    assert agent.run_once() == 1 and agent.metrics()["unreadable_idx"] == 0


def test_sigterm_stops_the_agent_cleanly(node, segment_bytes):
    path = add_311_segment(node, 11, segment_bytes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASSANDRA_CDC_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc_lib.cli", "agent", "--cdc-raw", str(node / "cdc_raw"), "--store-url",
         str(node / "store"), "--cluster", "prod", "--node", "cass-1", "--state-dir", str(node / "state"),
         "--poll-interval", "0.2"],
        cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while path.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert not path.exists(), "the running agent did not ship the segment"
        # a segment arriving while it runs is shipped too
        late = add_311_segment(node, 12, variant(segment_bytes, 1))
        while late.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not late.exists()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert time.monotonic() - t0 < 3
        assert "received SIGTERM" in err and "agent stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert store_of(node).list() == [incoming("CommitLog-6-11.log"), incoming("CommitLog-6-12.log")]


def test_scan_reports_segments_oldest_first_with_idx_state(node, segment_bytes):
    add_40_segment(node, 30, segment_bytes)
    add_40_segment(node, 20, segment_bytes)
    write_idx(node, 20, "10\nCOMPLETED")
    write_idx(node, 30, "10")
    (node / "cdc_raw" / "CommitLog-7-99_cdc.idx").write_text("5\nCOMPLETED")  # its segment is gone
    scan = scan_cdc_raw(node / "cdc_raw")
    assert [(s.segment_id, s.complete) for s in scan.segments] == [(20, True), (30, False)]
    assert [p.name for p in scan.orphan_idx] == ["CommitLog-7-99_cdc.idx"]
    assert scan.total_bytes == 2 * len(segment_bytes) + len("10\nCOMPLETED") + 2 + len("5\nCOMPLETED")


def test_state_dir_inside_cdc_raw_is_refused(tmp_path):
    with pytest.raises(ConfigError):
        AgentConfig(cdc_raw=tmp_path, store_url="memory://x", cluster="c", state_dir=tmp_path / "state")


# ------------------------------------------------------------------------------------------------ real S3
def test_agent_ships_to_a_real_s3_server_and_recovers_from_a_cut_upload(node, segment_bytes, request, monkeypatch):
    store = _s3_store(request)
    _, live = add_40_segment(node, 500, variant(segment_bytes, 1))
    write_idx(node, 500, "4096")
    _, done = add_40_segment(node, 400, segment_bytes)
    write_idx(node, 400, f"{len(segment_bytes)}\nCOMPLETED")
    cfg = make_config(node, ship_live_prefix=True)

    real = store._write_sidecar

    def cut(key, checksum, attributes=None):  # the process dies after the PUT of the data, before its sidecar
        if key.endswith(done.name):
            raise SimulatedCrash()
        real(key, checksum, attributes)

    monkeypatch.setattr(store, "_write_sidecar", cut)
    with pytest.raises(SimulatedCrash):
        Agent(cfg, store).run_once()
    assert done.exists() and store.info(incoming(done.name)).checksum is None
    monkeypatch.setattr(store, "_write_sidecar", real)

    agent = Agent(cfg, store)
    assert agent.run_once() == 1
    assert not done.exists() and live.exists()
    assert store.get_bytes(incoming(done.name)) == segment_bytes
    assert store.info(incoming(done.name)).checksum == sha256_bytes(segment_bytes)
    chunk = Layout.live_chunk("prod", "cass-1", live.name, 0, 4096)
    assert store.list() == sorted([incoming(done.name), chunk])
    assert store.get_bytes(chunk) == variant(segment_bytes, 1)[:4096]
