"""The commit-log segment container: header, sync sections, entries, CRCs, compression and encryption.

A segment is read as a stream of ``LogEntry`` (one serialized mutation, located by its logical position) and
``Damage`` records (bytes that could not be read, kept for quarantine with the reason). Positions are the
logical (uncompressed) offsets Cassandra uses for ``CommitLogPosition`` and writes into ``<segment>_cdc.idx``:
an entry's ``position`` is the offset just *after* it (format reference §3.5, §5.2).

Error policy (§3.4), tolerant by default, ``strict=True`` raises the first problem instead:

* a zeroed sync marker, or no room for one (only zero bytes left), is the clean end of the segment;
* a file cut inside its last section (the marker points past the end of the file, or the file ends inside a
  marker) is a torn tail. The section's whole entries whose two CRCs check are read, like any others; the rest,
  from the first entry the cut reaches, is one ``Damage`` of kind ``torn_tail`` (its position is where the lost
  entries start; its bytes are what the file still holds of them). A completed segment is never torn, so this is
  damage: a node that died mid-write, or a copy cut short. In a compressed or encrypted section the entries are
  read from what the codec decodes of the cut payload (``Compressor.decompress_prefix``,
  ``encryption.decrypt_section_prefix``: every codec decodes in order, so that is an exact prefix of the section);
  the damage record then keeps the section's file bytes. A *live* segment read up to its ``_cdc.idx`` offset
  (``stop``), or a prefix of it cut there, is not torn: that offset is always where a section ends;
* an entry whose mutation CRC fails is reported and skipped; reading goes on with the next entry;
* a bad entry size/size CRC, or a section that cannot be decompressed/decrypted, is reported with the rest of
  that section's bytes, and reading resumes at the next section;
* a compressed/encrypted section whose length field is negative is reported with the rest of the file: the
  logical positions of every later entry depend on that length;
* a damaged sync marker (valid CRC is not found) is reported with the rest of the file: without a valid marker
  there is no safe way to find the next section.

Files are read section by section (memory-mapped when uncompressed), so memory does not grow with the segment.
"""
from __future__ import annotations

import contextlib
import json
import mmap
import os
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

from cdc_lib import wire
from cdc_lib.errors import CdcError, SegmentError
from cdc_lib.storage.layout import parse_segment_name  # noqa: F401 - re-exported: the reader's own name check

SYNC_MARKER_SIZE = 8
ENTRY_OVERHEAD = 12
MIN_ENTRY_SIZE = 10
SUPPORTED_VERSIONS = (6, 7, 8)
CONTAINER_ONLY_VERSIONS = (5,)   # 2.2: same container, pre-3.0 mutation layout (not decoded)
MESSAGING_VERSION = {5: None, 6: 11, 7: 12, 8: 13}

@dataclass(frozen=True)
class SegmentHeader:
    version: int
    id: int
    params: dict
    size: int                                  # header bytes (18 + parameter length)

    @property
    def compression_class(self) -> Optional[str]:
        return self.params.get("compressionClass") if not self.encrypted else None

    @property
    def encrypted(self) -> bool:
        return "encKeyAlias" in self.params and "encCipher" in self.params

    @property
    def messaging_version(self) -> Optional[int]:
        return MESSAGING_VERSION.get(self.version)


@dataclass
class LogEntry:
    """One commit-log entry: a serialized mutation and where it sits."""
    segment: str
    segment_id: int
    start: int                                 # logical offset of the entry's size field
    position: int                              # logical offset just after the entry (CommitLogPosition)
    data: bytes                                # the serialized mutation
    descriptor_version: int

    @property
    def messaging_version(self) -> Optional[int]:
        return MESSAGING_VERSION.get(self.descriptor_version)


# Damage kinds that mean bytes were damaged or lost (the others, ``unknown_table`` and ``unsupported``, are entries
# read whole that this schema or decoder cannot type: kept in quarantine, but the segment itself is sound).
DAMAGE_KINDS = frozenset({"header", "bad_marker", "bad_entry", "crc_mismatch", "compression", "encryption",
                          "torn_tail", "undecodable"})


