"""What a node's ``cdc_raw`` holds: which segments are complete, and how far a live one is synced.

Which files are complete (format reference §8):

* Descriptor <= 6 (Cassandra 3.11): a segment is *renamed* into ``cdc_raw`` once discarded, so a file there is
  complete as soon as it appears. There is no index file.
* Descriptor >= 7 (Cassandra 4.0+): the segment is hard-linked into ``cdc_raw`` when created, while it is still
  being written. ``<segment>_cdc.idx`` holds ``"<offset>"`` (synced up to there) or ``"<offset>\\nCOMPLETED"``. The
  file is rewritten in place, so an empty or half-written idx is "not known yet": retry next poll. A segment
  without an idx is live (or holds no CDC data and Cassandra will delete it itself). The legacy suffix
  ``-CDC.idx`` is accepted too.

For compressed or encrypted segments the idx offset is logical; ``synced_file_end`` maps it to the file offset
by walking the section markers.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cdc_lib.errors import FormatError
from cdc_lib.storage.layout import parse_segment_name
from cdc_lib.wire import be_i32, be_u32, crc32_ints

IDX_SUFFIXES = ("_cdc.idx", "-CDC.idx")  # 4.0+ name first; the second is a legacy spelling, handled defensively
_IDX_RE = re.compile(r"^(CommitLog-\d+-\d+)(_cdc\.idx|-CDC\.idx)$")


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


def _idx_paths(cdc_raw: Path, stem: str) -> list[Path]:
    return [cdc_raw / (stem + suffix) for suffix in IDX_SUFFIXES]
