"""Object storage: one typed store over fsspec (``ObjectStore``).

Stores, by URL: a local directory (``/data/cdc`` or ``file:///data/cdc``, the embedded default), S3 in production
(``s3://bucket/prefix``; endpoint and credentials from storage options such as ``endpoint_url``, ``key``,
``secret``, or the usual ``AWS_*`` environment variables, ``AWS_ENDPOINT_URL`` included), ``memory://name`` for
tests, and any other fsspec URL.

Integrity: an object written with a checksum gets a sidecar ``<key>.sha256`` (``sha256sum`` format, so
``sha256sum -c`` works on a local copy). The sidecar is written **last** and removed **first**, so an object is
*complete* exactly when its sidecar exists; readers ignore objects without one (they are uploads cut short).
A sidecar may also carry attributes of the object, one ``# <name>: <value>`` line each after the checksum line
(``sha256sum -c`` skips ``#`` lines, even with ``--strict``): the agent records there when Cassandra closed the
segment (``closed_at``), which the pipeline's end-to-end lag starts from. A move keeps them.
Every checksummed write is verified after upload (size, and content by re-reading it or by the server's MD5 ETag).

Keys follow the one layout of ``layout.Layout``.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

from cdc_lib.errors import ConfigError, ObjectNotFound, StorageError, VerificationError

from .layout import CHECKSUM_SUFFIX, Layout, _check_key

_CHUNK = 1 << 20
_SINGLE_COPY_MAX = 5 << 30      # S3's CopyObject copies up to 5 GiB; larger objects take a multipart copy
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ObjectInfo:
    """What the store knows of one object. ``checksum`` is the sidecar's sha256 hex, None when there is none;
    ``attributes`` the sidecar's ``# name: value`` lines."""

    key: str
    size: int
    checksum: str | None = None
    attributes: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Listed:
    """An object as a listing shows it: ``size``, ``committed_at``, when its sidecar was written (unix time by the
    store's clock; None when it has no sidecar: an upload cut short or still running), and ``etag``, the store's
    ETag of it (S3; None elsewhere), which a later ``move`` can check its copy against without asking again."""

    size: int
    committed_at: float | None
    etag: str | None = None


def sha256_file(path: str | Path) -> tuple[str, int]:
    """(sha256 hex, size) of a local file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_object(fs, path: str) -> bytes:
    """All the bytes of object ``path`` of fsspec filesystem ``fs``, in one request where the store allows.

    s3fs (2026.9, the release requirements.txt pins) asks an object's size (a HEAD) before every whole-object
    read, to split objects larger than its block size (50 MiB) into ranged GETs run at once. Ours are smaller
    (segments, at most ``commitlog_segment_size``: 32 MiB by default; sidecars, manifests), and the pipeline
    already reads several segments at once, so that HEAD was one more round trip per read, a third of a batch's
    requests to the store: without it, a read is the GET alone. FileNotFoundError if there is no such object."""
    if _takes_max_concurrency(type(fs)):
        return fs.cat_file(path, max_concurrency=1)
    return fs.cat_file(path)


@functools.cache
def _takes_max_concurrency(fs_class: type) -> bool:
    """Whether the filesystem's async ``_cat_file`` takes ``max_concurrency`` (s3fs 2026.9's does)."""
    try:
        return "max_concurrency" in inspect.signature(fs_class._cat_file).parameters
    except (AttributeError, TypeError, ValueError):
        return False


def _sidecar_text(key: str, checksum: str, attributes: dict[str, str] | None) -> bytes:
    """``<sha256>  <file name>`` (``sha256sum`` format), then one ``# <name>: <value>`` line per attribute."""
    lines = [f"{checksum}  {key.rsplit('/', 1)[-1]}\n"]
    for name, value in sorted((attributes or {}).items()):
        if not _ATTRIBUTE_NAME.fullmatch(name) or "\n" in str(value) or "\r" in str(value):
            raise StorageError(f"sidecar attribute {name!r} of {key}: a name of letters, digits and _ and a "
                               "one-line value are required")
        lines.append(f"# {name}: {value}\n")
    return "".join(lines).encode()


