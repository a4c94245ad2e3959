"""ObjectStore and Layout: the same behaviour on a local directory, memory:// and a real S3 server."""
from __future__ import annotations

import hashlib
import os
import subprocess
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_lib.errors import ConfigError, FormatError
from cdc_lib.storage.layout import CHECKSUM_SUFFIX, Layout, parse_segment_name
from cdc_lib.storage.objects import (ObjectNotFound, ObjectStore, StorageError, VerificationError, _etag_of,
                                     sha256_bytes)

SEG = "CommitLog-7-1699285478684.log"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["local", "memory", "s3"])
def store(request, tmp_path) -> ObjectStore:
    if request.param == "local":
        yield ObjectStore.from_url(str(tmp_path / "store"))
    elif request.param == "memory":
        s = ObjectStore.from_url(f"memory://cdc-test-{uuid.uuid4().hex}")
        yield s
        if s.fs.exists(s.root):
            s.fs.rm(s.root, recursive=True)
    else:
        yield _s3_store(request)


def _s3_store(request) -> ObjectStore:
    """A fresh prefix in the bucket of the real S3 server (SeaweedFS on 127.0.0.1, fixture in tests/servers.py)."""
    server = request.getfixturevalue("s3_server")
    return ObjectStore.from_url(f"s3://{server.bucket}/t-{uuid.uuid4().hex[:12]}", **server.s3fs_kwargs())


def _requests_sent(store: ObjectStore, request) -> list:
    """The names of the S3 operations the store's client sends from now to the end of the test, in order (its
    filesystem, and so its client, is shared by every store with the same options: the hook is removed after)."""
    sent: list = []

    def record(model, **_):
        sent.append(model.name)
    events = store.fs.s3.meta.events
    events.register("before-call.s3", record)
    request.addfinalizer(lambda: events.unregister("before-call.s3", record))
    return sent


def test_put_file_round_trip_with_sidecar(store, tmp_path):
    data = os.urandom(300_000)
    src = tmp_path / SEG
    src.write_bytes(data)
    key = Layout.incoming("c1", "n1", SEG)
    info = store.put_file(src, key, checksum=_sha(data))
    assert info.size == len(data) and info.checksum == _sha(data)
    assert store.get_bytes(key) == data
    with store.open(key) as f:
        assert f.read() == data
    # sha256sum format, so an operator can check a downloaded copy with `sha256sum -c`
    assert store.get_bytes(key + CHECKSUM_SUFFIX).decode() == f"{_sha(data)}  {SEG}\n"
    assert store.info(key).checksum == _sha(data)
    assert store.list() == [key]  # the sidecar is not listed as an object