@dataclass
class Damage:
    """Bytes that could not be read, kept whole for quarantine, with what went wrong and where."""
    segment: str
    position: int                              # logical offset where the damage starts
    kind: str                                  # header, bad_marker, bad_entry, crc_mismatch, compression,
                                               # encryption, torn_tail
    reason: str
    data: bytes = field(repr=False, default=b"")
    physical_position: Optional[int] = None
    table_id: Optional[uuid.UUID] = None       # the table an ``unknown_table`` entry names

    @property
    def is_torn_tail(self) -> bool:
        return self.kind == "torn_tail"

    @property
    def is_damage(self) -> bool:
        """Bytes were damaged or lost (``DAMAGE_KINDS``), as opposed to an entry read whole but not typed."""
        return self.kind in DAMAGE_KINDS

    def error(self) -> SegmentError:
        return SegmentError(f"{self.kind}: {self.reason}", self.segment, self.position)


Record = Union[LogEntry, Damage]


@dataclass(frozen=True)
class _Cut:
    """How the last section of a torn file is cut: why (for the damage reason), and what to keep."""
    reason: str
    raw: Optional[bytes] = None                # compressed/encrypted: the section's file bytes (else the entries')
    physical: Optional[int] = None             # file offset of ``raw``


def read_header(buf, name: str = "<segment>") -> SegmentHeader:
    """Parse and check the descriptor header at offset 0 (§2.2)."""
    if len(buf) < 18:
        raise SegmentError(f"file of {len(buf)} bytes is too short for a segment header", name, 0)
    version = wire.be_i32(buf, 0)
    seg_id = int.from_bytes(buf[4:12], "big", signed=True)
    plen = int.from_bytes(buf[12:14], "big")
    if 18 + plen > len(buf):
        raise SegmentError(f"header parameters ({plen} bytes) run past the end of the file", name, 12)
    params_raw = bytes(buf[14:14 + plen])
    stored = wire.be_u32(buf, 14 + plen)
    crc = wire.crc32_ints(version, seg_id & wire.MASK32, (seg_id >> 32) & wire.MASK32, plen)
    crc = zlib.crc32(params_raw, crc)
    if crc != stored:
        raise SegmentError(f"header CRC mismatch (stored {stored:#010x}, computed {crc:#010x})", name, 14 + plen)
    if version not in SUPPORTED_VERSIONS and version not in CONTAINER_ONLY_VERSIONS:
        raise SegmentError(f"unsupported commit-log descriptor version {version}", name, 0)
    try:
        params = json.loads(params_raw.decode("utf-8")) if plen else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SegmentError(f"header parameters are not JSON: {e}", name, 14) from None
    if not isinstance(params, dict):
        raise SegmentError("header parameters are not a JSON object", name, 14)
    return SegmentHeader(version, seg_id, params, 18 + plen)


def is_segment_bytes(source) -> bool:
    """Whether ``source`` is a segment's contents rather than its path.

    A bytearray or memoryview is contents. ``bytes`` is a path when it can be one, as ``open`` takes bytes paths:
    non-empty and without a NUL byte. Every segment begins with NUL bytes (its version, a big-endian int), so
    the two never overlap.
    """
    if isinstance(source, (bytearray, memoryview)):
        return True
    return isinstance(source, bytes) and (not source or b"\0" in source)


@dataclass(frozen=True)
class SegmentBytes:
    """A segment's contents with its file name (``CommitLog-<version>-<id>.log``): a segment read from an object
    store into memory, which readers name as they would its file."""
    name: str
    data: bytes


def segment_sources(paths) -> list:
    """The segments of a ``paths`` argument: one path, segment's bytes or ``SegmentBytes``, or an iterable of
    them."""
    if isinstance(paths, (str, bytes, bytearray, memoryview, SegmentBytes)) or hasattr(paths, "__fspath__"):
        return [paths]
    return list(paths)


