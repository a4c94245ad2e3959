"""The node-side agent (``cassandra-cdc agent``): ships completed CDC segments from ``cdc_raw`` to the store.

Which files are complete is ``cdc_raw``'s business; the space warnings are ``space``'s.

Per completed segment, oldest id first: sha256 -> upload under ``incoming/<cluster>/<node>/<segment>`` with its
checksum and its close time (sidecar attribute ``closed_at``: see ``_closed_at``) -> verify in the store -> record ``<state_dir>/shipped/<segment>.json`` -> delete the segment, then its
idx -> delete the record.

Crash safety: the key is deterministic and the bytes of a completed segment never change, so an upload repeated
after a crash rewrites the identical object (and is skipped when the store already holds it complete with the
same checksum, under incoming/ or archived/). The local file is deleted only after the store verified it, and a
record that survives a crash lets the next run delete without uploading again. So a crash at any instant either
repeats an idempotent step or finds it done: no segment lost, no second object.

Optionally (``ship_live_prefix``) the synced bytes of live 4.0+ segments are shipped as they grow, as chunks
``incoming-live/<cluster>/<node>/<segment>/<start>-<end>`` (file offsets; for compressed or encrypted segments the
idx offset is logical and is mapped to the file offset by walking the section markers). The local file is never
deleted before COMPLETED.

Empty segment links a clean Cassandra shutdown leaves in ``cdc_raw`` (no idx, link count 1: see ``cdc_raw``) are
deleted once ``orphan_grace_s`` has passed since their last link change and the file is confirmed to hold no
entry; one that holds entries is shipped like a completed segment instead (Cassandra never touches it again).

It warns (logging WARNING, with numbers) when ``cdc_raw`` holds more than ``warn_usage_fraction`` of the CDC space
(Cassandra rejects CDC writes when it is full) or grows faster than it ships, and when a segment's ``_cdc.idx``
stays unreadable (its segment cannot be known complete, so it waits: named, at most every 10 minutes), exposes
counters via
:meth:`Agent.metrics` and ``<state_dir>/status.json``, and stops cleanly on SIGTERM/SIGINT.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from cdc_lib.errors import ConfigError, FormatError
from cdc_lib.metrics import new_histogram, observe
from cdc_lib.settings import AgentConfig
from cdc_lib.storage.layout import CLOSED_AT_ATTRIBUTE, Layout
from cdc_lib.storage.objects import ObjectNotFound, ObjectStore, sha256_bytes, sha256_file

from .cdc_raw import _IDX_RE, CdcRawScan, CdcSegment, _idx_paths, holds_data, scan_cdc_raw, synced_file_end
from .space import SpaceMonitor, default_cdc_total_space

log = logging.getLogger("cassandra_cdc.agent")

# A rewrite of _cdc.idx caught half-way is over within milliseconds; an idx that stays unreadable this long will
# not fix itself, and its segment waits until someone does.
UNREADABLE_IDX_WARN_AFTER_S = 30.0
UNREADABLE_IDX_WARN_EVERY_S = 600.0


# ---------------------------------------------------------------------------------------------------- agent
class Agent:
    """Ships completed segments; :meth:`run_once` is one pass, :meth:`run_forever` loops until stopped.

    ``hooks`` maps a step name to a callable taking the segment name; tests raise from them to simulate a
    crash between steps. Steps: ``after_upload``, ``after_record``, ``after_delete_segment``,
    ``after_delete_idx``, ``after_live_chunk``.
    """

    def __init__(self, config: AgentConfig, store: ObjectStore | None = None, *,
                 hooks: dict[str, Callable[[str], None]] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        if not config.cdc_raw.is_dir():
            raise ConfigError(f"cdc_raw directory {config.cdc_raw} does not exist")
        self.store = store if store is not None else ObjectStore.from_url(config.store_url,
                                                                         **config.storage_options)
        self.hooks = dict(hooks or {})
        self.clock = clock
        self.state_dir = Path(config.state_dir)
        self.shipped_dir = self.state_dir / "shipped"
        try:
            self.shipped_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create the agent's state directory {self.shipped_dir}: {e}") from None
        self.status_path = self.state_dir / "status.json"
        total = config.cdc_total_space or default_cdc_total_space(config.cdc_raw)
        self.space = SpaceMonitor(total, warn_fraction=config.warn_usage_fraction, window=config.rate_window)
        self._live_end: dict[str, int] = {}
        self._removed_orphans = 0
        self._unreadable_idx: dict[Path, list] = {}     # idx path -> [content, unreadable since, last warned]
        self._last_pass = {"shipped": 0, "bytes": 0, "unreadable_idx": []}
        self._failures = 0
        self._next_attempt = 0.0
        self._stop = threading.Event()
        self._announced = False
        self._m: dict[str, Any] = {
            "cluster": config.cluster, "node": config.node, "store": self.store.url,
            "segments_shipped": 0, "bytes_shipped": 0, "live_chunks_shipped": 0, "live_bytes_shipped": 0,
            "upload_failures": 0, "consecutive_failures": 0, "conflicts": 0, "segments_lost": 0,
            "empty_segments_removed": 0,
            "last_error": None, "last_error_time": None, "last_shipped_segment": None, "last_success_time": None,
            "cdc_raw_bytes": 0, "cdc_total_space": total, "cdc_usage_fraction": 0.0, "pending_segments": 0,
            "live_segments": 0, "orphaned_segments": 0, "unreadable_idx": 0, "arrival_rate": 0.0, "ship_rate": 0.0,
            "started_at": time.time(), "last_pass_time": None,
            # seconds from a segment's close (its last write in cdc_raw) to its verified copy in the store
            "ship_delay_seconds": new_histogram(),
        }

    # -------------------------------------------------------------- public
    def metrics(self) -> dict[str, Any]:
        """A copy of the counters (safe to read from another thread, e.g. the metrics endpoint's)."""
        hist = self._m["ship_delay_seconds"]
        return {**self._m, "ship_delay_seconds": {**hist, "counts": list(hist["counts"])}}

    def health(self, wall_clock: float | None = None) -> list[str]:
        """Why the agent cannot ship now (empty when healthy): the last attempt failed, the polling loop has not
        finished a pass for a long while (stuck on a hung mount or store), or ``cdc_raw`` is full (Cassandra
        rejects writes to CDC tables)."""
        now = time.time() if wall_clock is None else wall_clock
        m = self._m
        problems = []
        if m["consecutive_failures"]:
            problems.append(f"{m['consecutive_failures']} attempt(s) in a row failed; last error: {m['last_error']}")
        stale_after = 3 * self.config.poll_interval + self.config.max_backoff + 30
        last = m["last_pass_time"] if m["last_pass_time"] is not None else m["started_at"]
        if now - last > stale_after:
            problems.append(f"no pass over cdc_raw finished for {now - last:.0f} s (more than {stale_after:.0f} s)")
        if m["cdc_usage_fraction"] >= 1:
            problems.append(f"cdc_raw is full ({m['cdc_raw_bytes']:,} of {m['cdc_total_space']:,} bytes): "
                            "Cassandra rejects writes to CDC tables")
        return problems

    def stop(self) -> None:
        """Ask the loop to stop after the current step (what the SIGTERM handler calls)."""
        self._stop.set()

    def run_forever(self, stop: threading.Event | None = None) -> None:
        """Poll until ``stop`` (or :meth:`stop`) is set; then return after the step in progress."""
        if stop is not None:
            self._stop = stop
        log.info("agent started: cdc_raw=%s store=%s cluster=%s node=%s", self.config.cdc_raw, self.store.url,
                 self.config.cluster, self.config.node)
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as e:  # noqa: BLE001 - e.g. cdc_raw unmounted: report, back off, keep running
                self._failed("scan of " + str(self.config.cdc_raw), e)
            wait = max(self.config.poll_interval, self._next_attempt - self.clock())
            self._stop.wait(wait)
        self._write_status()
        log.info("agent stopped: %d segments shipped this run", self._m["segments_shipped"])

    def run_once(self) -> int:
        """One pass: ship every completed segment (oldest first), then live prefixes; update metrics.

        Returns the number of segments shipped. A failure keeps the local file, counts, logs, and backs off.
        """
        shipped = 0
        bytes_before = self._m["bytes_shipped"]
        now = self.clock()
        scan = scan_cdc_raw(self.config.cdc_raw)
        if now >= self._next_attempt:
            ok = True
            if self.config.datacenter and not self._announced:
                self._announce()
            self._cleanup_orphans(scan)
            for seg in scan.segments:
                if self._stop.is_set():
                    break
                if seg.orphaned:
                    if not self._orphan_holds_data(seg):
                        continue
                elif not seg.complete:
                    continue
                try:
                    if self._ship(seg):
                        shipped += 1
                except Exception as e:  # noqa: BLE001 - any failure: keep the file, back off, retry
                    ok = False
                    self._failed(seg.name, e)
                    break
            if ok and self.config.ship_live_prefix:
                for seg in scan.segments:
                    if self._stop.is_set() or seg.complete or seg.idx is None:
                        continue
                    try:
                        self._ship_live(seg)
                    except Exception as e:  # noqa: BLE001
                        ok = False
                        self._failed(seg.name + " (live prefix)", e)
                        break
            if ok:
                self._failures = 0
                self._m["consecutive_failures"] = 0
            if shipped or self._removed_orphans:
                scan = scan_cdc_raw(self.config.cdc_raw)
                self._removed_orphans = 0
        self._m["cdc_raw_bytes"] = scan.total_bytes
        self._m["cdc_usage_fraction"] = round(scan.total_bytes / self.space.total_space, 6)
        self._m["pending_segments"] = sum(1 for s in scan.segments if s.complete)
        self._m["live_segments"] = sum(1 for s in scan.segments if not s.complete and not s.orphaned)
        self._m["orphaned_segments"] = sum(1 for s in scan.segments if s.orphaned)
        self._watch_unreadable_idx(scan)
        self._last_pass = {"shipped": shipped, "bytes": self._m["bytes_shipped"] - bytes_before,
                           "unreadable_idx": sorted(str(p) for p in self._unreadable_idx)}
        self.space.observe(self.clock(), scan.total_bytes, self._m["bytes_shipped"])
        self._m["arrival_rate"] = round(self.space.arrival_rate, 3)
        self._m["ship_rate"] = round(self.space.ship_rate, 3)
        self._m["last_pass_time"] = time.time()
        self._write_status()
        return shipped

    def pass_summary(self) -> str:
        """One line on the last pass and what ``cdc_raw`` still holds (what ``agent --once`` prints)."""
        m, last = self._m, self._last_pass
        if last["shipped"]:
            head = f"shipped {last['shipped']} segment(s), {last['bytes']:,} bytes, to {self.store.url}"
        else:
            head = "nothing shipped"
        unreadable = last["unreadable_idx"]
        live = m["live_segments"] - len(unreadable)
        held = []
        if m["pending_segments"]:
            why = f" (last error: {m['last_error']})" if m["last_error"] else ""
            held.append(f"{m['pending_segments']} completed segment(s) not shipped{why}")
        if live:
            held.append(f"{live} live segment(s), shipped once their _cdc.idx says COMPLETED")
        if m["orphaned_segments"]:
            held.append(f"{m['orphaned_segments']} empty segment(s) a Cassandra shutdown left, deleted "
                        f"{self.config.orphan_grace_s:.0f} s after it")
        if unreadable:
            held.append(f"{len(unreadable)} segment(s) waiting on an unreadable _cdc.idx: {', '.join(unreadable)}")
        return f"{head}; {self.config.cdc_raw} holds " + ("; ".join(held) if held else "no segment")

    def _watch_unreadable_idx(self, scan: CdcRawScan) -> None:
        """Warn about a segment whose ``_cdc.idx`` stays unreadable, naming the file, at most every 10 minutes."""
        now = self.clock()
        seen: dict[Path, list] = {}
        for seg in scan.segments:
            if seg.idx is not None or not seg.idx_paths:
                continue
            path = seg.idx_paths[0]
            try:
                content = path.read_bytes()[:64]
            except OSError as e:
                content = f"<{e.strerror}>".encode()
            state = self._unreadable_idx.get(path)
            if state is None or state[0] != content:
                state = [content, now, None]          # new, or rewritten since: a rewrite may be under way
            seen[path] = state
            if now - state[1] >= UNREADABLE_IDX_WARN_AFTER_S and (
                    state[2] is None or now - state[2] >= UNREADABLE_IDX_WARN_EVERY_S):
                state[2] = now
                log.warning("%s has been unreadable for %.0f s (it holds %r; Cassandra writes '<offset>' or "
                            "'<offset>\\nCOMPLETED'): %s is not shipped until the idx is readable",
                            path, now - state[1], content, seg.name)
        self._unreadable_idx = seen
        self._m["unreadable_idx"] = len(seen)

    def _announce(self) -> None:
        """Tell the pipeline this node's datacenter (``nodes/<cluster>/<node>.json``); retried next pass if the
        store fails (shipping does not wait for it: the pipeline processes a node it knows nothing of)."""
        try:
            self.store.put_json(Layout.node_info(self.config.cluster, self.config.node),
                                {"cluster": self.config.cluster, "node": self.config.node,
                                 "datacenter": self.config.datacenter, "announced_at": time.time()})
            self._announced = True
        except Exception as e:  # noqa: BLE001
            log.warning("cannot record this node's datacenter in the store (%s: %s); retrying next pass",
                        type(e).__name__, e)

    # -------------------------------------------------------------- steps
    def _hook(self, step: str, name: str) -> None:
        fn = self.hooks.get(step)
        if fn is not None:
            fn(name)

    def _record_path(self, name: str) -> Path:
        return self.shipped_dir / (name + ".json")

    def _ship(self, seg: CdcSegment) -> bool:
        """Ship one completed segment. Returns False if it vanished before it could be shipped."""
        key = Layout.incoming(self.config.cluster, self.config.node, seg.name)
        record_path = self._record_path(seg.name)
        try:
            closed_at = _closed_at(seg)
            checksum, size = sha256_file(seg.path)
        except FileNotFoundError:
            self._m["segments_lost"] += 1
            log.warning("%s disappeared from cdc_raw before it was shipped (deleted by Cassandra? "
                        "with cdc_block_writes=false Cassandra 4.1+ drops the oldest segments when full)", seg.name)
            return False
        record = _read_json(record_path)
        uploaded = False
        if record and record.get("sha256") == checksum and record.get("size") == size:
            log.info("%s was shipped before a restart (%s); removing the local copy", seg.name, record.get("key"))
        else:
            existing = self._existing_copy(seg.name)
            if existing is not None and existing[1] == checksum:
                log.info("%s is already in the store as %s; not uploading again", seg.name, existing[0])
                key = existing[0]
            elif existing is not None:
                key = self._quarantine_conflict(seg, checksum, existing)
                uploaded = True
            else:
                info = self.store.put_file(seg.path, key, checksum=checksum,
                                           attributes={CLOSED_AT_ATTRIBUTE: f"{closed_at:.6f}"})
                uploaded = True
                self._hook("after_upload", seg.name)
                stored = self.store.info(key)  # re-read from the store: size and checksum as uploaded
                if stored.size != size or stored.checksum != checksum or info.size != size:
                    raise RuntimeError(f"{key}: store reports size {stored.size} sha256 {stored.checksum}, "
                                       f"uploaded {size} {checksum}")
            _write_json_atomic(record_path, {"segment": seg.name, "key": key, "sha256": checksum, "size": size,
                                             "shipped_at": time.time()})
            self._hook("after_record", seg.name)
        self._delete_local(seg)
        try:
            record_path.unlink()
        except FileNotFoundError:
            pass
        self._live_end.pop(seg.name, None)
        if uploaded:
            self._m["segments_shipped"] += 1
            self._m["bytes_shipped"] += size
            observe(self._m["ship_delay_seconds"], max(0.0, time.time() - closed_at))
        self._m["last_shipped_segment"] = seg.name
        self._m["last_success_time"] = time.time()
        log.info("shipped %s (%d bytes, sha256 %s) to %s", seg.name, size, checksum[:16], self.store.url_for(key))
        return True

    def _existing_copy(self, name: str) -> tuple[str, str] | None:
        """(key, checksum) of a complete copy already in incoming/ or archived/, if any."""
        for key in (Layout.incoming(self.config.cluster, self.config.node, name),
                    Layout.archived(self.config.cluster, self.config.node, name)):
            try:
                info = self.store.info(key)
            except ObjectNotFound:
                continue
            if info.checksum is not None:  # without a sidecar it is an upload cut short: overwrite it
                return key, info.checksum
        return None

    def _quarantine_conflict(self, seg: CdcSegment, checksum: str, existing: tuple[str, str]) -> str:
        """Another object already holds this key with other bytes: keep both, never overwrite."""
        key = Layout.quarantined(self.config.cluster, self.config.node, f"{seg.name}.{checksum[:16]}")
        reason = {"reason": "key conflict: the store already holds this segment with different content "
                            "(two nodes configured with the same node name?)",
                  "existing_key": existing[0], "existing_sha256": existing[1], "sha256": checksum,
                  "segment": seg.name, "cluster": self.config.cluster, "node": self.config.node,
                  "time": time.time()}
        self.store.put_bytes(Layout.reason(key), json.dumps(reason, indent=2, sort_keys=True).encode())
        self.store.put_file(seg.path, key, checksum=checksum)
        self._hook("after_upload", seg.name)
        self._m["conflicts"] += 1
        log.error("%s: %s already exists with sha256 %s, ours is %s; shipped ours to %s instead",
                  seg.name, existing[0], existing[1][:16], checksum[:16], key)
        return key

    def _delete_local(self, seg: CdcSegment) -> None:
        # Segment first, idx second: a segment whose idx was removed would look live (4.0+) and stall.
        try:
            seg.path.unlink()
        except FileNotFoundError:
            pass
        self._hook("after_delete_segment", seg.name)
        for p in _idx_paths(seg.path.parent, seg.stem):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        self._hook("after_delete_idx", seg.name)

    def _orphan_holds_data(self, seg: CdcSegment) -> bool:
        """An empty link left by a clean shutdown is deleted (returns False); one that holds entries is to be
        shipped (True). Waits ``orphan_grace_s`` after the file's last link change: Cassandra deletes the link of a
        CDC-free segment it discards right after the segment itself, and must not find it gone."""
        try:
            st = seg.path.stat()
        except FileNotFoundError:
            return False
        if st.st_nlink != 1 or any(p.exists() for p in _idx_paths(seg.path.parent, seg.stem)):
            return False                  # changed since the scan: next pass
        if time.time() - st.st_ctime < self.config.orphan_grace_s:
            return False
        data = holds_data(seg.path)
        if data is None:
            return False                  # not even a header: leave it, never delete what we cannot read
        if data:
            log.warning("%s is no longer in the commit log and has no _cdc.idx, but holds entries: shipping it as "
                        "completed", seg.name)
            return True
        seg.path.unlink(missing_ok=True)
        self._removed_orphans += 1
        self._m["empty_segments_removed"] += 1
        log.info("removed %s from cdc_raw: an empty segment a clean Cassandra shutdown left behind (no _cdc.idx, "
                 "no longer in the commit log, no entry); it counted %d bytes against cdc_total_space",
                 seg.name, st.st_size)
        return False

    def _cleanup_orphans(self, scan: CdcRawScan) -> None:
        """Finish deletions cut short by a crash: idx files and records whose segment is already gone."""
        present = {s.name for s in scan.segments}
        for idx in scan.orphan_idx:
            stem = _IDX_RE.match(idx.name).group(1)  # type: ignore[union-attr]
            if self._record_path(stem + ".log").exists():
                try:
                    idx.unlink()
                except FileNotFoundError:
                    pass
        for rec in self.shipped_dir.glob("*.json"):
            name = rec.name[:-len(".json")]
            if name not in present and not any(p.exists() for p in _idx_paths(self.config.cdc_raw, name[:-4])):
                rec.unlink(missing_ok=True)

    def _ship_live(self, seg: CdcSegment) -> None:
        """Ship the newly synced bytes of a live segment as one chunk."""
        assert seg.idx is not None
        end = synced_file_end(seg.path, seg.idx.offset)
        if end is None:
            return
        start = self._live_end.get(seg.name)
        if start is None:
            start = self._recover_live_end(seg.name)
        if end <= start:
            return
        with open(seg.path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        if len(data) != end - start:
            return  # not visible yet
        key = Layout.live_chunk(self.config.cluster, self.config.node, seg.name, start, end)
        self.store.put_bytes(key, data, checksum=sha256_bytes(data))
        self._live_end[seg.name] = end
        self._m["live_chunks_shipped"] += 1
        self._m["live_bytes_shipped"] += len(data)
        self._hook("after_live_chunk", seg.name)
        log.debug("shipped live bytes [%d, %d) of %s", start, end, seg.name)

    def _recover_live_end(self, name: str) -> int:
        """End of the chunks already in the store (after a restart); chunks without a sidecar are removed."""
        end = 0
        for key in self.store.list(Layout.live_prefix(self.config.cluster, self.config.node, name)):
            try:
                s, e = Layout.parse_live_chunk(key)
            except FormatError:
                continue
            if self.store.info(key).checksum is None:
                self.store.delete(key)  # an upload cut short; its range is shipped again
            elif s == end:
                end = e
        self._live_end[name] = end
        return end

    # -------------------------------------------------------------- failures and status
    def _failed(self, what: str, error: BaseException) -> None:
        self._failures += 1
        delay = min(self.config.max_backoff, self.config.poll_interval * (2 ** min(self._failures, 20)))
        self._next_attempt = self.clock() + delay
        self._m["upload_failures"] += 1
        self._m["consecutive_failures"] = self._failures
        self._m["last_error"] = f"{what}: {type(error).__name__}: {error}"
        self._m["last_error_time"] = time.time()
        log.error("shipping %s failed (%s: %s); the local file is kept, retrying in %.1f s (failure %d in a row)",
                  what, type(error).__name__, error, delay, self._failures)

    def _write_status(self) -> None:
        try:
            # rewritten every poll: no fsync, a status lost in a power cut is rewritten by the next poll
            _write_json_atomic(self.status_path, {**self._m, "time": time.time()}, durable=False)
        except OSError as e:
            log.warning("cannot write status file %s: %s", self.status_path, e)


def _closed_at(seg: CdcSegment) -> float:
    """When Cassandra closed the segment: the last write to the segment or its idx (Cassandra rewrites the idx with
    COMPLETED when it closes the segment; a pre-4.0 segment has no idx and its last write is its close).

    File times, not the moment this agent first saw COMPLETED: they do not depend on the poll interval, and they
    survive a restart of the agent (a segment closed while it was down keeps its true age). Both are the node's
    clock, the one Cassandra's own timestamps use."""
    times = [seg.path.stat().st_mtime]
    for p in _idx_paths(seg.path.parent, seg.stem):
        try:
            times.append(p.stat().st_mtime)
        except FileNotFoundError:
            pass
    return max(times)


def _read_json(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            value = json.load(f)
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json_atomic(path: Path, value: Any, *, durable: bool = True) -> None:
    """Write via a temporary file and rename (readers never see half a file); fsync unless not ``durable``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True, default=str)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
