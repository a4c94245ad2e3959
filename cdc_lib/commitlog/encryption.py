"""Transparent data encryption of commit-log sections (Cassandra 3.11+, format reference §6).

An encrypted segment's header names the cipher (``encCipher``), the key alias (``encKeyAlias``) and the
segment's IV (``encIV``, hex). Each section payload (after the 12-byte section header, whose i32 U is the total
plaintext length) is a run of blocks, one per ``chunk_length_kb`` (default 64 KiB) slice of the entry bytes:

    i32 E                 ciphertext length (Cipher.getOutputSize of the compressed block)
    i32 P                 length of the compressed block that was encrypted (without padding)
    bytes(E)              AES/CBC/PKCS5Padding ciphertext of:
                              i32 n (big-endian) = uncompressed length of the slice
                              LZ4Compressor output: u32 n (little-endian) + raw LZ4 block

Every block is a separate ``doFinal`` on one Java Cipher, so every block starts again from the segment IV.
An empty section (U = 0, written when a segment closes) has no blocks at all.

A section cut by the end of the file (a torn tail) is read by ``decrypt_section_prefix``: its whole blocks, then the
whole AES blocks of the cut one (CBC decrypts each 16 bytes from the ciphertext before them) through LZ4's prefix
decoder.

Keys come from the keystore Cassandra's ``JKSKeyProvider`` reads (JCEKS by default, see ``EncryptionKeys``).
Failures while reading a section raise ``EncryptionError`` whose position is relative to the payload start.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Mapping

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from cdc_lib.errors import CompressionError, ConfigError, EncryptionError

from .compression import LZ4Compressor, lz4_block_prefix

SUPPORTED_CIPHER = "AES/CBC/PKCS5Padding"
AES_BLOCK = 16
IV_LENGTH = 16  # TransparentDataEncryptionOptions.iv_length default; AES/CBC needs exactly one block
DEFAULT_CHUNK_LENGTH = 64 * 1024  # chunk_length_kb default 64
AES_KEY_LENGTHS = (16, 24, 32)

PARAM_CIPHER = "encCipher"
PARAM_KEY_ALIAS = "encKeyAlias"
PARAM_IV = "encIV"

_BLOCK_HEADER = struct.Struct(">ii")
_BE_I32 = struct.Struct(">i")

# EncryptionContext always builds LZ4Compressor with empty options: the fast compressor.
_LZ4 = LZ4Compressor()


class EncryptionKeys:
    """Secret AES keys by alias, as Cassandra's key provider would hand them out."""

    def __init__(self, keys: Mapping[str, bytes] | None = None, *, source: str = "keys",
                 undecryptable: Mapping[str, str] | None = None):
        self._keys = {alias: bytes(k) for alias, k in (keys or {}).items()}
        self._undecryptable = dict(undecryptable or {})  # alias -> why its key could not be decrypted
        self.source = source
        for alias, key in self._keys.items():
            if len(key) not in AES_KEY_LENGTHS:
                raise ConfigError(f"{source}: key {alias!r} is {len(key)} bytes; AES needs 16, 24 or 32")

    @property
    def aliases(self) -> list[str]:
        return sorted(self._keys)

    def key(self, alias: str) -> bytes:
        """The key stored under ``alias``; ``EncryptionError`` naming the alias if there is none."""
        # JCEKS and PKCS12 store aliases lower-cased, and Cassandra lower-cases the alias it asks a JCEKS store
        # for, so an exact match is tried first and then a case-insensitive one.
        for candidate in (alias, *(a for a in (*self._keys, *self._undecryptable)
                                   if a != alias and a.lower() == alias.lower())):
            if candidate in self._keys:
                return self._keys[candidate]
            if candidate in self._undecryptable:
                raise EncryptionError(f"key {alias!r} in {self.source} cannot be decrypted: "
                                      f"{self._undecryptable[candidate]}")
        known = ", ".join(repr(a) for a in self.aliases) or "none"
        raise EncryptionError(f"no secret key {alias!r} in {self.source} (secret keys: {known})")

    @classmethod
    def from_hex(cls, spec: str) -> "EncryptionKeys":
        """Keys from ``"ALIAS=HEX[,ALIAS=HEX...]"``; the alias may itself contain ':' (e.g. ``testing:1=00ff...``)."""
        keys: dict[str, bytes] = {}
        for item in (part.strip() for part in spec.split(",")):
            if not item:
                continue
            alias, sep, hexkey = item.rpartition("=")
            if not sep or not alias.strip():
                raise ConfigError(f"encryption key {item!r} is not ALIAS=HEX")
            try:
                key = bytes.fromhex(hexkey.strip())
            except ValueError:
                raise ConfigError(f"encryption key for {alias.strip()!r} is not hexadecimal") from None
            if len(key) not in AES_KEY_LENGTHS:
                raise ConfigError(f"encryption key for {alias.strip()!r} is {len(key)} bytes; "
                                  f"AES needs 16, 24 or 32")
            keys[alias.strip()] = key
        if not keys:
            raise ConfigError("no encryption keys given")
        return cls(keys, source="hex keys")

    @classmethod
    def from_keystore(cls, path, password: str, key_password: str | None = None) -> "EncryptionKeys":
        """Secret keys of a Java keystore: JCEKS (Cassandra's default ``store_type``), PKCS12, JKS.

        ``key_password`` defaults to the store password, as in Cassandra's JKSKeyProvider. A wrong store
        password (or a file that is no keystore) is a ``ConfigError``; a key that the key password does not
        decrypt raises ``EncryptionError`` when it is asked for.
        """
        import jks  # pyjks; imported here so that reading unencrypted logs does not need it

        path = Path(path)
        try:
            head = path.read_bytes()[:4]
        except OSError as exc:
            raise ConfigError(f"cannot read keystore {path}: {exc.strerror or exc}") from None
        if head[:1] == b"\x30":  # DER SEQUENCE: PKCS12 (keytool's default store type since JDK 9)
            keys, undecryptable = _pkcs12_secret_keys(path, password, key_password)
            return cls(keys, source=f"keystore {path}", undecryptable=undecryptable)
        try:
            store = jks.KeyStore.load(str(path), password, try_decrypt_keys=False)
        except jks.util.KeystoreSignatureException:
            raise ConfigError(f"keystore {path}: wrong keystore password (integrity check failed)") from None
        except (jks.util.BadKeystoreFormatException, jks.util.UnexpectedAlgorithmException,
                jks.util.KeystoreException, ValueError, struct.error, EOFError) as exc:
            raise ConfigError(f"keystore {path} cannot be read as JCEKS/JKS: {exc}") from None
        keys: dict[str, bytes] = {}
        undecryptable: dict[str, str] = {}
        secret_password = password if not key_password else key_password
        for alias, entry in store.secret_keys.items():
            try:
                if not entry.is_decrypted():
                    entry.decrypt(secret_password)
                key = bytes(entry.key)
            except Exception as exc:  # pyjks raises DecryptionFailureException/ValueError on a wrong password
                undecryptable[alias] = f"wrong key password ({type(exc).__name__})"
                continue
            if len(key) not in AES_KEY_LENGTHS or str(entry.algorithm).upper() != "AES":
                undecryptable[alias] = f"not an AES key ({entry.algorithm}, {len(key)} bytes)"
                continue
            keys[alias] = key
        return cls(keys, source=f"keystore {path}", undecryptable=undecryptable)


