"""Typed errors of cassandra-cdc.

Every error raised for bad input names *where* it happened: the file (segment) and the logical position
inside it, so that an operator can find the bytes and the quarantine record can say why they were kept.
Errors are exceptions with meaning (as in delta-rs): callers catch the class that matters to them.
"""
from __future__ import annotations


class CdcError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(CdcError):
    """A setting, flag or file given by the user is unusable."""


class FormatError(CdcError):
    """Bytes that do not follow the format they claim to be in.

    ``source`` is the file (or other origin) and ``position`` the logical byte offset at which the problem was
    found; both are optional because the same decoders run on in-memory buffers.
    """

    def __init__(self, message: str, source: str | None = None, position: int | None = None):
        self.reason = message
        self.source = source
        self.position = position
        where = ""
        if source is not None:
            where = f"{source}"
            if position is not None:
                where += f" @ {position}"
            where += ": "
        elif position is not None:
            where = f"@ {position}: "
        super().__init__(where + message)

    def located(self, source: str | None, base: int = 0) -> "FormatError":
        """A copy of this error placed in ``source``, with ``base`` added to its buffer-relative position."""
        err = type(self).__new__(type(self))
        FormatError.__init__(err, self.reason, source if source is not None else self.source,
                             None if self.position is None else self.position + base)
        for k, v in self.__dict__.items():
            if k not in ("reason", "source", "position"):
                setattr(err, k, v)
        return err


class TruncatedError(FormatError):
    """The bytes end before the structure does."""


class SegmentError(FormatError):
    """The commit-log segment container is damaged: header, sync marker, section framing or entry CRC."""


class CrcMismatch(SegmentError):
    """A stored CRC does not match the bytes it covers."""


class CompressionError(SegmentError):
    """A compressed section could not be decompressed to its stated length."""


class EncryptionError(SegmentError):
    """An encrypted section could not be decrypted (missing key, wrong key, bad padding)."""


class SSTableError(FormatError):
    """An SSTable component is damaged, unsupported or does not fit the others (``source`` names the file;
    ``position`` is the offset in that file, or in the uncompressed Data.db stream for Data.db)."""


class MutationError(FormatError):
    """A mutation's bytes could not be decoded with the schema in force."""


class CqlValueError(FormatError):
    """A CQL value's bytes do not fit its type (or a Python value cannot be encoded as that type)."""


class SchemaError(CdcError):
    """The schema is missing something a decoder needs, or a schema source cannot be parsed."""


class UnknownTableError(SchemaError, MutationError):
    """A mutation names a table id that the schema does not know. The mutation is kept raw, never dropped."""

    def __init__(self, table_id, source: str | None = None, position: int | None = None):
        self.table_id = table_id
        MutationError.__init__(self, f"unknown table id {table_id}", source, position)


class UnknownColumnError(SchemaError, MutationError):
    """A mutation names a column that neither the table nor its dropped columns know."""

    def __init__(self, table: str, column: str, source: str | None = None, position: int | None = None):
        self.table = table
        self.column = column
        MutationError.__init__(self, f"unknown column {column!r} in {table}", source, position)


class StorageError(CdcError):
    """An object store operation failed or found something it cannot accept."""


class ObjectNotFound(StorageError, KeyError):
    """The key names no object."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "object not found"


class VerificationError(StorageError):
    """An object does not have the size or checksum it was written with."""