def _is_hidden_name(name: str) -> bool:
    """Sidecars and in-flight temporaries are not objects of their own."""
    return name.endswith(CHECKSUM_SUFFIX) or (name.startswith(".") and name.endswith(".tmp"))


class ObjectStore:
    """A thin typed wrapper over an fsspec filesystem rooted at a URL. Keys are ``/``-separated, relative."""

    def __init__(self, fs: Any, root: str, url: str, *, local: bool):
        self.fs = fs
        self.root = root.rstrip("/") if root != "/" else root
        self.url = url
        self.local = local
        # s3fs: some requests are sent through its client directly, where its own calls would send more of them
        self.s3 = hasattr(fs, "call_s3")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_url(cls, url: str, **storage_options: Any) -> "ObjectStore":
        """Open the store at ``url``. Options go to the fsspec filesystem (s3fs: endpoint_url, key, secret...)."""
        if not url:
            raise ConfigError("store URL is empty")
        if "://" not in url or url.startswith("file://"):
            path = url[len("file://"):] if url.startswith("file://") else url
            root = os.path.abspath(os.path.expanduser(path))
            try:
                os.makedirs(root, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"cannot create store directory {root}: {e}") from None
            import fsspec

            return cls(fsspec.filesystem("file"), root, "file://" + root, local=True)
        import fsspec.core

        try:
            fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except (ImportError, ValueError, TypeError) as e:
            raise ConfigError(f"cannot open store {url!r}: {e}") from None
        protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        if protocol == "memory" and not root.startswith("/"):
            root = "/" + root
        return cls(fs, root or "", url.rstrip("/"), local=False)

    # ------------------------------------------------------------------ paths
    def _path(self, key: str) -> str:
        _check_key(key)
        if self.local:
            return os.path.join(self.root, *key.split("/"))
        return f"{self.root}/{key}" if self.root else key

    def url_for(self, key: str = "") -> str:
        """A URL other tools (Delta, Spark) can open for ``key``; the store root when ``key`` is empty."""
        if not key:
            return self.url
        return f"{self.url}/{_check_key(key)}"

    def _key_of(self, path: str) -> str:
        if self.local:
            rel = os.path.relpath(path, self.root)
            return rel.replace(os.sep, "/")
        path = path.lstrip("/") if not self.root.startswith("/") else path
        root = self.root.lstrip("/") if not self.root.startswith("/") else self.root
        return path[len(root):].lstrip("/") if root else path

    def _invalidate(self, path: str | None = None) -> None:
        # Listings and infos are cached per process by fsspec; another process (agent vs pipeline) writes too.
        if not self.local:
            try:
                self.fs.invalidate_cache(path)
            except Exception:  # noqa: BLE001 - caching is an optimisation; never fail an operation on it
                pass

    # ------------------------------------------------------------------ low-level writes
    def _write_atomic_local(self, key: str, chunks: Iterator[bytes]) -> tuple[str, str, int]:
        """Write chunks to a temporary file beside the target, fsync, rename. Returns (sha256, md5, size)."""
        dst = self._path(key)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.{uuid.uuid4().hex}.tmp")
        sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
        try:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    sha.update(chunk)
                    md5.update(chunk)
                    size += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dst)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(os.path.dirname(dst))
        return sha.hexdigest(), md5.hexdigest(), size

    def _write(self, key: str, chunks: Iterator[bytes]) -> tuple[str, str, int]:
        """Write an object (atomic on local and S3: S3 publishes an object only when its PUT completes)."""
        if self.local:
            return self._write_atomic_local(key, chunks)
        path = self._path(key)
        sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
        with self.fs.open(path, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                sha.update(chunk)
                md5.update(chunk)
                size += len(chunk)
        self._invalidate(path)
        return sha.hexdigest(), md5.hexdigest(), size

    def _write_sidecar(self, key: str, checksum: str, attributes: dict[str, str] | None = None) -> None:
        self._write(key + CHECKSUM_SUFFIX, iter([_sidecar_text(key, checksum, attributes)]))

    def sidecar(self, key: str) -> tuple[str | None, dict[str, str]]:
        """(checksum, attributes) of ``key``'s sidecar; (None, {}) when it has none (not complete)."""
        try:
            text = self._read_all(key + CHECKSUM_SUFFIX).decode("ascii", "replace")
        except ObjectNotFound:
            return None, {}
        value = text.split()[0].lower() if text.split() else ""
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise VerificationError(f"{self.url_for(key + CHECKSUM_SUFFIX)}: not a sha256 sidecar")
        attributes = {}
        for line in text.splitlines()[1:]:
            name, sep, attr = line[1:].partition(":") if line.startswith("#") else ("", "", "")
            if sep and _ATTRIBUTE_NAME.fullmatch(name.strip()):
                attributes[name.strip()] = attr.strip()
        return value, attributes

    def _read_all(self, key: str) -> bytes:
        path = self._path(key)
        try:
            if self.local:
                with open(path, "rb") as f:
                    return f.read()
            self._invalidate(path)
            return read_object(self.fs, path)
        except FileNotFoundError:
            raise ObjectNotFound(f"no object {self.url_for(key)}") from None

    def _remote_sha256(self, key: str) -> str:
        h = hashlib.sha256()
        with self.open(key) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    # ------------------------------------------------------------------ public API
    def put_file(self, local_path: str | Path, key: str, *, checksum: str,
                 attributes: dict[str, str] | None = None) -> ObjectInfo:
        """Upload a local file as ``key`` with its sha256 ``checksum`` (and sidecar ``attributes``), then verify it
        in the store.

        Raises VerificationError if the local bytes do not hash to ``checksum`` (the file changed since it was
        hashed) or if the stored object does not match; the sidecar is written only after the data is verified.
        """
        checksum = checksum.lower()

        def chunks() -> Iterator[bytes]:
            with open(local_path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    yield chunk

        return self._put(key, chunks(), checksum, what=str(local_path), attributes=attributes)

    def put_bytes(self, key: str, data: bytes, *, checksum: str | None = None) -> ObjectInfo:
        """Store ``data`` as ``key``. With ``checksum`` (sha256 hex), verify and write the sidecar too."""
        if checksum is None:
            self._delete_quiet(_check_key(key) + CHECKSUM_SUFFIX)  # a stale sidecar would describe other bytes
            self._write(key, iter([bytes(data)]))
            return ObjectInfo(key, len(data), None)
        return self._put(key, iter([bytes(data)]), checksum.lower(), what="bytes")

    def _put(self, key: str, chunks: Iterator[bytes], checksum: str, *, what: str,
             attributes: dict[str, str] | None = None) -> ObjectInfo:
        _check_key(key)
        _sidecar_text(key, checksum, attributes)    # bad attributes fail before anything is written
        # Un-commit first: until the new sidecar is written, the old one would vouch for bytes being replaced.
        self._delete_quiet(key + CHECKSUM_SUFFIX)
        sha, md5, size = self._write(key, chunks)
        if sha != checksum:
            self._delete_quiet(key)
            raise VerificationError(f"{what}: content hashes to {sha}, not the expected {checksum}; "
                                    f"not stored as {self.url_for(key)}")
        self._verify_content(key, size, checksum, md5)
        self._write_sidecar(key, checksum, attributes)
        return ObjectInfo(key, size, checksum, dict(attributes or {}))

    def _verify_content(self, key: str, size: int, checksum: str, md5: str | None) -> None:
        stat = self._stat(key)      # size, and on S3 the ETag: one request
        got_size = int(stat["size"])
        if got_size != size:
            raise VerificationError(f"{self.url_for(key)}: stored size {got_size}, uploaded {size}")
        if md5 is not None and _etag_of(stat) == md5:
            # A single-part S3 object's ETag is the MD5 the server computed over what it received. Any other
            # ETag (multipart upload, SSE-KMS) proves nothing either way: read the object back instead.
            return
        got = self._remote_sha256(key)
        if got != checksum:
            raise VerificationError(f"{self.url_for(key)}: stored content hashes to {got}, expected {checksum}")

    def verify(self, key: str, *, checksum: str | None = None, size: int | None = None) -> ObjectInfo:
        """Re-read ``key`` and check it against its sidecar (and the given checksum/size). Returns its info."""
        info = self.info(key)
        expected = (checksum or info.checksum or "").lower() or None
        if expected is None:
            raise VerificationError(f"{self.url_for(key)}: no checksum to verify against (no sidecar)")
        if info.checksum is not None and checksum is not None and info.checksum != checksum.lower():
            raise VerificationError(f"{self.url_for(key)}: sidecar says {info.checksum}, expected {checksum}")
        if size is not None and info.size != size:
            raise VerificationError(f"{self.url_for(key)}: stored size {info.size}, expected {size}")
        got = self._remote_sha256(key)
        if got != expected:
            raise VerificationError(f"{self.url_for(key)}: stored content hashes to {got}, expected {expected}")
        return info

    def get_bytes(self, key: str) -> bytes:
        return self._read_all(key)

    def open(self, key: str, mode: str = "rb") -> IO[bytes]:
        """A binary file object for reading ``key`` (writes go through put_file/put_bytes)."""
        if mode != "rb":
            raise StorageError("ObjectStore.open is read-only; use put_file or put_bytes to write")
        path = self._path(key)
        try:
            if self.local:
                return open(path, "rb")
            self._invalidate(path)
            return self.fs.open(path, "rb")
        except FileNotFoundError:
            raise ObjectNotFound(f"no object {self.url_for(key)}") from None

    def _size(self, key: str) -> int:
        return int(self._stat(key)["size"])

    def _stat(self, key: str) -> dict:
        """What the store says of ``key`` now (``size``; ``ETag`` on S3); ObjectNotFound if it is absent."""
        path = self._path(key)
        try:
            if self.local:
                return {"size": os.stat(path).st_size}
            if self.s3:
                # the HEAD alone: s3fs's info() follows a missing key with a listing, to tell a "directory" from
                # nothing, and no key of the layout is one (a missing segment's copy cost two requests)
                bucket, name, version = self.fs.split_path(path)
                head = self.fs.call_s3("head_object", self.fs.kwargs, Bucket=bucket, Key=name,
                                       **({"VersionId": version} if version else {}))
                return {"size": head["ContentLength"], "ETag": head.get("ETag")}
            self._invalidate(path)
            info = self.fs.info(path)
        except FileNotFoundError:
            raise ObjectNotFound(f"no object {self.url_for(key)}") from None
        if info.get("type") == "directory":
            raise ObjectNotFound(f"{self.url_for(key)} is a prefix, not an object")
        return info

    def exists(self, key: str) -> bool:
        try:
            self._size(key)
            return True
        except ObjectNotFound:
            return False

    def info(self, key: str) -> ObjectInfo:
        """Size and sidecar checksum (None if the object has no sidecar). ObjectNotFound if absent."""
        size = self._size(key)
        checksum, attributes = self.sidecar(key)
        return ObjectInfo(key, size, checksum, attributes)

    def committed_at(self, key: str) -> float:
        """When ``key`` became complete (its sidecar was written; unix time by the store's clock)."""
        path = self._path(key + CHECKSUM_SUFFIX)
        try:
            if self.local:
                return os.stat(path).st_mtime
            self._invalidate(path)
            return self.fs.modified(path).timestamp()
        except FileNotFoundError:
            raise ObjectNotFound(f"no complete object {self.url_for(key)} (no sidecar)") from None

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys starting with ``prefix`` (sidecars and in-flight temporaries excluded)."""
        return sorted(key for key in self._listing(prefix, details=False)
                      if not _is_hidden_name(key.rsplit("/", 1)[-1]))

    def listing(self, prefix: str = "") -> dict[str, Listed]:
        """``list`` with what one listing tells of each object: its size and when its sidecar was written (None:
        no sidecar, not complete), without a request per object."""
        found = self._listing(prefix, details=True)
        return {key: Listed(size, found[key + CHECKSUM_SUFFIX][1] if key + CHECKSUM_SUFFIX in found else None, etag)
                for key, (size, _, etag) in sorted(found.items()) if not _is_hidden_name(key.rsplit("/", 1)[-1])}

    def _listing(self, prefix: str, *, details: bool) -> dict[str, tuple[int, float, str | None]]:
        """{key: (size, modified unix time, ETag)} of every file under ``prefix``, sidecars and temporaries
        included; without ``details`` a local store reads no file's metadata (then 0, 0.0, None)."""
        if prefix.startswith("/") or ".." in prefix.split("/"):
            raise StorageError(f"bad prefix {prefix!r}")
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        out: dict[str, tuple[int, float]] = {}
        if self.local:
            top = os.path.join(self.root, *base.split("/")) if base else self.root
            for dirpath, _dirs, files in os.walk(top):
                for name in files:
                    path = os.path.join(dirpath, name)
                    key = self._key_of(path)
                    if not key.startswith(prefix):
                        continue
                    if not details:
                        out[key] = (0, 0.0, None)
                        continue
                    try:
                        st = os.stat(path)
                    except FileNotFoundError:
                        continue        # removed since the walk listed it
                    out[key] = (st.st_size, st.st_mtime, None)
        else:
            top = f"{self.root}/{base}" if base else self.root
            self._invalidate(top)
            try:
                found = self.fs.find(top, detail=True)
            except FileNotFoundError:
                found = {}
            for path, meta in found.items():
                # s3fs reports an empty "directory" (S3 has none; some servers keep markers) as an entry
                if meta.get("type") == "directory":
                    continue
                key = self._key_of(path)
                if key and key.startswith(prefix):
                    out[key] = (int(meta.get("size") or 0), _modified(meta), _etag_of(meta))
        return out

    def delete(self, key: str) -> None:
        """Remove ``key`` and its sidecar (sidecar first, so the object is never seen complete but partial)."""
        for k in (key + CHECKSUM_SUFFIX, key):
            self._delete_quiet(k)

    def delete_many(self, keys: list[str]) -> None:
        """``delete`` of every key, in two requests on S3 (however many keys: DeleteObjects takes 1,000 at once):
        first all their sidecars, then the objects, so none is ever seen complete but partial."""
        for batch in ([k + CHECKSUM_SUFFIX for k in keys], list(keys)):
            if self.local or len(batch) < 2:
                for key in batch:
                    self._delete_quiet(key)
                continue
            paths = [self._path(key) for key in batch]
            try:
                self.fs.rm(paths)
            except FileNotFoundError:    # a key already gone (S3 does not mind; other filesystems stop there)
                for key in batch:
                    self._delete_quiet(key)
            for path in paths:
                self._invalidate(path)

    def _delete_quiet(self, key: str) -> None:
        path = self._path(key)
        try:
            if self.local:
                os.unlink(path)
            else:
                self.fs.rm_file(path)
                self._invalidate(path)
        except FileNotFoundError:
            pass

    def move(self, src: str, dst: str, *, keep_source: bool = False,
             sidecar: tuple[str, dict[str, str]] | None = None,
             listed: tuple[int, str | None] | None = None) -> ObjectInfo:
        """Move ``src`` to ``dst``: copy, verify, write dst's sidecar, then delete src (``keep_source``: the caller
        deletes it, e.g. many at once with ``delete_many`` once every copy is complete). ``sidecar``: src's
        (checksum, attributes) as the caller read them before, then not read again. ``listed``: src's (size,
        ETag) as a listing gave them (``Listed``), then not asked again: the copy must have that ETag, or else
        that size and the checksum, so a source replaced since the listing fails the move.

        At every instant at least one of the two is complete, and a retry after a crash finishes the move.
        """
        _check_key(src), _check_key(dst)
        if listed is not None:
            size, src_etag = listed
        else:
            try:
                stat = self._stat(src)      # size, and on S3 the ETag the copy is checked against: one request
            except ObjectNotFound:
                return self._moved_before(src, dst)
            size, src_etag = int(stat["size"]), _etag_of(stat)
        checksum, attributes = sidecar or self.sidecar(src)
        checksum = checksum or self._remote_sha256(src)
        try:
            copied_etag = self._copy(src, dst, size)
        except FileNotFoundError:
            return self._moved_before(src, dst)
        self._verify_copy(src, dst, size, checksum, src_etag, copied_etag)
        self._write_sidecar(dst, checksum, attributes)
        if not keep_source:
            self.delete(src)
        return ObjectInfo(dst, size, checksum, attributes)

    def _moved_before(self, src: str, dst: str) -> ObjectInfo:
        """``dst``'s info when ``src`` is gone because an earlier, interrupted move finished copying it;
        ObjectNotFound for ``src`` when ``dst`` is not complete either."""
        dst_info = self.info(dst)
        if dst_info.checksum is None:
            raise ObjectNotFound(f"no object {self.url_for(src)}") from None
        return dst_info

    def _copy(self, src: str, dst: str, size: int) -> str | None:
        """Copy ``src`` (``size`` bytes) to ``dst``; returns the copy's ETag when the store said it while copying
        (S3's CopyObject, one request: s3fs's ``cp_file`` would first HEAD the source again)."""
        s, d = self._path(src), self._path(dst)
        if self.local:
            os.makedirs(os.path.dirname(d), exist_ok=True)
            tmp = os.path.join(os.path.dirname(d), f".{os.path.basename(d)}.{uuid.uuid4().hex}.tmp")
            try:
                os.link(s, tmp)  # same bytes by construction, no copy
            except OSError:
                shutil.copyfile(s, tmp)
            os.replace(tmp, d)
            _fsync_dir(os.path.dirname(d))
        elif self.s3 and size <= _SINGLE_COPY_MAX:
            (sb, sk, _), (db, dk, _) = self.fs.split_path(s), self.fs.split_path(d)
            out = self.fs.call_s3("copy_object", Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk})
            self._invalidate(d)
            return _etag_of(out.get("CopyObjectResult") or {})
        else:
            self.fs.cp_file(s, d)      # one object: no path expansion (its listings and HEADs) as copy() does
            self._invalidate(d)
        return None

    def _verify_copy(self, src: str, dst: str, size: int, checksum: str, src_etag: str | None,
                     copied_etag: str | None) -> None:
        """The copy ``dst`` has ``src``'s bytes. A single-part object's ETag is its content's MD5, which a
        server-side copy keeps: the copy's ETag as the copy request returned it (``copied_etag``) equal to the
        one ``src`` had before the copy says so (same MD5, same bytes, same size). Otherwise: the copy's size and
        ETag from a HEAD, else its SHA-256 read back."""
        if _is_md5(src_etag) and copied_etag == src_etag:
            return
        stat = self._stat(dst)      # size and ETag in one request
        got = int(stat["size"])
        if got != size:
            raise VerificationError(f"{self.url_for(dst)}: copied size {got}, source {size}")
        if self.local and os.path.samefile(self._path(src), self._path(dst)):
            return
        if _is_md5(src_etag) and src_etag == _etag_of(stat):
            return
        got_sha = self._remote_sha256(dst)
        if got_sha != checksum:
            raise VerificationError(f"{self.url_for(dst)}: copy hashes to {got_sha}, source {checksum}")

    def quarantine(self, src: str, dst: str, reason: dict[str, Any]) -> ObjectInfo:
        """Move ``src`` to the quarantine key ``dst`` and write ``<dst>.reason.json`` (reason first)."""
        self.put_bytes(Layout.reason(dst), json.dumps(reason, sort_keys=True, indent=2).encode())
        return self.move(src, dst)

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    def put_json(self, key: str, value: Any) -> ObjectInfo:
        return self.put_bytes(key, json.dumps(value, sort_keys=True, indent=2).encode())

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"


def _is_md5(etag: str | None) -> bool:
    """An ETag that is a content MD5 (a single-part upload's; a multipart upload's ends in ``-<parts>``)."""
    return etag is not None and re.fullmatch(r"[0-9a-f]{32}", etag) is not None


def _etag_of(info: dict) -> str | None:
    """The ETag in an object's info, unquoted and lower-case; None without one."""
    raw = info.get("ETag")
    return raw.strip('"').lower() if isinstance(raw, str) else None


def _modified(meta: dict) -> float:
    """Unix time of a listed object's last modification (S3's ``LastModified``; ``mtime`` or ``created``
    elsewhere); 0.0 where the listing says nothing."""
    value = meta.get("LastModified", meta.get("mtime", meta.get("created")))
    if hasattr(value, "timestamp"):
        return value.timestamp()
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _fsync_dir(path: str) -> None:
    """Make a rename durable (POSIX); silently skipped where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