# --- PKCS12 secret keys ----------------------------------------------------------------------------------------
# keytool -genseckey into a PKCS12 store (JDK 9+ default) writes each secret key as a SecretBag holding a
# PKCS#8-shrouded bag: PBES2 (PBKDF2-HMAC + AES-CBC) over SEQUENCE { INTEGER 0, AlgorithmIdentifier, OCTET STRING
# key }. Only the few DER shapes needed here are parsed.

_OID_DATA = "1.2.840.113549.1.7.1"
_OID_SECRET_BAG = "1.2.840.113549.1.12.10.1.5"
_OID_SHROUDED_KEY_BAG = "1.2.840.113549.1.12.10.1.2"
_OID_FRIENDLY_NAME = "1.2.840.113549.1.9.20"
_OID_PBES2 = "1.2.840.113549.1.5.13"
_OID_PBKDF2 = "1.2.840.113549.1.5.12"
_PRF = {"1.2.840.113549.2.7": "SHA1", "1.2.840.113549.2.9": "SHA256", "1.2.840.113549.2.10": "SHA384",
        "1.2.840.113549.2.11": "SHA512", "1.2.840.113549.2.8": "SHA224"}
_AES_CBC = {"2.16.840.1.101.3.4.1.2": 16, "2.16.840.1.101.3.4.1.22": 24, "2.16.840.1.101.3.4.1.42": 32}


