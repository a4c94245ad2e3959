"""Which SSTable a file belongs to: names, format versions and what each version changes, table directories.

A component file is ``<version>-<id>-<format>-<Component>`` (``nb-12-big-Data.db``, ``da-1-bti-Rows.db``; format
reference §1.2). The versions read here are the ones Cassandra 3.0 to 5.0 write (§3.1): BIG ``ma`` … ``me``,
``na``, ``nb``, ``oa`` and BTI ``da``. The keyspace, table name and table id are not in the files; they come
from the directories Cassandra keeps them in, ``<keyspace>/<table>-<32 hex id>/`` (§1.1), also when the files
sit in that directory's ``snapshots/<tag>/`` or ``backups/``.
"""
from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from cdc_lib.errors import SSTableError

BIG_VERSIONS = ("ma", "mb", "mc", "md", "me", "na", "nb", "oa")
BTI_VERSIONS = ("da",)

_UUID_ID_RE = re.compile(r"^[0-9a-z]{4}_[0-9a-z]{4}_[0-9a-z]{18}$", re.IGNORECASE)
_TABLE_DIR_RE = re.compile(r"^(?P<table>.+)-(?P<id>[0-9a-f]{32})$")
_UUID_EPOCH_OFFSET_100NS = 0x01B21DD213814000        # 1582-10-15 to 1970-01-01 in 100-ns ticks


@dataclass(frozen=True)
class Version:
    """What a format version changes for a sequential reader (format reference §3.2)."""
    version: str
    format: str                  # "big" or "bti"

    @property
    def metadata_checksums(self) -> bool:
        """Statistics.db carries CRCs (``na`` and later)."""
        return self.format == "bti" or self.version >= "na"

    @property
    def max_compressed_length(self) -> bool:
        """CompressionInfo.db has the ``max_compressed_length`` field, so chunks may be stored raw."""
        return self.format == "bti" or self.version >= "na"

    @property
    def uint_deletion_time(self) -> bool:
        """Local deletion times are unsigned 32-bit (5.0's ``oa``/``da``); partition deletions may take 1 byte."""
        return self.format == "bti" or self.version >= "oa"

    @property
    def messaging_version(self) -> int:
        """The messaging version whose rules decode this version's times (``correspondingMessagingVersion``)."""
        return 13 if self.uint_deletion_time else 12


def parse_version(version: str, fmt: str, source: str | None = None) -> Version:
    known = BIG_VERSIONS if fmt == "big" else BTI_VERSIONS if fmt == "bti" else ()
    if version not in known:
        raise SSTableError(f"SSTable format {fmt!r} version {version!r} is not supported (supported: big "
                           f"{', '.join(BIG_VERSIONS)}; bti {', '.join(BTI_VERSIONS)})", source)
    return Version(version, fmt)


@dataclass(frozen=True)
class Descriptor:
    """One SSTable: its directory, version and generation; ``path(component)`` names its files."""
    directory: Path
    version: Version
    generation: str              # as in the file name: a decimal sequence number or a 28-character UUID id

    @property
    def prefix(self) -> str:
        return f"{self.version.version}-{self.generation}-{self.version.format}-"

    def path(self, component: str) -> Path:
        return self.directory / (self.prefix + component)

    @property
    def data_name(self) -> str:
        """The Data.db file name: what cell-log records and damage records call this SSTable."""
        return self.prefix + "Data.db"

    @property
    def generation_number(self) -> int:
        """A number that grows with the SSTable's creation: the sequence id, or for a UUID id its time in µs."""
        if self.generation.isdigit():
            return int(self.generation)
        return uuid_id_micros(self.generation)


def uuid_id_micros(gen: str) -> int:
    """The creation time (µs since the Unix epoch) in a 28-character UUID SSTable id (format reference §1.2)."""
    days = int(gen[0:4], 36)
    secs = int(gen[5:9], 36)
    tenths = int(gen[10:15], 36)
    ticks = (days * 86400 + secs) * 10_000_000 + tenths
    return (ticks - _UUID_EPOCH_OFFSET_100NS) // 10


def parse_data_path(path) -> Descriptor:
    """The Descriptor of a ``*-Data.db`` path. Raises SSTableError for other names and unsupported versions."""
    p = Path(path)
    parts = p.name.split("-")
    if len(parts) != 4 or parts[3] != "Data.db":
        raise SSTableError("not an SSTable Data.db name (<version>-<id>-<format>-Data.db; pre-3.0 names are "
                           "not supported)", str(p))
    version, gen, fmt, _ = parts
    if not (gen.isdigit() or _UUID_ID_RE.match(gen)):
        raise SSTableError(f"SSTable id {gen!r} is neither a number nor a UUID id", str(p))
    return Descriptor(p.parent, parse_version(version, fmt, str(p)), gen)


def is_sstable_input(path) -> bool:
    """Whether a path given to ``inspect`` names SSTables (a ``*-Data.db`` file or a table directory) rather
    than a commit-log segment."""
    return os.path.isdir(path) or is_data_file(path)


def is_data_file(path) -> bool:
    name = os.path.basename(str(path))
    return name.endswith("-Data.db") and len(name.split("-")) == 4


@dataclass(frozen=True)
class TableDirectory:
    """What a table directory's name says: keyspace, table and table id (any of them may be unknown)."""
    keyspace: Optional[str]
    table: Optional[str]
    table_id: Optional[uuid.UUID]


def table_directory(sstable_dir) -> TableDirectory:
    """Keyspace, table and id from ``<keyspace>/<table>-<id>/`` (also for ``snapshots/<tag>/`` and ``backups/``
    below it). Parts that the directory names do not give are None."""
    d = Path(os.path.abspath(sstable_dir))
    if d.parent.name == "snapshots":
        d = d.parent.parent
    elif d.name == "backups":
        d = d.parent
    m = _TABLE_DIR_RE.match(d.name)
    if not m:
        return TableDirectory(None, None, None)
    keyspace = d.parent.name or None
    return TableDirectory(keyspace, m.group("table"), uuid.UUID(hex=m.group("id")))


def find_data_files(path) -> list:
    """The ``*-Data.db`` files a path names: the file itself, or every SSTable in a table directory (not in
    its ``snapshots/``, ``backups/`` or secondary-index subdirectories), oldest generation first."""
    p = Path(path)
    if p.is_dir():
        found = [c for c in p.iterdir() if c.is_file() and is_data_file(c)]
        descriptors = []
        for c in found:
            try:
                descriptors.append((parse_data_path(c).generation_number, c.name, c))
            except SSTableError:
                descriptors.append((-1, c.name, c))      # reported when read, not dropped here
        return [c for _, _, c in sorted(descriptors)]
    return [p]
