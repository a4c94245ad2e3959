"""The node-side agent (``cassandra-cdc agent``): ships completed CDC segments from ``cdc_raw`` to the store.

Which files are complete (format reference §8):

* Descriptor <= 6 (Cassandra 3.11): a segment is *renamed* into ``cdc_raw`` once discarded, so a file there is
  complete as soon as it appears. There is no index file.
* Descriptor >= 7 (Cassandra 4.0+): the segment is hard-linked into ``cdc_raw`` when created, while it is still
  being written. ``<segment>_cdc.idx`` holds ``"<offset>"`` (synced up to there) or ``"<offset>\\nCOMPLETED"``. The
  file is rewritten in place, so an empty or half-written idx is "not known yet": retry next poll. A segment
  without an idx is live (or holds no CDC data and Cassandra will delete it itself). The legacy suffix
  ``-CDC.idx`` is accepted too.

Per completed segment, oldest id first: sha256 -> upload under ``incoming/<cluster>/<node>/<segment>`` with its
checksum -> verify in the store -> record ``<state_dir>/shipped/<segment>.json`` -> delete the segment, then its
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

It warns (logging WARNING, with numbers) when ``cdc_raw`` holds more than ``warn_usage_fraction`` of the CDC space
(Cassandra rejects CDC writes when it is full) or grows faster than it ships, exposes counters via
:meth:`Agent.metrics` and ``<state_dir>/status.json``, and stops cleanly on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import config as config_mod
from .errors import ConfigError, FormatError
from .storage import Layout, ObjectNotFound, ObjectStore, parse_segment_name, sha256_bytes, sha256_file
from .wire import be_i32, be_u32, crc32_ints

log = logging.getLogger("cassandra_cdc.agent")

MiB = 1024 * 1024
IDX_SUFFIXES = ("_cdc.idx", "-CDC.idx")  # 4.0+ name first; the second is a legacy spelling, handled defensively
_IDX_RE = re.compile(r"^(CommitLog-\d+-\d+)(_cdc\.idx|-CDC\.idx)$")


# ---------------------------------------------------------------------------------------------------- settings
@dataclass
class AgentConfig:
    """Agent settings (flags > ``CASSANDRA_CDC_*`` environment > YAML ``agent:`` section > defaults)."""

    cdc_raw: Path
    store_url: str
    cluster: str
    node: str = field(default_factory=lambda: socket.gethostname())
    storage_options: dict = field(default_factory=dict)
    poll_interval: float = 1.0
    state_dir: Path | None = None  # default: <cdc_raw>/../cassandra-cdc-agent (never inside cdc_raw)
    ship_live_prefix: bool = False
    cdc_total_space: int | None = field(default=None, metadata={"parse": config_mod.parse_size})
    warn_usage_fraction: float = 0.5
    rate_window: float = 300.0  # seconds over which arrival and ship rates are compared
    max_backoff: float = 60.0
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        self.cdc_raw = Path(self.cdc_raw)
        if self.state_dir is None:
            self.state_dir = self.cdc_raw.resolve().parent / "cassandra-cdc-agent"
        self.state_dir = Path(self.state_dir)
        Layout.area_prefix(Layout.INCOMING, self.cluster, self.node)  # validates both names (ConfigError)
        if not self.poll_interval > 0:
            raise ConfigError(f"poll_interval must be > 0, got {self.poll_interval}")
        if not 0 < self.warn_usage_fraction <= 1:
            raise ConfigError(f"warn_usage_fraction must be in (0, 1], got {self.warn_usage_fraction}")
        if self.cdc_total_space is not None and self.cdc_total_space <= 0:
            raise ConfigError(f"cdc_total_space must be > 0, got {self.cdc_total_space}")
        if self.max_backoff < self.poll_interval:
            self.max_backoff = self.poll_interval
        try:
            if self.state_dir.resolve().is_relative_to(self.cdc_raw.resolve()):
                raise ConfigError(f"state_dir {self.state_dir} must not be inside cdc_raw {self.cdc_raw}")
        except OSError:
            pass


def default_cdc_total_space(cdc_raw: Path) -> int:
    """Cassandra's default: min(4096 MiB, total space of the cdc_raw volume / 8), in whole MiB."""
    total_mib = shutil.disk_usage(cdc_raw).total // MiB
    return min(4096, total_mib // 8) * MiB


# ---------------------------------------------------------------------------------------------------- cdc_raw
@dataclass(frozen=True)
class IdxState:
    offset: int
    completed: bool


def read_idx(path: Path) -> IdxState | None:
    """The idx content, or None while it is missing, empty or half-rewritten (then: retry later)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    lines = text.strip().split("\n")
    if not lines[0].strip().isdigit():
        return None
    offset = int(lines[0].strip())
    if len(lines) == 1:
        return IdxState(offset, False)
    if len(lines) == 2 and lines[1].strip() == "COMPLETED":
        return IdxState(offset, True)
    return None  # e.g. "5678\nCOMPL": caught mid-rewrite


@dataclass(frozen=True)
class CdcSegment:
    """One segment file in cdc_raw and what its side files say about it."""

    name: str
    path: Path
    version: int
    segment_id: int
    size: int
    idx_paths: tuple[Path, ...]
    idx: IdxState | None

    @property
    def complete(self) -> bool:
        if self.idx is not None:
            return self.idx.completed
        if self.idx_paths:
            return False  # an idx exists but is being rewritten: wait
        return self.version <= 6  # 3.11 renames finished segments in; 4.0+ links live ones

    @property
    def stem(self) -> str:
        return self.name[: -len(".log")]


@dataclass(frozen=True)
class CdcRawScan:
    segments: list[CdcSegment]  # sorted by (segment id, version)
    orphan_idx: list[Path]  # idx files whose segment is gone
    total_bytes: int  # every regular file in cdc_raw, as Cassandra counts it


def scan_cdc_raw(cdc_raw: Path) -> CdcRawScan:
    """Segments in cdc_raw, oldest first, with their idx state."""
    logs: dict[str, Path] = {}
    idx_files: dict[str, list[Path]] = {}
    total = 0
    sizes: dict[str, int] = {}
    with os.scandir(cdc_raw) as it:
        for entry in it:
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                size = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue  # deleted while we looked
            total += size
            name = entry.name
            if name.endswith(".log"):
                try:
                    parse_segment_name(name)
                except FormatError:
                    continue
                logs[name[:-4]] = Path(entry.path)
                sizes[name[:-4]] = size
            else:
                m = _IDX_RE.match(name)
                if m:
                    idx_files.setdefault(m.group(1), []).append(Path(entry.path))
    segments = []
    for stem, path in logs.items():
        version, seg_id = parse_segment_name(path.name)
        paths = tuple(sorted(idx_files.get(stem, []), key=lambda p: p.name.endswith("-CDC.idx")))
        idx = None
        for p in paths:
            idx = read_idx(p)
            if idx is not None:
                break
        segments.append(CdcSegment(path.name, path, version, seg_id, sizes[stem], paths, idx))
    segments.sort(key=lambda s: (s.segment_id, s.version))
    orphans = [p for stem, ps in idx_files.items() if stem not in logs for p in ps]
    return CdcRawScan(segments, sorted(orphans), total)


def synced_file_end(path: Path, logical_offset: int) -> int | None:
    """File offset up to which ``path`` holds the data of logical offset ``logical_offset`` (idx value).

    Uncompressed segments: the same number. Compressed/encrypted ones (header parameters name a compressor or
    cipher): walk the section markers, adding 8 + U per section (§5.2), until the logical offset is reached.
    None when the file does not (yet) show that much.
    """
    with open(path, "rb") as f:
        head = f.read(14)
        if len(head) < 14:
            return None
        seg_id = int.from_bytes(head[4:12], "big", signed=True)
        plen = int.from_bytes(head[12:14], "big")
        params_raw = f.read(plen)
        if len(params_raw) < plen:
            return None
        header_size = 18 + plen
        try:
            params = json.loads(params_raw.decode("utf-8")) if plen else {}
        except (UnicodeDecodeError, ValueError):
            raise FormatError("segment header parameters are not JSON", str(path), 14) from None
        transformed = isinstance(params, dict) and (
            "compressionClass" in params or ("encCipher" in params and "encKeyAlias" in params))
        file_len = os.fstat(f.fileno()).st_size
        if not transformed:
            return logical_offset if logical_offset <= file_len else None
        pos, logical = header_size, header_size
        while logical < logical_offset:
            if pos + 12 > file_len:
                return None
            f.seek(pos)
            marker = f.read(12)
            nxt, crc, uncompressed = be_i32(marker, 0), be_u32(marker, 4), be_i32(marker, 8)
            if crc != crc32_ints(seg_id & 0xFFFFFFFF, (seg_id >> 32) & 0xFFFFFFFF, pos) & 0xFFFFFFFF:
                return None  # not written yet (or damaged): do not ship past it
            if nxt <= pos or nxt > file_len or uncompressed < 0:
                return None
            logical += 8 + uncompressed
            pos = nxt
        return pos if logical == logical_offset else None


# ---------------------------------------------------------------------------------------------------- space
class SpaceMonitor:
    """Warns when cdc_raw is too full, or fills faster than the agent ships (with the numbers, rate-limited)."""

    def __init__(self, total_space: int, *, warn_fraction: float = 0.5, window: float = 300.0,
                 repeat_every: float = 60.0):
        self.total_space = total_space
        self.warn_fraction = warn_fraction
        self.window = window
        self.repeat_every = repeat_every
        self._samples: deque[tuple[float, int, int]] = deque()
        self._last_warned: dict[str, float] = {}
        self.arrival_rate = 0.0
        self.ship_rate = 0.0

    def observe(self, now: float, used_bytes: int, shipped_total: int) -> list[str]:
        """Record a sample; return (and log) the warnings due now."""
        self._samples.append((now, used_bytes, shipped_total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        warnings: list[str] = []
        fraction = used_bytes / self.total_space
        if fraction > self.warn_fraction:
            warnings.append(self._maybe(
                "usage", now,
                f"cdc_raw holds {used_bytes / MiB:.1f} MiB = {fraction:.0%} of the CDC space "
                f"({self.total_space / MiB:.0f} MiB); Cassandra rejects writes to CDC tables when it is full"))
        t0, used0, shipped0 = self._samples[0]
        dt = now - t0
        if dt > 0:
            shipped = shipped_total - shipped0
            arrived = (used_bytes - used0) + shipped
            self.arrival_rate, self.ship_rate = arrived / dt, shipped / dt
            if dt >= self.window / 2 and self.arrival_rate > self.ship_rate and self._sustained_growth(t0 + dt / 2):
                growth = (used_bytes - used0) / dt
                left = max(0, self.total_space - used_bytes)
                warnings.append(self._maybe(
                    "rate", now,
                    f"cdc_raw grows faster than it ships: {self.arrival_rate / MiB:.2f} MiB/s arrive, "
                    f"{self.ship_rate / MiB:.2f} MiB/s shipped over the last {dt:.0f} s; "
                    f"{left / MiB:.1f} MiB left, full in about {left / growth:.0f} s at this rate"))
        out = [w for w in warnings if w]
        for w in out:
            log.warning(w)
        return out

    def _sustained_growth(self, middle: float) -> bool:
        """Usage in the later half of the window stayed above its peak in the earlier half.

        On 4.0+ usage jumps by a whole segment when one is created (hard link) and drops when one is shipped;
        comparing two single samples would warn on that saw-tooth.
        """
        early = [u for t, u, _ in self._samples if t <= middle]
        late = [u for t, u, _ in self._samples if t > middle]
        return bool(early and late) and min(late) > max(early)

    def _maybe(self, kind: str, now: float, message: str) -> str:
        last = self._last_warned.get(kind)
        if last is not None and now - last < self.repeat_every:
            return ""
        self._last_warned[kind] = now
        return message


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
        self._failures = 0
        self._next_attempt = 0.0
        self._stop = threading.Event()
        self._m: dict[str, Any] = {
            "cluster": config.cluster, "node": config.node, "store": self.store.url,
            "segments_shipped": 0, "bytes_shipped": 0, "live_chunks_shipped": 0, "live_bytes_shipped": 0,
            "upload_failures": 0, "consecutive_failures": 0, "conflicts": 0, "segments_lost": 0,
            "last_error": None, "last_error_time": None, "last_shipped_segment": None, "last_success_time": None,
            "cdc_raw_bytes": 0, "cdc_total_space": total, "cdc_usage_fraction": 0.0, "pending_segments": 0,
            "live_segments": 0, "arrival_rate": 0.0, "ship_rate": 0.0, "started_at": time.time(),
        }

    # -------------------------------------------------------------- public
    def metrics(self) -> dict[str, Any]:
        return dict(self._m)

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
        now = self.clock()
        scan = scan_cdc_raw(self.config.cdc_raw)
        if now >= self._next_attempt:
            ok = True
            self._cleanup_orphans(scan)
            for seg in scan.segments:
                if self._stop.is_set():
                    break
                if not seg.complete:
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
            if shipped:
                scan = scan_cdc_raw(self.config.cdc_raw)
        self._m["cdc_raw_bytes"] = scan.total_bytes
        self._m["cdc_usage_fraction"] = round(scan.total_bytes / self.space.total_space, 6)
        self._m["pending_segments"] = sum(1 for s in scan.segments if s.complete)
        self._m["live_segments"] = sum(1 for s in scan.segments if not s.complete)
        self.space.observe(self.clock(), scan.total_bytes, self._m["bytes_shipped"])
        self._m["arrival_rate"] = round(self.space.arrival_rate, 3)
        self._m["ship_rate"] = round(self.space.ship_rate, 3)
        self._write_status()
        return shipped

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
                info = self.store.put_file(seg.path, key, checksum=checksum)
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


def _idx_paths(cdc_raw: Path, stem: str) -> list[Path]:
    return [cdc_raw / (stem + suffix) for suffix in IDX_SUFFIXES]


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


# ---------------------------------------------------------------------------------------------------- CLI
def build_parser(prog: str = "cassandra-cdc agent") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Ship completed Cassandra CDC segments from cdc_raw "
                                                       "to object storage.")
    p.add_argument("--config", help="YAML settings file (default: $CASSANDRA_CDC_CONFIG); keys as below, "
                                    "top level or under 'agent:'")
    p.add_argument("--cdc-raw", dest="cdc_raw", help="Cassandra's cdc_raw directory")
    p.add_argument("--store-url", dest="store_url", help="store root: /dir, file:///dir, s3://bucket/prefix, ...")
    p.add_argument("--storage-option", dest="storage_option", action="append", metavar="KEY=VALUE",
                   help="fsspec storage option, repeatable (e.g. endpoint_url=http://127.0.0.1:8333)")
    p.add_argument("--cluster", help="cluster name (first part of every key)")
    p.add_argument("--node", help="node name (default: this host's name)")
    p.add_argument("--poll-interval", dest="poll_interval", type=float, help="seconds between scans (1)")
    p.add_argument("--state-dir", dest="state_dir", help="local state directory (default: beside cdc_raw)")
    p.add_argument("--ship-live-prefix", dest="ship_live_prefix", action="store_true", default=None,
                   help="also ship the synced prefix of live 4.0+ segments")
    p.add_argument("--no-ship-live-prefix", dest="ship_live_prefix", action="store_false")
    p.add_argument("--cdc-total-space", dest="cdc_total_space",
                   help="Cassandra's cdc_total_space, e.g. 4096MiB (default: min(4096MiB, volume/8))")
    p.add_argument("--warn-usage-fraction", dest="warn_usage_fraction", type=float,
                   help="warn when cdc_raw holds more than this fraction of the CDC space (0.5)")
    p.add_argument("--rate-window", dest="rate_window", type=float,
                   help="seconds over which arrival and ship rates are compared (300)")
    p.add_argument("--max-backoff", dest="max_backoff", type=float, help="longest retry delay in seconds (60)")
    p.add_argument("--log-level", dest="log_level", help="DEBUG, INFO, WARNING, ERROR (INFO)")
    p.add_argument("--once", action="store_true", help="one pass, then exit (1 if a segment failed to ship)")
    return p


def load_agent_config(args: argparse.Namespace, env: dict[str, str] | None = None) -> AgentConfig:
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "once", "storage_option")}
    if args.storage_option:
        flags["storage_options"] = config_mod.parse_key_values(args.storage_option)
    return config_mod.load(AgentConfig, flags=flags, env=env, config_file=args.config, section="agent")


def agent_main(argv: list[str] | None = None) -> int:
    """``cassandra-cdc agent ...``: returns the process exit code (0 after a clean SIGTERM/SIGINT stop)."""
    args = build_parser().parse_args(argv)
    try:
        cfg = load_agent_config(args)
        level = getattr(logging, str(cfg.log_level).upper(), None)
        if not isinstance(level, int):
            raise ConfigError(f"unknown log level {cfg.log_level!r}")
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        agent = Agent(cfg)
    except ConfigError as e:
        print(f"cassandra-cdc agent: {e}", file=sys.stderr)
        return 2
    if args.once:
        agent.run_once()
        return 1 if agent.metrics()["consecutive_failures"] else 0
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s, stopping after the current step", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        agent.run_forever(stop)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return 0


__all__ = ["AgentConfig", "Agent", "CdcSegment", "IdxState", "SpaceMonitor", "agent_main", "build_parser",
           "default_cdc_total_space", "read_idx", "scan_cdc_raw", "synced_file_end"]

if __name__ == "__main__":
    sys.exit(agent_main(sys.argv[1:]))