class _Der(Exception):
    pass


class _UnsupportedProtection(Exception):
    pass


def _tlv(buf: bytes, pos: int) -> tuple[int, bytes, int]:
    """(tag, content, next position) of the DER element at ``pos``."""
    if pos + 2 > len(buf):
        raise _Der("truncated element")
    tag, length = buf[pos], buf[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        if not 1 <= n <= 4 or pos + n > len(buf):
            raise _Der("bad length")
        length = int.from_bytes(buf[pos:pos + n], "big")
        pos += n
    if pos + length > len(buf):
        raise _Der("element runs past its container")
    return tag, buf[pos:pos + length], pos + length


def _children(content: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos < len(content):
        tag, value, pos = _tlv(content, pos)
        out.append((tag, value))
    return out


def _oid(value: bytes) -> str:
    parts, acc = [], 0
    for b in value:
        acc = (acc << 7) | (b & 0x7F)
        if not b & 0x80:
            parts.append(acc)
            acc = 0
    first = min(parts[0] // 40, 2) if parts else 0
    return ".".join(str(p) for p in [first, parts[0] - 40 * first, *parts[1:]]) if parts else ""


def _expect(element: tuple[int, bytes], tag: int, what: str) -> bytes:
    if element[0] != tag:
        raise _Der(f"{what}: expected tag {tag:#x}, found {element[0]:#x}")
    return element[1]


def _pbes2_decrypt(algorithm: list[tuple[int, bytes]], ciphertext: bytes, password: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

    oid = _oid(_expect(algorithm[0], 0x06, "algorithm"))
    if oid != _OID_PBES2:
        raise _UnsupportedProtection(f"key protection {oid} is not PBES2 (JDK 8's PBEWithSHA1AndDESede is "
                                     f"not supported)")
    kdf, scheme = (_children(_expect(x, 0x30, "PBES2 parameter")) for x in _children(algorithm[1][1]))
    if _oid(_expect(kdf[0], 0x06, "kdf")) != _OID_PBKDF2:
        raise _UnsupportedProtection("PBES2 key derivation is not PBKDF2")
    kdf_params = _children(_expect(kdf[1], 0x30, "PBKDF2 parameters"))
    salt = _expect(kdf_params[0], 0x04, "salt")
    iterations = int.from_bytes(_expect(kdf_params[1], 0x02, "iterations"), "big")
    prf = "SHA1"
    for tag, value in kdf_params[2:]:
        if tag == 0x30:
            prf_oid = _oid(_expect(_children(value)[0], 0x06, "prf"))
            if prf_oid not in _PRF:
                raise _UnsupportedProtection(f"unsupported PBKDF2 PRF {prf_oid}")
            prf = _PRF[prf_oid]
    scheme_oid = _oid(_expect(scheme[0], 0x06, "encryption scheme"))
    if scheme_oid not in _AES_CBC:
        raise _UnsupportedProtection(f"unsupported PBES2 cipher {scheme_oid}")
    iv = _expect(scheme[1], 0x04, "iv")
    # Java's PBEKeySpec feeds PBKDF2 the password's UTF-8 bytes.
    wrapping_key = PBKDF2HMAC(getattr(hashes, prf)(), _AES_CBC[scheme_oid], salt, iterations).derive(
        password.encode("utf-8"))
    decryptor = Cipher(algorithms.AES(wrapping_key), modes.CBC(iv)).decryptor()
    padded = decryptor.update(ciphertext) + decryptor.finalize()
    n = padded[-1] if padded else 0
    if not 1 <= n <= AES_BLOCK or padded[-n:] != bytes([n]) * n:
        raise ValueError("bad padding")
    return padded[:-n]


def _pkcs12_secret_keys(path: Path, password: str, key_password: str | None
                        ) -> tuple[dict[str, bytes], dict[str, str]]:
    from cryptography.hazmat.primitives.serialization import pkcs12

    data = path.read_bytes()
    try:
        # Verifies the store's integrity MAC with the store password (the secret bags themselves are ignored).
        pkcs12.load_key_and_certificates(data, password.encode("utf-8"))
    except ValueError:
        raise ConfigError(f"keystore {path}: wrong keystore password or damaged PKCS12 file") from None
    keys: dict[str, bytes] = {}
    undecryptable: dict[str, str] = {}
    try:
        pfx = _children(_expect(_tlv(data, 0)[:2], 0x30, "PFX"))
        auth_safe = _children(_expect(pfx[1], 0x30, "authSafe"))
        if _oid(_expect(auth_safe[0], 0x06, "authSafe type")) != _OID_DATA:
            raise _Der("authSafe is not id-data (public-key integrity mode is not supported)")
        safes = _expect(_children(_expect(auth_safe[1], 0xA0, "authSafe content"))[0], 0x04, "authSafe data")
        for content_info in _children(_expect(_tlv(safes, 0)[:2], 0x30, "AuthenticatedSafe")):
            info = _children(_expect(content_info, 0x30, "ContentInfo"))
            if _oid(_expect(info[0], 0x06, "ContentInfo type")) != _OID_DATA:
                continue  # encryptedData holds certificates, never the secret keys keytool writes
            bags = _expect(_children(_expect(info[1], 0xA0, "content"))[0], 0x04, "SafeContents")
            for bag in _children(_expect(_tlv(bags, 0)[:2], 0x30, "SafeContents")):
                fields = _children(_expect(bag, 0x30, "SafeBag"))
                if _oid(_expect(fields[0], 0x06, "bagId")) != _OID_SECRET_BAG:
                    continue
                alias = None
                for attribute in _children(_expect(fields[2], 0x31, "attributes")) if len(fields) > 2 else []:
                    attr = _children(_expect(attribute, 0x30, "attribute"))
                    if _oid(attr[0][1]) == _OID_FRIENDLY_NAME:
                        alias = _expect(_children(attr[1][1])[0], 0x1E, "friendlyName").decode("utf-16-be")
                secret_bag = _children(_expect(_children(_expect(fields[1], 0xA0, "bagValue"))[0], 0x30,
                                               "SecretBag"))
                if alias is None or _oid(secret_bag[0][1]) != _OID_SHROUDED_KEY_BAG:
                    continue
                shrouded = _expect(_children(_expect(secret_bag[1], 0xA0, "secretValue"))[0], 0x04, "secret")
                epki = _children(_expect(_tlv(shrouded, 0)[:2], 0x30, "EncryptedPrivateKeyInfo"))
                algorithm = _children(_expect(epki[0], 0x30, "algorithm"))
                encrypted = _expect(epki[1], 0x04, "encryptedData")
                try:
                    plain = _pbes2_decrypt(algorithm, encrypted, key_password or password)
                    # SEQUENCE { INTEGER 0, AlgorithmIdentifier, OCTET STRING key }
                    key_info = _children(_expect(_tlv(plain, 0)[:2], 0x30, "secret key info"))
                    key = _expect(key_info[-1], 0x04, "key")
                except _UnsupportedProtection as exc:
                    undecryptable[alias.lower()] = str(exc)
                    continue
                except (ValueError, _Der, IndexError):
                    # A wrong password gives bad padding or, rarely, padding that happens to fit and garbage.
                    undecryptable[alias.lower()] = "wrong key password (or damaged key entry)"
                    continue
                if len(key) not in AES_KEY_LENGTHS:
                    undecryptable[alias.lower()] = f"not an AES key ({len(key)} bytes)"
                    continue
                keys[alias.lower()] = key
    except (_Der, IndexError) as exc:
        raise ConfigError(f"keystore {path}: unexpected PKCS12 structure ({exc})") from None
    return keys, undecryptable


def new_encryption_params(alias: str, cipher: str = SUPPORTED_CIPHER) -> dict[str, str]:
    """Header parameters of a new encrypted segment, with a fresh random IV (lower-case hex, as Cassandra)."""
    if cipher != SUPPORTED_CIPHER:
        raise ConfigError(f"cipher {cipher!r} is not supported; Cassandra's commit log uses {SUPPORTED_CIPHER}")
    if not alias:
        raise ConfigError("an encryption key alias is required")
    return {PARAM_CIPHER: cipher, PARAM_KEY_ALIAS: alias, PARAM_IV: os.urandom(IV_LENGTH).hex()}


def is_encrypted(params: Mapping[str, object]) -> bool:
    """Cassandra's rule (EncryptionContext.createFromMap): both the key alias and the cipher are present."""
    return params.get(PARAM_KEY_ALIAS) is not None and params.get(PARAM_CIPHER) is not None


def _segment_cipher(params: Mapping[str, object], keys: EncryptionKeys) -> Cipher:
    cipher_name = params.get(PARAM_CIPHER)
    alias = params.get(PARAM_KEY_ALIAS)
    iv_hex = params.get(PARAM_IV)
    if cipher_name != SUPPORTED_CIPHER:
        raise EncryptionError(f"segment cipher {cipher_name!r} is not supported (only {SUPPORTED_CIPHER})")
    if not isinstance(alias, str) or not alias:
        raise EncryptionError(f"segment header has no key alias ({PARAM_KEY_ALIAS})")
    if not isinstance(iv_hex, str) or not iv_hex:
        raise EncryptionError(f"segment header has no IV ({PARAM_IV})")
    try:
        iv = bytes.fromhex(iv_hex)
    except ValueError:
        raise EncryptionError(f"segment IV {iv_hex!r} is not hexadecimal") from None
    if len(iv) != IV_LENGTH:
        raise EncryptionError(f"segment IV is {len(iv)} bytes; AES/CBC needs {IV_LENGTH}")
    return Cipher(algorithms.AES(keys.key(alias)), modes.CBC(iv))


def _unpad(padded: bytes, position: int) -> bytes:
    n = padded[-1] if padded else 0
    if not 1 <= n <= AES_BLOCK or padded[-n:] != bytes([n]) * n:
        raise EncryptionError("bad PKCS5 padding after decryption (wrong key, wrong IV or damaged block)",
                              position=position)
    return padded[:-n]


def _decrypt_block(cipher: Cipher, payload: memoryview, pos: int, room: int) -> tuple[bytes, int]:
    """The plaintext of the block at ``pos`` (at most ``room`` bytes) and the position after it."""
    if len(payload) - pos < _BLOCK_HEADER.size:
        raise EncryptionError(f"{len(payload) - pos} bytes left, too few for an encrypted block header",
                              position=pos)
    encrypted_length, compressed_length = _BLOCK_HEADER.unpack_from(payload, pos)
    body = pos + _BLOCK_HEADER.size
    if encrypted_length <= 0 or encrypted_length % AES_BLOCK:
        raise EncryptionError(f"encrypted block length {encrypted_length} is not a positive multiple of "
                              f"{AES_BLOCK}", position=pos)
    if body + encrypted_length > len(payload):
        raise EncryptionError(f"encrypted block of {encrypted_length} bytes runs past the section end "
                              f"({len(payload) - body} bytes left)", position=pos)
    # PKCS5 always pads 1..16 bytes, so the compressed length fixes the ciphertext length; the smallest
    # compressed block is 4 (BE length) + 4 (LE length) + 1 (empty LZ4 block) bytes.
    if compressed_length < 9 or (compressed_length // AES_BLOCK + 1) * AES_BLOCK != encrypted_length:
        raise EncryptionError(f"block lengths disagree: {compressed_length} compressed bytes cannot give "
                              f"{encrypted_length} encrypted bytes", position=pos)
    decryptor = cipher.decryptor()
    padded = decryptor.update(payload[body:body + encrypted_length]) + decryptor.finalize()
    compressed = _unpad(padded, pos)
    if len(compressed) != compressed_length:
        raise EncryptionError(f"block decrypted to {len(compressed)} bytes, header says {compressed_length}",
                              position=pos)
    (block_length,) = _BE_I32.unpack_from(compressed, 0)
    if block_length < 0 or block_length > room:
        raise EncryptionError(f"block of {block_length} plaintext bytes exceeds the {room} bytes left in the "
                              "section", position=pos)
    try:
        plain = _LZ4.decompress(compressed[4:], block_length)
    except CompressionError as exc:
        raise EncryptionError(f"decrypted block does not decompress: {exc.reason}", position=pos) from None
    return plain, body + encrypted_length


def decrypt_section(payload: bytes, uncompressed_length: int, params: Mapping[str, object],
                    keys: EncryptionKeys) -> bytes:
    """The U entry bytes of one encrypted section, from the payload after its 12-byte section header."""
    if uncompressed_length < 0:
        raise EncryptionError(f"impossible plaintext length {uncompressed_length}", position=0)
    if not payload:
        if uncompressed_length:
            raise EncryptionError(f"section states {uncompressed_length} plaintext bytes but has no blocks",
                                  position=0)
        return b""
    cipher = _segment_cipher(params, keys)
    payload = memoryview(payload)
    out = bytearray()
    pos = 0
    while pos < len(payload):
        plain, pos = _decrypt_block(cipher, payload, pos, uncompressed_length - len(out))
        out += plain
    if len(out) != uncompressed_length:
        raise EncryptionError(f"blocks hold {len(out)} plaintext bytes, section header says "
                              f"{uncompressed_length}", position=len(payload))
    return bytes(out)


def decrypt_section_prefix(payload: bytes, uncompressed_length: int, params: Mapping[str, object],
                           keys: EncryptionKeys) -> bytes:
    """The leading plaintext bytes that a section payload cut short still determines (at most U).

    Whole blocks are decrypted and checked as in ``decrypt_section``; of the cut block, the complete 16-byte
    cipher blocks are decrypted (without the padding, which is at its end) and their LZ4 prefix decoded. A block
    that fails its checks ends the prefix. ``EncryptionError`` only when the segment cannot be decrypted at all
    (no key, bad header parameters).
    """
    cipher = _segment_cipher(params, keys)
    payload = memoryview(payload)
    out = bytearray()
    pos = 0
    while pos + _BLOCK_HEADER.size <= len(payload) and len(out) < uncompressed_length:
        encrypted_length, compressed_length = _BLOCK_HEADER.unpack_from(payload, pos)
        body = pos + _BLOCK_HEADER.size
        if body + encrypted_length <= len(payload):
            try:
                plain, pos = _decrypt_block(cipher, payload, pos, uncompressed_length - len(out))
            except EncryptionError:
                break
            out += plain
            continue
        if compressed_length < 9:
            break
        whole = (len(payload) - body) // AES_BLOCK * AES_BLOCK
        compressed = cipher.decryptor().update(bytes(payload[body:body + whole]))[:compressed_length]
        if len(compressed) > 8:                       # BE length, LE length, then the LZ4 block
            (block_length,) = _BE_I32.unpack_from(compressed, 0)
            out += lz4_block_prefix(compressed[8:], min(block_length, uncompressed_length - len(out)))
        break
    return bytes(out[:uncompressed_length])


def encrypt_section(data: bytes, params: Mapping[str, object], keys: EncryptionKeys,
                    chunk_length: int = DEFAULT_CHUNK_LENGTH) -> bytes:
    """The payload EncryptedSegment writes after the section header for entry bytes ``data``."""
    if chunk_length <= 0:
        raise ConfigError(f"chunk length {chunk_length} must be positive")
    try:
        cipher = _segment_cipher(params, keys)
    except EncryptionError as exc:
        raise ConfigError(f"cannot encrypt: {exc.reason}") from None
    parts: list[bytes] = []
    data = memoryview(bytes(data))
    for start in range(0, len(data), chunk_length):
        chunk = data[start:start + chunk_length]
        compressed = _BE_I32.pack(len(chunk)) + _LZ4.compress(chunk)
        pad = AES_BLOCK - len(compressed) % AES_BLOCK
        encryptor = cipher.encryptor()
        ciphertext = encryptor.update(compressed + bytes([pad]) * pad) + encryptor.finalize()
        parts.append(_BLOCK_HEADER.pack(len(ciphertext), len(compressed)))
        parts.append(ciphertext)
    return b"".join(parts)


__all__ = (
    "EncryptionKeys", "decrypt_section", "encrypt_section", "new_encryption_params", "is_encrypted",
    "SUPPORTED_CIPHER", "DEFAULT_CHUNK_LENGTH",
)
