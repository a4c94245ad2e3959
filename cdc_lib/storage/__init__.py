"""The object store (fsspec: a local directory, S3, ...) and the one key layout every component shares.

``objects`` is the typed store (sha256 sidecars mark complete objects), ``layout`` the keys (incoming, archived,
quarantined, ledger, checkpoints, Delta roots), ``quarantine`` keeps damaged bytes aside with a reason.
"""
from cdc_lib.errors import ObjectNotFound, StorageError, VerificationError

from .layout import CHECKSUM_SUFFIX, REASON_SUFFIX, Layout, parse_segment_name
from .objects import ObjectInfo, ObjectStore, sha256_bytes, sha256_file

__all__ = ["CHECKSUM_SUFFIX", "REASON_SUFFIX", "Layout", "ObjectInfo", "ObjectNotFound", "ObjectStore",
           "StorageError", "VerificationError", "parse_segment_name", "sha256_bytes", "sha256_file"]