class SegmentReader:
    """Iterate a segment's entries and damage records, in file order.

    ``source`` is a path, the segment's bytes (then give ``name``; see ``is_segment_bytes``) or ``SegmentBytes``
    (named as it says unless ``name`` is given). ``start``: skip entries ending at or before this logical position
    (the last position already processed); ``stop``: read only entries that end at or before it (the synced offset
    from ``_cdc.idx`` for a live segment). ``keys`` are the ``commitlog.encryption.EncryptionKeys`` for encrypted
    segments.
    """

    def __init__(self, source, *, name: str | None = None, keys=None, start: int | None = None,
                 stop: int | None = None, strict: bool = False):
        self._path = None
        if isinstance(source, SegmentBytes):
            self._buf = source.data
            self.name = name or source.name
        elif is_segment_bytes(source):
            self._buf = source
            self.name = name or "<bytes>"
        else:
            self._path = os.fsdecode(source)        # a str path also when given as bytes
            self.name = name or os.path.basename(self._path)
            self._buf = None
        self.keys = keys
        self.start = start
        self.stop = stop
        self.strict = strict
        self.header: Optional[SegmentHeader] = None
        self.codec = None                  # the sections' compressor (``begin``)
        self.damaged = False
        self.entries = 0

    # -- file access -----------------------------------------------------------------------------------
    def _open(self):
        if self._buf is not None:
            return self._buf, None, None
        f = open(self._path, "rb")
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            f.close()
            return b"", None, None
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return mm, mm, f

    @contextlib.contextmanager
    def mapped(self):
        """The segment's bytes (memory-mapped when it is a file) while the block runs."""
        buf, mm, f = self._open()
        try:
            yield buf
        finally:
            if mm is not None:
                mm.close()
            if f is not None:
                f.close()

    def __iter__(self) -> Iterator[Record]:
        with self.mapped() as buf:
            yield from self._read(buf)

    def damage(self, position: int, kind: str, reason: str, data=b"", physical=None) -> Damage:
        """A Damage record of this segment (raised as ``SegmentError`` instead when ``strict``)."""
        d = Damage(self.name, position, kind, reason, bytes(data), physical)
        self.damaged = True
        if self.strict:
            raise d.error()
        return d

    # -- sections ----------------------------------------------------------------------------------------
    def begin(self, buf) -> Optional[Damage]:
        """Read the header (``self.header``) and set up the section codec; a Damage when no section can be read.

        The compiled reader (``celllog.native``) calls this, walks the sections itself and comes back here for
        each compressed or encrypted section (``section_bytes``, ``torn_section_bytes``, ``section_failed``).
        """
        try:
            header = read_header(buf, self.name)
        except SegmentError as e:
            if self.strict:
                raise
            self.damaged = True
            return Damage(self.name, e.position or 0, "header", e.reason, bytes(buf))
        self.header = header
        try:
            _, name_id = parse_segment_name(self.name)
            if name_id != header.id:
                return self.damage(0, "header", f"segment id mismatch: file name says {name_id}, "
                                                f"header says {header.id}", buf)
        except SegmentError:
            pass  # bytes given without a proper file name: nothing to compare
        self.codec = None
        if header.compression_class is not None:
            from .compression import compressor_for
            try:
                self.codec = compressor_for(header.compression_class, header.params.get("compressionParameters"))
            except CdcError as e:       # e.g. a compressor this reader does not know: no section can be read
                return self.damage(0, "header", f"cannot read its sections: {e}", buf)
        return None

    def _read(self, buf) -> Iterator[Record]:
        self._ended = False
        d = self.begin(buf)
        if d is not None:
            yield d
            return
        header = self.header
        seg_id = header.id
        id_lo, id_hi = seg_id & wire.MASK32, (seg_id >> 32) & wire.MASK32
        compressed = header.compression_class is not None
        encrypted = header.encrypted
        n = len(buf)
        pos = header.size
        logical = header.size
        while pos <= n - SYNC_MARKER_SIZE:
            nxt = wire.be_i32(buf, pos)
            crc = wire.be_u32(buf, pos + 4)
            if crc != wire.crc32_ints(id_lo, id_hi, pos):
                if nxt == 0 and crc == 0:
                    return                                     # zeroed marker: clean end
                yield self.damage(logical, "bad_marker",
                                  f"sync marker CRC mismatch at file offset {pos}", buf[pos:], pos)
                return
            if self.stop is not None and logical >= self.stop:
                return
            if nxt < pos + SYNC_MARKER_SIZE:
                yield self.damage(logical, "bad_marker", f"sync marker at {pos} points back to {nxt}",
                                  buf[pos:], pos)
                return
            cut = None
            if nxt > n:
                cut = _Cut(f"the section at file offset {pos} ends at {nxt}, past the end of the file ({n} bytes): "
                           f"{nxt - n} bytes are missing")
            if not compressed and not encrypted:
                yield from self._entries(buf, pos + SYNC_MARKER_SIZE, min(nxt, n), pos + SYNC_MARKER_SIZE, cut)
                if self._ended or cut:
                    return
                pos = nxt
                logical = nxt
                continue
            # compressed / encrypted: i32 uncompressed length, then the payload
            if nxt < pos + 12 or n < pos + 12:
                if cut:
                    yield self.damage(logical + SYNC_MARKER_SIZE, "torn_tail",
                                      f"the file ends inside the section header; {cut.reason}", buf[pos:n], pos)
                else:
                    yield self.damage(logical, "bad_marker", f"section at {pos} too short for its length field",
                                      buf[pos:nxt], pos)
                return
            ulen = wire.be_i32(buf, pos + 8)
            section_logical = logical + SYNC_MARKER_SIZE
            if ulen < 0:
                # The logical offsets of everything after this section depend on its uncompressed length: with
                # it lost, no later entry could be given its true position, so the rest of the file is kept.
                yield self.damage(section_logical, "bad_entry", f"negative section length {ulen} at {pos}: the "
                                  "positions of the rest of the segment are unknown; rest of the file kept",
                                  buf[pos:n], pos)
                return
            payload = bytes(buf[pos + 12:min(nxt, n)])
            if self.start is not None and section_logical + ulen <= self.start:
                if cut:
                    return
                pos = nxt                                       # whole section already processed
                logical = section_logical + ulen
                continue
            if cut:
                data, reason = self.torn_section_bytes(payload, ulen, cut.reason)
                yield from self._entries(data, 0, len(data), section_logical,
                                         _Cut(reason, bytes(buf[pos:n]), pos))
                return
            try:
                data = self.section_bytes(payload, ulen)
            except CdcError as e:
                yield self.section_failed(buf, pos, nxt, section_logical, e)
                pos = nxt
                logical = section_logical + ulen
                continue
            yield from self._entries(data, 0, len(data), section_logical)
            if self._ended:
                return
            pos = nxt
            logical = section_logical + ulen
        if pos < n and any(buf[pos:n]):
            # Fewer than 8 bytes left and not all zero: the file was cut inside a sync marker.
            yield self.damage(logical, "torn_tail", f"the file ends inside the sync marker at file offset {pos} "
                              f"({n - pos} of its 8 bytes)", buf[pos:n], pos)

    def section_bytes(self, payload: bytes, ulen: int) -> bytes:
        """The entry bytes of a compressed or encrypted section (raises the codec's ``CdcError``)."""
        header = self.header
        if header.encrypted:
            from .encryption import decrypt_section
            return decrypt_section(payload, ulen, header.params, self._keys_for(header))
        return b"" if ulen == 0 else self.codec.decompress(payload, ulen)

    def section_failed(self, buf, pos: int, nxt: int, section_logical: int, error: CdcError) -> Damage:
        """The Damage of a section that cannot be decompressed or decrypted (its file bytes kept)."""
        kind = "encryption" if self.header.encrypted else "compression"
        return self.damage(section_logical, kind, f"section at file offset {pos}: "
                           f"{getattr(error, 'reason', str(error))}", buf[pos:nxt], pos)

    def _keys_for(self, header: SegmentHeader):
        if self.keys is None:
            from cdc_lib.errors import EncryptionError
            raise EncryptionError("segment is encrypted and no key was given "
                                  f"(alias {header.params.get('encKeyAlias')!r})")
        return self.keys

    def torn_section_bytes(self, payload: bytes, ulen: int, cut_reason: str) -> tuple:
        """What the codec decodes of a compressed/encrypted section cut by the end of the file, and the reason
        of the torn-tail damage that follows its whole entries: (entry bytes, reason)."""
        header = self.header
        try:
            if header.encrypted:
                from .encryption import decrypt_section_prefix
                return decrypt_section_prefix(payload, ulen, header.params, self._keys_for(header)), cut_reason
            return self.codec.decompress_prefix(payload, ulen), cut_reason
        except CdcError as e:
            return b"", f"{cut_reason}; {getattr(e, 'reason', str(e))}"

    _ended = False          # set by _entries at a legacy end-of-segment marker (entry size 0)

    def _entries(self, buf, begin: int, end: int, logical_begin: int, cut: Optional[_Cut] = None
                 ) -> Iterator[Record]:
        """Entries in ``buf[begin:end]``; ``logical_begin`` is the logical offset of ``begin``.

        ``cut``: the section goes on past the end of the file; ``end`` is where the readable bytes stop, and what
        follows the last whole entry is a ``torn_tail`` damage (also when nothing follows: entries are missing).
        """
        shift = logical_begin - begin
        p = begin
        start, stop = self.start, self.stop

        def torn(what: str) -> Damage:
            data, physical = (buf[p:end], None) if cut.raw is None else (cut.raw, cut.physical)
            return self.damage(p + shift, "torn_tail", f"{what}: {cut.reason}", data, physical)

        while p < end:
            if stop is not None and p + shift >= stop:
                self._ended = True                      # the rest is past the synced offset: not ours to read
                return
            if end - p < 4:
                if cut:
                    yield torn(f"the entry at {p + shift} is cut after {end - p} bytes")
                else:
                    yield self.damage(p + shift, "bad_entry", f"{end - p} stray bytes at the end of a section",
                                       buf[p:end])
                return
            size = wire.be_i32(buf, p)
            if size == 0:
                if cut:
                    yield torn(f"zero bytes where the entry at {p + shift} should be")
                    return
                # Legacy end-of-segment marker (and unwritten space in a live file).
                self._ended = True
                return
            if end - p < 8:
                if cut:
                    yield torn(f"the entry at {p + shift} is cut after {end - p} bytes")
                else:
                    yield self.damage(p + shift, "bad_entry", "entry header cut by the end of the section",
                                       buf[p:end])
                return
            size_crc = wire.be_u32(buf, p + 4)
            c1 = wire.crc32_ints(size)
            if size_crc != c1 or size < MIN_ENTRY_SIZE:
                why = (f"entry size CRC mismatch (size field {size})" if size_crc != c1
                       else f"entry size {size} is below the minimum of {MIN_ENTRY_SIZE}")
                yield self.damage(p + shift, "bad_entry", why + "; rest of the section kept", buf[p:end])
                return
            entry_end = p + ENTRY_OVERHEAD + size
            position = entry_end + shift
            if stop is not None and position > stop:
                self._ended = True
                return
            if entry_end > end:
                if cut:
                    yield torn(f"the entry of {size} bytes at {p + shift} is cut after {end - p - 8} bytes")
                else:
                    yield self.damage(p + shift, "bad_entry",
                                       f"entry of {size} bytes runs past the end of its section", buf[p:end])
                return
            data = bytes(buf[p + 8:p + 8 + size])
            stored = wire.be_u32(buf, entry_end - 4)
            if zlib.crc32(data, c1) != stored:
                yield self.damage(p + shift, "crc_mismatch", f"mutation CRC mismatch in entry of {size} bytes",
                                   buf[p:entry_end])
            elif start is None or position > start:
                self.entries += 1
                yield LogEntry(self.name, self.header.id, p + shift, position, data, self.header.version)
            p = entry_end
        if cut:
            yield torn(f"the entries from {p + shift} on are missing")


def read_segment(source, **kwargs) -> Iterator[Record]:
    """Shorthand for ``iter(SegmentReader(source, **kwargs))``."""
    return iter(SegmentReader(source, **kwargs))
