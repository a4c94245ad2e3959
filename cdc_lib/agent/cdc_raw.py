"""What a node's ``cdc_raw`` holds: which segments are complete, and how far a live one is synced.

Which files are complete (format reference §8):

* Descriptor <= 6 (Cassandra 3.11): a segment is *renamed* into ``cdc_raw`` once discarded, so a file there is
  complete as soon as it appears. There is no index file.
* Descriptor >= 7 (Cassandra 4.0+): the segment is hard-linked into ``cdc_raw`` when created, while it is still
  being written. ``<segment>_cdc.idx`` holds ``"<offset>"`` (synced up to there) or ``"<offset>\\nCOMPLETED"``. The
  file is rewritten in place, so an empty or half-written idx is "not known yet": retry next poll. The legacy
  suffix ``-CDC.idx`` is accepted too. A segment without an idx is live: Cassandra has not synced CDC data into
  it yet (the next segment is linked as soon as it is pre-allocated, so one or two such files are always there),
  and when it is discarded without CDC data Cassandra deletes its link.

What real Cassandra 5.0 does beyond that (README, "A real Cassandra"):

* **A clean shutdown (drain, SIGTERM) leaves an empty link behind.** The pre-allocated segment is deleted from
  the commit-log directory without telling the CDC tracker, so its link stays: no idx, link count 1 (the link is
  the file's only name), no data; nothing ever deletes it, and it counts against ``cdc_total_space``.
  ``CdcSegment.orphaned`` says so; the agent deletes such a file once ``holds_data`` confirms it is empty (one
  that holds data is shipped instead: never delete what might be data).
* **Commit-log replay rewrites the idx** of every replayed segment holding CDC data to
  ``"<file length>\\nCOMPLETED"``, also when it already said COMPLETED, and re-creates the segment's link if it
  is gone (the agent may have shipped and deleted it already: the store then holds the same bytes). For
  compressed and encrypted segments that offset is a file offset, not a logical one; a COMPLETED segment is
  shipped whole, so the offset of a COMPLETED idx is never used.

For compressed or encrypted segments the offset of a live idx is logical; ``synced_file_end`` maps it to the
file offset by walking the section markers.
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
    links: int = 2             # hard links to the file (``st_nlink``): 1 once Cassandra dropped its own name

    @property
    def orphaned(self) -> bool:
        """A 4.0+ segment no longer in the commit-log directory that never got an idx: a pre-allocated segment a
        clean shutdown left behind (Cassandra writes the idx of a segment holding CDC data before it deletes its
        own name, and replays the ones a crash left). Live segments have 2 links."""
        return self.version >= 7 and not self.idx_paths and self.links == 1

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
    stats: dict[str, os.stat_result] = {}
    with os.scandir(cdc_raw) as it:
        for entry in it:
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted while we looked
            total += st.st_size
            name = entry.name
            if name.endswith(".log"):
                try:
                    parse_segment_name(name)
                except FormatError:
                    continue
                logs[name[:-4]] = Path(entry.path)
                stats[name[:-4]] = st
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
        st = stats[stem]
        segments.append(CdcSegment(path.name, path, version, seg_id, st.st_size, paths, idx, st.st_nlink))
    segments.sort(key=lambda s: (s.segment_id, s.version))
    orphans = [p for stem, ps in idx_files.items() if stem not in logs for p in ps]
    return CdcRawScan(segments, sorted(orphans), total)


@dataclass(frozen=True)
class _Layout:
    header_size: int
    transformed: bool          # compressed or encrypted: markers carry the section's uncompressed length
    file_len: int


def _layout(f, path: Path) -> _Layout | None:
    """The header of an open segment: its size and whether sections are transformed; None while too short."""
    head = f.read(14)
    if len(head) < 14:
        return None
    plen = int.from_bytes(head[12:14], "big")
    params_raw = f.read(plen)
    if len(params_raw) < plen:
        return None
    try:
        params = json.loads(params_raw.decode("utf-8")) if plen else {}
    except (UnicodeDecodeError, ValueError):
        raise FormatError("segment header parameters are not JSON", str(path), 14) from None
    transformed = isinstance(params, dict) and (
        "compressionClass" in params or ("encCipher" in params and "encKeyAlias" in params))
    return _Layout(18 + plen, transformed, os.fstat(f.fileno()).st_size)


def _sections(f, layout: _Layout):
    """(marker position, next marker, payload length) of each section whose sync marker is written and checks,
    from the first; the payload length is the uncompressed one for transformed segments."""
    f.seek(4)
    seg_id = int.from_bytes(f.read(8), "big", signed=True)
    marker_size = 12 if layout.transformed else 8
    pos = layout.header_size
    while pos + marker_size <= layout.file_len:
        f.seek(pos)
        marker = f.read(marker_size)
        nxt, crc = be_i32(marker, 0), be_u32(marker, 4)
        if crc != crc32_ints(seg_id & 0xFFFFFFFF, (seg_id >> 32) & 0xFFFFFFFF, pos) & 0xFFFFFFFF:
            return  # not written yet (a zero tail) or damaged
        if nxt <= pos or nxt > layout.file_len:
            return
        length = be_i32(marker, 8) if layout.transformed else nxt - pos - marker_size
        if length < 0:
            return
        yield pos, nxt, length
        pos = nxt


def synced_file_end(path: Path, logical_offset: int) -> int | None:
    """File offset up to which ``path`` holds the data of logical offset ``logical_offset`` (idx value).

    Uncompressed segments: the same number. Compressed/encrypted ones (header parameters name a compressor or
    cipher): walk the section markers, adding 8 + U per section (§5.2), until the logical offset is reached.
    None when the file does not (yet) show that much.
    """
    with open(path, "rb") as f:
        layout = _layout(f, path)
        if layout is None:
            return None
        if not layout.transformed:
            return logical_offset if logical_offset <= layout.file_len else None
        logical = layout.header_size
        if logical >= logical_offset:
            return layout.header_size if logical == logical_offset else None
        for _, nxt, uncompressed in _sections(f, layout):
            logical += 8 + uncompressed
            if logical >= logical_offset:
                return nxt if logical == logical_offset else None
        return None


def holds_data(path: Path) -> bool | None:
    """Whether a segment holds any entry: a section with a payload (an empty final section does not count).
    None when the header cannot be read (too short)."""
    with open(path, "rb") as f:
        layout = _layout(f, path)
        if layout is None:
            return None
        return any(length > 0 for _, _, length in _sections(f, layout))


def _idx_paths(cdc_raw: Path, stem: str) -> list[Path]:
    return [cdc_raw / (stem + suffix) for suffix in IDX_SUFFIXES]