def test_sidecar_attributes_round_trip_survive_a_move_and_sha256sum_still_checks(store, tmp_path):
    data = b"segment bytes"
    src = tmp_path / SEG
    src.write_bytes(data)
    key = Layout.incoming("c1", "n1", SEG)
    store.put_file(src, key, checksum=_sha(data), attributes={"closed_at": "1732400000.250000"})
    assert store.info(key).attributes == {"closed_at": "1732400000.250000"}
    sidecar = store.get_bytes(key + CHECKSUM_SUFFIX)
    assert sidecar.decode() == f"{_sha(data)}  {SEG}\n# closed_at: 1732400000.250000\n"
    (tmp_path / "check").mkdir()
    (tmp_path / "check" / SEG).write_bytes(data)
    (tmp_path / "check" / "s.sha256").write_bytes(sidecar)
    done = subprocess.run(["sha256sum", "--strict", "-c", "s.sha256"], cwd=tmp_path / "check",
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    dst = Layout.archived("c1", "n1", SEG)
    assert store.move(key, dst).attributes == {"closed_at": "1732400000.250000"}
    assert store.info(dst).attributes == {"closed_at": "1732400000.250000"}
    store.put_bytes(key, data, checksum=_sha(data))       # written without attributes: none
    assert store.info(key).attributes == {}
    with pytest.raises(StorageError, match="attribute"):
        store.put_file(src, key, checksum=_sha(data), attributes={"bad name": "1"})


def test_put_file_refuses_bytes_that_do_not_match_the_checksum(store, tmp_path):
    src = tmp_path / SEG
    src.write_bytes(b"segment bytes")
    key = Layout.incoming("c1", "n1", SEG)
    with pytest.raises(VerificationError):
        store.put_file(src, key, checksum=_sha(b"other bytes"))
    assert not store.exists(key)
    assert store.list() == []


def test_reupload_is_idempotent(store, tmp_path):
    data = os.urandom(10_000)
    src = tmp_path / SEG
    src.write_bytes(data)
    key = Layout.incoming("c1", "n1", SEG)
    first = store.put_file(src, key, checksum=_sha(data))
    second = store.put_file(src, key, checksum=_sha(data))
    assert first == second
    assert store.list("incoming/") == [key]


def test_list_is_a_key_prefix_and_sorted(store):
    for c in ("c1", "c10", "c2"):
        store.put_bytes(Layout.incoming(c, "n", SEG), c.encode())
    store.put_bytes(Layout.checkpoint("main"), b"{}")
    assert store.list("incoming/c1/") == [Layout.incoming("c1", "n", SEG)]
    assert store.list("incoming/c1") == [Layout.incoming("c1", "n", SEG), Layout.incoming("c10", "n", SEG)]
    assert store.list("incoming/") == sorted(Layout.incoming(c, "n", SEG) for c in ("c1", "c10", "c2"))
    assert store.list("nothing-here/") == []
    assert store.list() == sorted(store.list("incoming/") + ["checkpoints/main.json"])


def test_listing_tells_sizes_and_which_objects_are_complete(store):
    """One listing says what claim needs of each object: its size, and when its sidecar was written, the time
    ``committed_at`` reads (None for an object without a sidecar: an upload not finished)."""
    store.put_bytes("incoming/a/complete", b"12345", checksum=sha256_bytes(b"12345"))
    store.put_bytes("incoming/a/cut-short", b"123")
    store.put_bytes("other/x", b"1", checksum=sha256_bytes(b"1"))
    listed = store.listing("incoming/")
    assert list(listed) == store.list("incoming/") == ["incoming/a/complete", "incoming/a/cut-short"]
    assert (listed["incoming/a/complete"].size, listed["incoming/a/cut-short"].size) == (5, 3)
    assert listed["incoming/a/complete"].committed_at == pytest.approx(store.committed_at("incoming/a/complete"))
    assert listed["incoming/a/cut-short"].committed_at is None
    assert store.sidecar("incoming/a/complete")[0] == sha256_bytes(b"12345")
    assert store.sidecar("incoming/a/cut-short") == (None, {})


def test_missing_objects_raise_object_not_found(store):
    with pytest.raises(ObjectNotFound):
        store.get_bytes("incoming/c/n/" + SEG)
    with pytest.raises(ObjectNotFound):
        store.info("incoming/c/n/" + SEG)
    with pytest.raises(ObjectNotFound):
        store.open("incoming/c/n/" + SEG)
    assert not store.exists("incoming/c/n/" + SEG)
    store.delete("incoming/c/n/" + SEG)  # deleting nothing is fine


def test_move_copies_verifies_and_deletes(store):
    data = os.urandom(50_000)
    src, dst = Layout.incoming("c", "n", SEG), Layout.archived("c", "n", SEG)
    store.put_bytes(src, data, checksum=_sha(data))
    info = store.move(src, dst)
    assert info.checksum == _sha(data) and info.size == len(data)
    assert not store.exists(src) and store.get_bytes(dst) == data
    assert store.info(dst).checksum == _sha(data)
    assert store.list() == [dst]
    # a retry of a move that already finished is harmless
    assert store.move(src, dst) == info


def test_a_copy_with_other_bytes_fails_the_move_and_the_source_stays(store, monkeypatch):
    """The move's check of its copy: same size, other bytes (a store that damaged it) is a VerificationError, the
    copy never gets a sidecar and the source stays complete."""
    data = os.urandom(20_000)
    src, dst = Layout.incoming("c", "n", SEG), Layout.archived("c", "n", SEG)
    store.put_bytes(src, data, checksum=_sha(data))
    # returns the MD5 of what it wrote, as S3's CopyObject reports the copy's ETag
    monkeypatch.setattr(store, "_copy", lambda s, d, size: store._write(d, iter([bytes([data[0] ^ 1]) + data[1:]]))[1])
    with pytest.raises(VerificationError, match="copy hashes to"):
        store.move(src, dst)
    assert store.info(src).checksum == _sha(data) and store.info(dst).checksum is None


def test_an_s3_move_is_checked_by_the_etag_its_copy_request_returns(request, monkeypatch):
    """On S3 a move is a HEAD of the source, its sidecar, one CopyObject (whose ETag, the copy's MD5, is checked
    against the source's) and the new sidecar: no HEAD of the copy, no second HEAD of the source."""
    store = _s3_store(request)
    data = os.urandom(20_000)
    src, dst = Layout.incoming("c", "n", SEG), Layout.archived("c", "n", SEG)
    store.put_bytes(src, data, checksum=_sha(data))
    heads = []
    real = store._stat
    monkeypatch.setattr(store, "_stat", lambda key: heads.append(key) or real(key))
    assert store.move(src, dst).checksum == _sha(data)
    assert heads == [src] and store.get_bytes(dst) == data and not store.exists(src)
    # given the sidecar as read before (claim's), the move does not read it again, and writes it beside the copy
    store.put_bytes(src, data, checksum=_sha(data))
    monkeypatch.setattr(store, "sidecar", lambda key: pytest.fail(f"read the sidecar of {key}"))
    store.move(src, Layout.archived("c", "n2", SEG), sidecar=(_sha(data), {"closed_at": "1.5"}))
    monkeypatch.undo()
    assert store.sidecar(Layout.archived("c", "n2", SEG)) == (_sha(data), {"closed_at": "1.5"})


def test_an_s3_read_is_one_get_request(request):
    """Reading a whole object from S3 (a segment by the parse step, a sidecar, a manifest) is one GetObject: s3fs
    would first HEAD it to choose whether to split it into ranged GETs, a third of a batch's requests to the store
    (the requests counted as the S3 client sends them)."""
    from cdc_lib.spark.merge_job import segment_source
    server = request.getfixturevalue("s3_server")
    store = _s3_store(request)
    data = os.urandom(300_000)
    key = Layout.incoming("c", "n", SEG)
    store.put_bytes(key, data, checksum=_sha(data))
    sent = _requests_sent(store, request)
    assert store.get_bytes(key) == data
    assert store.sidecar(key)[0] == _sha(data)
    assert sent == ["GetObject", "GetObject"]
    sent.clear()
    # the parse step reads a segment through its own filesystem handle (fsspec gives the same one for these options)
    segment = segment_source(store.url_for(key), _sha(data), server.s3fs_kwargs())
    assert bytes(segment.data) == data and sent == ["GetObject"]
    with pytest.raises(ObjectNotFound):
        store.get_bytes(Layout.incoming("c", "n", "CommitLog-7-2.log"))


def test_s3_checked_upload_and_missing_object_requests(request, tmp_path):
    """A checked upload (the agent's, per segment) is: drop a stale sidecar, PUT, one HEAD for the stored size and
    MD5 ETag, PUT the sidecar. Asking for an object that is not there (the agent's look for an earlier copy) is one
    HEAD: no listing to tell a "directory" from nothing, and no second HEAD for the ETag."""
    store = _s3_store(request)
    data = os.urandom(100_000)
    src = tmp_path / SEG
    src.write_bytes(data)
    key = Layout.incoming("c", "n", SEG)
    store.put_bytes("probe", b"")      # the client exists once a request was made
    sent = _requests_sent(store, request)
    assert store.put_file(src, key, checksum=_sha(data)).checksum == _sha(data)
    assert sent == ["DeleteObject", "PutObject", "HeadObject", "PutObject"]
    sent.clear()
    assert not store.exists(Layout.archived("c", "n", SEG)) and sent == ["HeadObject"]
    with pytest.raises(ObjectNotFound):
        store.info(Layout.archived("c", "n", SEG))
    assert store.info(key).size == len(data)


def test_an_s3_move_of_a_listed_object_is_its_copy_and_sidecar(request):
    """Given the source's size and ETag as the claim's listing gave them (and its sidecar as claim read it), an
    archive move is one CopyObject and one PUT of the new sidecar. A source replaced since the listing fails the
    move and stays; a source an earlier, interrupted move already copied and deleted finishes as moved."""
    store = _s3_store(request)
    data = os.urandom(20_000)
    src = Layout.incoming("c", "n", SEG)
    store.put_bytes(src, data, checksum=_sha(data))
    listed = store.listing(Layout.INCOMING + "/")[src]
    assert (listed.size, listed.etag) == (len(data), hashlib.md5(data).hexdigest())
    sent = _requests_sent(store, request)
    dst = Layout.archived("c", "n", SEG)
    info = store.move(src, dst, keep_source=True, sidecar=(_sha(data), {}), listed=(listed.size, listed.etag))
    assert sent == ["CopyObject", "PutObject"] and info.checksum == _sha(data)
    assert store.get_bytes(dst) == data and store.info(dst).checksum == _sha(data)
    # the source deleted after its copy was made (a rerun after a crash): the move is done
    store.delete(src)
    assert store.move(src, dst, keep_source=True, sidecar=(_sha(data), {}),
                      listed=(listed.size, listed.etag)).checksum == _sha(data)
    # the source replaced since the listing by other bytes of the same size
    other = os.urandom(len(data))
    store.put_bytes(src, other, checksum=_sha(other))
    with pytest.raises(VerificationError):
        store.move(src, Layout.archived("c", "n2", SEG), keep_source=True, sidecar=(_sha(data), {}),
                   listed=(listed.size, listed.etag))
    assert store.info(src).checksum == _sha(other) and store.info(Layout.archived("c", "n2", SEG)).checksum is None


def test_delete_many_removes_objects_and_sidecars(store):
    keys = [Layout.incoming("c", "n", f"CommitLog-7-{i}.log") for i in range(3)]
    for key in keys:
        store.put_bytes(key, b"x", checksum=_sha(b"x"))
    store.delete_many(keys[:2] + [Layout.incoming("c", "n", "CommitLog-7-9.log")])    # an absent key is fine
    assert store.list() == keys[2:] and not store.exists(keys[0] + CHECKSUM_SUFFIX)


def test_move_interrupted_before_the_sidecar_is_finished_by_a_retry(store, monkeypatch):
    data = os.urandom(20_000)
    src, dst = Layout.incoming("c", "n", SEG), Layout.archived("c", "n", SEG)
    store.put_bytes(src, data, checksum=_sha(data))
    real = store._write_sidecar

    class Crash(BaseException):
        pass

    def crash(key, checksum, attributes=None):
        raise Crash()

    monkeypatch.setattr(store, "_write_sidecar", crash)
    with pytest.raises(Crash):
        store.move(src, dst)
    # the source is still complete; the destination is not (no sidecar), so readers ignore it
    assert store.info(src).checksum == _sha(data)
    assert store.info(dst).checksum is None
    monkeypatch.setattr(store, "_write_sidecar", real)
    store.move(src, dst)
    assert not store.exists(src) and store.info(dst).checksum == _sha(data)


def test_overwriting_replaces_or_drops_the_sidecar(store):
    key = Layout.checkpoint("main")
    store.put_bytes(key, b"v1", checksum=_sha(b"v1"))
    store.put_bytes(key, b"v2", checksum=_sha(b"v2"))
    assert store.info(key).checksum == _sha(b"v2")
    store.put_bytes(key, b"v3")  # no checksum: the old sidecar must not vouch for the new bytes
    assert store.info(key).checksum is None and store.get_bytes(key) == b"v3"


def test_delete_removes_object_and_sidecar(store):
    key = Layout.incoming("c", "n", SEG)
    store.put_bytes(key, b"x", checksum=_sha(b"x"))
    store.delete(key)
    assert not store.exists(key) and not store.exists(key + CHECKSUM_SUFFIX)
    assert store.list() == []


def test_verify_detects_changed_content(store):
    key = Layout.incoming("c", "n", SEG)
    store.put_bytes(key, b"A" * 1000, checksum=_sha(b"A" * 1000))
    assert store.verify(key).checksum == _sha(b"A" * 1000)
    store._write(key, iter([b"B" * 1000]))  # same size, other bytes, behind the sidecar's back
    with pytest.raises(VerificationError):
        store.verify(key)
    with pytest.raises(VerificationError):
        store.verify(key, size=999)


def test_quarantine_keeps_the_bytes_and_says_why(store):
    key = Layout.incoming("c", "n", SEG)
    store.put_bytes(key, b"bad", checksum=_sha(b"bad"))
    q = Layout.quarantined("c", "n", SEG)
    store.quarantine(key, q, {"reason": "CRC mismatch", "position": 42})
    assert store.get_bytes(q) == b"bad" and not store.exists(key)
    assert store.get_json(Layout.reason(q)) == {"reason": "CRC mismatch", "position": 42}


def test_json_helpers_and_checkpoints(store):
    store.put_json(Layout.checkpoint("pipeline"), {"segments": [SEG], "position": 7})
    assert store.get_json(Layout.checkpoint("pipeline")) == {"position": 7, "segments": [SEG]}
    store.put_json(Layout.ledger("batch-0001"), {"ok": True})
    assert store.list("ledger/") == ["ledger/batch-0001.json"]


def test_bad_keys_are_refused(store):
    for key in ("", "/abs", "a/../b", "a//b", "dir/"):
        with pytest.raises(StorageError):
            store.put_bytes(key, b"x")


def test_local_store_leaves_no_partial_object_when_a_write_fails(tmp_path):
    store = ObjectStore.from_url("file://" + str(tmp_path / "s"))
    key = Layout.incoming("c", "n", SEG)

    def chunks():
        yield b"first half"
        raise OSError("disk full")

    with pytest.raises(OSError):
        store._write(key, chunks())
    assert not store.exists(key)
    assert [p.name for p in (tmp_path / "s").rglob("*") if p.is_file()] == []


def test_store_urls(tmp_path):
    local = ObjectStore.from_url(str(tmp_path / "a"))
    assert local.local and local.url == "file://" + str(tmp_path / "a")
    assert ObjectStore.from_url("file://" + str(tmp_path / "a")).root == local.root
    assert local.url_for("delta/events") == "file://" + str(tmp_path / "a" / "delta" / "events")
    mem = ObjectStore.from_url("memory://bucket/prefix")
    assert not mem.local and mem.url_for(Layout.events_table()) == "memory://bucket/prefix/delta/events"
    with pytest.raises(ConfigError):
        ObjectStore.from_url("")
    with pytest.raises(ConfigError):
        ObjectStore.from_url("nosuchprotocol-xyz://bucket")


def test_layout_is_the_documented_one():
    assert Layout.incoming("prod", "cass-1", SEG) == f"incoming/prod/cass-1/{SEG}"
    assert Layout.archived("prod", "cass-1", SEG) == f"archived/prod/cass-1/{SEG}"
    assert Layout.quarantined("prod", "cass-1", SEG) == f"quarantined/prod/cass-1/{SEG}"
    assert Layout.reason(Layout.quarantined("prod", "n", SEG)) == f"quarantined/prod/n/{SEG}.reason.json"
    assert Layout.live_chunk("prod", "n", SEG, 0, 1234) == f"incoming-live/prod/n/{SEG}/000000000000-000000001234"
    assert Layout.parse_live_chunk(Layout.live_chunk("p", "n", SEG, 1234, 5678)) == (1234, 5678)
    assert Layout.checkpoint("main") == "checkpoints/main.json"
    assert Layout.ledger("b1") == "ledger/b1.json"
    assert Layout.state_table("ks", "t") == "delta/state/ks.t"
    assert Layout.events_table() == "delta/events"
    assert Layout.parse_segment_key(f"archived/prod/n/{SEG}") == ("archived", "prod", "n", SEG)
    assert Layout.area_prefix(Layout.INCOMING, "prod") == "incoming/prod/"
    for bad in ("", "a/b", "..", "x y", "-x"):
        with pytest.raises(ConfigError):
            Layout.incoming(bad, "n", SEG)
        with pytest.raises(ConfigError):
            Layout.incoming("c", bad, SEG)
    with pytest.raises(FormatError):
        Layout.incoming("c", "n", "not-a-segment.log")
    with pytest.raises(FormatError):
        Layout.parse_segment_key("incoming/c/" + SEG)


@settings(max_examples=200, deadline=None)
@given(version=st.integers(0, 10 ** 6), segment_id=st.integers(0, 2 ** 63 - 1))
def test_parse_segment_name_round_trips(version, segment_id):
    assert parse_segment_name(f"CommitLog-{version}-{segment_id}.log") == (version, segment_id)


@pytest.mark.parametrize("name", ["CommitLog-7-123.log.tmp", "CommitLog-7-123_cdc.idx", "CommitLog-7.log",
                                  "commitlog-7-1.log", "CommitLog--1-2.log", "CommitLog-7-12a.log", ""])
def test_parse_segment_name_rejects_other_names(name):
    with pytest.raises(FormatError) as e:
        parse_segment_name(name)
    assert e.value.source == name


def test_sha256_bytes_matches_hashlib():
    assert sha256_bytes(b"abc") == hashlib.sha256(b"abc").hexdigest()


def test_s3_store_uses_the_server_md5_and_keeps_keys_under_the_prefix(request, tmp_path):
    store = _s3_store(request)
    data = os.urandom(2 * 1024 * 1024 + 17)
    src = tmp_path / SEG
    src.write_bytes(data)
    key = Layout.incoming("c", "n", SEG)
    store.put_file(src, key, checksum=_sha(data))
    assert store.url_for(key).startswith("s3://") and store.url_for(key).endswith("/" + key)
    assert _etag_of(store._stat(key)) == hashlib.md5(data).hexdigest()
    assert store.list() == [key]
    assert store.get_bytes(key) == data


def test_corruption_in_transit_is_detected_and_never_committed(store, tmp_path, monkeypatch):
    data = os.urandom(100_000)
    src = tmp_path / SEG
    src.write_bytes(data)
    key = Layout.incoming("c", "n", SEG)
    real_write = store._write

    def flip_a_byte(k, chunks):  # the store receives other bytes than the ones sent
        body = b"".join(chunks)
        if k == key:
            body = body[:500] + bytes([body[500] ^ 1]) + body[501:]
            real_write(k, iter([body]))
            return (hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest(), len(data))
        return real_write(k, iter([body]))

    monkeypatch.setattr(store, "_write", flip_a_byte)
    with pytest.raises(VerificationError):
        store.put_file(src, key, checksum=_sha(data))
    assert store.info(key).checksum is None  # no sidecar: readers and the agent treat it as not uploaded


def test_an_etag_that_is_not_the_md5_falls_back_to_reading_back(request, tmp_path, monkeypatch):
    store = _s3_store(request)
    stat = store._stat      # e.g. SSE-KMS: the ETag is not the MD5
    monkeypatch.setattr(store, "_stat", lambda key: {**stat(key), "ETag": '"' + "0" * 32 + '"'})
    reads = []
    real = store._remote_sha256
    monkeypatch.setattr(store, "_remote_sha256", lambda key: reads.append(key) or real(key))
    src = tmp_path / SEG
    src.write_bytes(b"segment" * 1000)
    key = Layout.incoming("c", "n", SEG)
    assert store.put_file(src, key, checksum=_sha(b"segment" * 1000)).checksum == _sha(b"segment" * 1000)
    assert reads == [key]


def test_one_segment_name_parser_for_paths_and_keys():
    """The commit-log reader, the agent and the key layout share one parser: a path is read by its file name, a
    key refuses anything but a bare name."""
    from cdc_lib.commitlog.segment import parse_segment_name as reader_parse
    from cdc_lib.errors import SegmentError
    assert reader_parse is parse_segment_name
    assert parse_segment_name("/var/lib/cassandra/cdc_raw/CommitLog-7-42.log") == (7, 42)
    with pytest.raises(SegmentError):
        parse_segment_name("/data/CommitLog-7-42.log.tmp")
    with pytest.raises(ConfigError):
        Layout.incoming("c1", "n1", "../CommitLog-7-42.log")
