"""Encrypted commit-log sections (format reference §6) checked against the JDK itself.

The keystores are made with the JDK's ``keytool`` exactly as Cassandra's TDE documentation does, and a small
Java program uses ``java.security.KeyStore`` and ``javax.crypto.Cipher`` the way Cassandra's JKSKeyProvider and
EncryptionUtils do (one Cipher, one ``doFinal`` per block). Both tools come with the JDK the project requires;
if they are missing these tests fail rather than skip.
"""
from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_lib.commitlog.compression import LZ4Compressor
from cdc_lib.commitlog.encryption import (SUPPORTED_CIPHER, EncryptionKeys, decrypt_section, encrypt_section,
                                          is_encrypted, new_encryption_params)
from cdc_lib.errors import ConfigError, EncryptionError

STOREPASS = "cassandra"
ALIAS = "testing:1"
SIZES = (0, 1, 65535, 65536, 200000)
# Short-lived JVMs start (and compile the single-file programs) about twice as fast with these.
JVM_FAST_START = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

# Prints every key of a keystore (alias, algorithm, hex); loads the key of one alias the way JKSKeyProvider
# does (lower-cased alias, key password), and writes encrypted blocks the way EncryptionUtils.encryptAndWrite
# does: i32 getOutputSize, i32 plaintext length, then doFinal of ONE Cipher instance per block.
JAVA_TDE = r"""
import java.io.*;
import java.nio.ByteBuffer;
import java.nio.file.*;
import java.security.Key;
import java.security.KeyStore;
import javax.crypto.Cipher;
import javax.crypto.spec.IvParameterSpec;

public class Tde {
    public static void main(String[] a) throws Exception {
        KeyStore store = KeyStore.getInstance(a[1]);
        try (InputStream in = new FileInputStream(a[0])) { store.load(in, a[2].toCharArray()); }
        for (java.util.Enumeration<String> e = store.aliases(); e.hasMoreElements();) {
            String alias = e.nextElement();
            Key k = store.getKey(alias, a[3].toCharArray());
            StringBuilder hex = new StringBuilder();
            for (byte b : k.getEncoded()) hex.append(String.format("%02x", b));
            System.out.println(alias + " " + k.getAlgorithm() + " " + hex);
        }
        Key key = store.getKey(a[4].toLowerCase(), a[3].toCharArray());
        byte[] iv = new byte[a[5].length() / 2];
        for (int i = 0; i < iv.length; i++) iv[i] = (byte) Integer.parseInt(a[5].substring(2 * i, 2 * i + 2), 16);
        Cipher cipher = Cipher.getInstance("AES/CBC/PKCS5Padding");
        cipher.init(Cipher.ENCRYPT_MODE, key, new IvParameterSpec(iv));
        for (int f = 6; f + 1 < a.length; f += 2) {
            ByteBuffer blocks = ByteBuffer.wrap(Files.readAllBytes(Paths.get(a[f])));
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            while (blocks.hasRemaining()) {
                byte[] plain = new byte[blocks.getInt()];
                blocks.get(plain);
                byte[] enc = cipher.doFinal(plain);
                ByteBuffer header = ByteBuffer.allocate(8);
                header.putInt(cipher.getOutputSize(plain.length)).putInt(plain.length);
                out.write(header.array());
                out.write(enc);
            }
            Files.write(Paths.get(a[f + 1]), out.toByteArray());
        }
    }
}
"""


def _jdk_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} (JDK) is not on PATH; these tests need a JDK (OpenJDK 17)")
    return path


def _keytool_genseckey(path: Path, alias: str, keysize: int, storepass: str, keypass: str,
                       storetype: str = "jceks") -> None:
    subprocess.run([_jdk_tool("keytool"), *(f"-J{flag}" for flag in JVM_FAST_START), "-genseckey",
                    "-alias", alias, "-keyalg", "AES", "-keysize", str(keysize), "-storetype", storetype,
                    "-keystore", str(path), "-storepass", storepass, "-keypass", keypass],
                   check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def keystore(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tde") / "commitlog.jceks"
    _keytool_genseckey(path, ALIAS, 128, STOREPASS, STOREPASS)
    return path


@pytest.fixture(scope="module")
def keys(keystore) -> EncryptionKeys:
    return EncryptionKeys.from_keystore(keystore, STOREPASS)


def _data(n: int, seed: int) -> bytes:
    """Commit-log-like bytes: compressible runs mixed with random bytes."""
    rnd = random.Random(seed)
    out = bytearray()
    while len(out) < n:
        out += rnd.randbytes(rnd.randrange(1, 64)) + bytes([rnd.randrange(256)]) * rnd.randrange(1, 200)
    return bytes(out[:n])


def _cassandra_plaintext_blocks(data: bytes, chunk: int) -> bytes:
    """EncryptionUtils.compress output per chunk (BE i32 length + LZ4Compressor), each prefixed for Tde.java."""
    lz4 = LZ4Compressor()
    out = bytearray()
    for start in range(0, len(data), chunk):
        piece = data[start:start + chunk]
        block = struct.pack(">i", len(piece)) + lz4.compress(piece)
        out += struct.pack(">i", len(block)) + block
    return bytes(out)


@pytest.fixture(scope="module")
def java_run(keystore, tmp_path_factory):
    """Runs Tde.java once over every test size; returns (key algorithm, key hex, iv hex, {size: payload})."""
    java = _jdk_tool("java")
    work = tmp_path_factory.mktemp("java")
    (work / "Tde.java").write_text(JAVA_TDE)
    iv = bytes(range(16)).hex()
    args = []
    for n in SIZES:
        (work / f"in{n}").write_bytes(_cassandra_plaintext_blocks(_data(n, n), 65536))
        args += [str(work / f"in{n}"), str(work / f"out{n}")]
    done = subprocess.run([java, *JVM_FAST_START, str(work / "Tde.java"), str(keystore), "JCEKS", STOREPASS,
                           STOREPASS, ALIAS, iv, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (alias, algorithm, key_hex), = (line.split() for line in done.stdout.splitlines())
    assert alias == ALIAS
    return algorithm, key_hex, iv, {n: (work / f"out{n}").read_bytes() for n in SIZES}


def test_keystore_key_is_the_key_java_loads(keys, java_run):
    algorithm, key_hex, _, _ = java_run
    assert algorithm == "AES"
    assert keys.aliases == [ALIAS]
    assert keys.key(ALIAS).hex() == key_hex
    assert len(keys.key(ALIAS)) == 16


@pytest.mark.parametrize("n", SIZES)
def test_encrypt_section_writes_the_bytes_javax_crypto_writes(keys, java_run, n):
    _, _, iv, java_payloads = java_run
    params = {"encCipher": SUPPORTED_CIPHER, "encKeyAlias": ALIAS, "encIV": iv}
    data = _data(n, n)
    ours = encrypt_section(data, params, keys)
    assert ours == java_payloads[n]
    assert decrypt_section(java_payloads[n], n, params, keys) == data


def test_block_layout_follows_chunk_length(keys):
    params = new_encryption_params(ALIAS)
    data = _data(200000, 7)
    payload = encrypt_section(data, params, keys)
    pos, plain_lengths = 0, []
    while pos < len(payload):
        enc_len, comp_len = struct.unpack_from(">ii", payload, pos)
        assert enc_len % 16 == 0 and comp_len < enc_len <= comp_len + 16
        pos += 8 + enc_len
        plain_lengths.append(comp_len)
    assert pos == len(payload)
    assert len(plain_lengths) == 4  # 65536 + 65536 + 65536 + 3392
    assert decrypt_section(payload, len(data), params, keys) == data


def test_empty_section_has_no_blocks(keys):
    params = new_encryption_params(ALIAS)
    assert encrypt_section(b"", params, keys) == b""
    assert decrypt_section(b"", 0, params, keys) == b""
    with pytest.raises(EncryptionError, match="no blocks"):
        decrypt_section(b"", 10, params, keys)


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=5000), chunk=st.integers(min_value=1, max_value=3000))
def test_round_trip_any_data_and_chunk_length(keys, data, chunk):
    params = new_encryption_params(ALIAS)
    assert decrypt_section(encrypt_section(data, params, keys, chunk), len(data), params, keys) == data


def test_hex_keys_decrypt_what_the_keystore_key_encrypted(keys):
    params = new_encryption_params(ALIAS)
    data = _data(1000, 3)
    payload = encrypt_section(data, params, keys)
    hex_keys = EncryptionKeys.from_hex(f"other=00112233445566778899aabbccddeeff0011223344556677, "
                                       f"{ALIAS}={keys.key(ALIAS).hex().upper()}")
    assert hex_keys.aliases == ["other", ALIAS]
    assert len(hex_keys.key("other")) == 24
    assert hex_keys.key("Testing:1") == keys.key(ALIAS)  # aliases match case-insensitively, as in Java stores
    assert decrypt_section(payload, len(data), params, hex_keys) == data


@pytest.mark.parametrize("spec, message", [
    ("", "no encryption keys"),
    ("abc", "not ALIAS=HEX"),
    ("k=xyz", "not hexadecimal"),
    ("k=0011", "2 bytes"),
])
def test_bad_hex_key_specs_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        EncryptionKeys.from_hex(spec)


def test_wrong_store_password_is_a_config_error(keystore):
    with pytest.raises(ConfigError, match="wrong keystore password"):
        EncryptionKeys.from_keystore(keystore, "not-the-password")


def test_unreadable_keystores_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read keystore"):
        EncryptionKeys.from_keystore(tmp_path / "missing.jceks", STOREPASS)
    junk = tmp_path / "junk.jceks"
    junk.write_bytes(b"\xce\xce\xce\xce" + os.urandom(40))
    with pytest.raises(ConfigError):
        EncryptionKeys.from_keystore(junk, STOREPASS)


def test_key_password_differs_from_store_password(tmp_path):
    path = tmp_path / "keypass.jceks"
    # keytool (JCEKS) lower-cases aliases; Cassandra lower-cases the alias it asks a JCEKS store for.
    _keytool_genseckey(path, "Prod:2", 256, STOREPASS, "key-secret")
    with_store_password = EncryptionKeys.from_keystore(path, STOREPASS)
    with pytest.raises(EncryptionError, match="'Prod:2'.*cannot be decrypted"):
        with_store_password.key("Prod:2")
    keys = EncryptionKeys.from_keystore(path, STOREPASS, key_password="key-secret")
    assert keys.aliases == ["prod:2"]
    assert len(keys.key("Prod:2")) == 32
    params = new_encryption_params("Prod:2")
    assert decrypt_section(encrypt_section(b"x" * 5000, params, keys), 5000, params, keys) == b"x" * 5000


def test_pkcs12_keystore_keys_are_the_keys_java_loads(tmp_path):
    """keytool's default store type since JDK 9; Java's JCEKS KeyStore reads these files too."""
    path = tmp_path / "commitlog.p12"
    _keytool_genseckey(path, ALIAS, 128, STOREPASS, STOREPASS, storetype="pkcs12")
    _keytool_genseckey(path, "Second:2", 256, STOREPASS, STOREPASS, storetype="pkcs12")
    (tmp_path / "Tde.java").write_text(JAVA_TDE)
    done = subprocess.run([_jdk_tool("java"), *JVM_FAST_START, str(tmp_path / "Tde.java"), str(path), "PKCS12",
                           STOREPASS, STOREPASS, ALIAS, "00" * 16], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    java_keys = {alias: (algorithm, key_hex) for alias, algorithm, key_hex in
                 (line.split() for line in done.stdout.splitlines())}
    keys = EncryptionKeys.from_keystore(path, STOREPASS)
    assert keys.aliases == sorted(java_keys) == ["second:2", ALIAS]
    assert {a: ("AES", keys.key(a).hex()) for a in keys.aliases} == java_keys
    assert len(keys.key(ALIAS)) == 16 and len(keys.key("Second:2")) == 32
    with pytest.raises(ConfigError, match="wrong keystore password"):
        EncryptionKeys.from_keystore(path, "not-the-password")
    wrong_key_password = EncryptionKeys.from_keystore(path, STOREPASS, key_password="not-the-key-password")
    with pytest.raises(EncryptionError, match="cannot be decrypted"):
        wrong_key_password.key(ALIAS)


def test_missing_alias_names_the_alias(keys):
    with pytest.raises(EncryptionError, match="'nope:9'"):
        keys.key("nope:9")
    params = new_encryption_params("nope:9")
    with pytest.raises(EncryptionError, match="'nope:9'"):
        decrypt_section(b"\x00" * 40, 10, params, keys)


@pytest.fixture
def fixed_keys() -> EncryptionKeys:
    """A fixed key: what damaged ciphertext decrypts to depends on the key, so these tests must not use the
    keystore's random one (1 run in 256 a flipped last byte still left valid padding)."""
    return EncryptionKeys.from_hex(f"{ALIAS}=000102030405060708090a0b0c0d0e0f")


@pytest.fixture
def sealed(fixed_keys):
    params = {"encCipher": SUPPORTED_CIPHER, "encKeyAlias": ALIAS, "encIV": "0f" * 16}
    data = _data(70000, 11)
    return params, data, encrypt_section(data, params, fixed_keys)


def test_every_truncation_is_an_encryption_error(fixed_keys, sealed):
    params, data, payload = sealed
    for cut in (1, 7, 8, 9, 100, len(payload) // 2, len(payload) - 16, len(payload) - 1):
        with pytest.raises(EncryptionError):
            decrypt_section(payload[:cut], len(data), params, fixed_keys)


def test_a_cut_payload_decrypts_to_an_exact_prefix(fixed_keys, sealed):
    """A torn last section: whole blocks, then the whole AES blocks of the cut one, give a prefix of the data."""
    from cdc_lib.commitlog.encryption import decrypt_section_prefix
    params, data, payload = sealed
    first_block_end = struct.unpack_from(">i", payload, 0)[0] + 8
    got = {}
    for cut in (0, 7, 100, first_block_end - 1, first_block_end, first_block_end + 500, len(payload) - 1,
                len(payload)):
        got[cut] = decrypt_section_prefix(payload[:cut], len(data), params, fixed_keys)
        assert data.startswith(got[cut]), cut
    assert got[len(payload)] == data and got[first_block_end] == data[:64 * 1024]
    assert len(got[first_block_end - 1]) > 60000 and got[7] == b""


def test_damaged_last_block_fails_padding(fixed_keys, sealed):
    params, data, payload = sealed
    damaged = bytearray(payload)
    damaged[-1] ^= 0x5A
    with pytest.raises(EncryptionError, match="padding") as info:
        decrypt_section(bytes(damaged), len(data), params, fixed_keys)
    assert info.value.position == struct.unpack_from(">i", payload, 0)[0] + 8  # the second block's start


def test_wrong_key_wrong_iv_and_wrong_lengths_are_detected(fixed_keys, sealed):
    params, data, payload = sealed
    wrong_key = EncryptionKeys.from_hex(f"{ALIAS}=" + "ab" * 16)
    with pytest.raises(EncryptionError):
        decrypt_section(payload, len(data), params, wrong_key)
    with pytest.raises(EncryptionError):
        decrypt_section(payload, len(data), dict(params, encIV="f0" * 16), fixed_keys)
    with pytest.raises(EncryptionError, match="section header says"):
        decrypt_section(payload, len(data) + 1, params, fixed_keys)
    with pytest.raises(EncryptionError, match="exceeds"):
        decrypt_section(payload, len(data) - 1, params, fixed_keys)
    lying = bytearray(payload)
    struct.pack_into(">i", lying, 4, struct.unpack_from(">i", payload, 4)[0] + 16)
    with pytest.raises(EncryptionError, match="disagree"):
        decrypt_section(bytes(lying), len(data), params, fixed_keys)


@pytest.mark.parametrize("change, message", [
    ({"encCipher": "AES/GCM/NoPadding"}, "not supported"),
    ({"encIV": None}, "no IV"),
    ({"encIV": "zz"}, "not hexadecimal"),
    ({"encIV": "00" * 8}, "8 bytes"),
    ({"encKeyAlias": None}, "no key alias"),
])
def test_unusable_header_parameters(fixed_keys, sealed, change, message):
    params, data, payload = sealed
    with pytest.raises(EncryptionError, match=message):
        decrypt_section(payload, len(data), {**params, **change}, fixed_keys)


def test_new_params_have_fresh_ivs_and_follow_cassandras_header_keys():
    a, b = new_encryption_params(ALIAS), new_encryption_params(ALIAS)
    assert set(a) == {"encCipher", "encKeyAlias", "encIV"}
    assert a["encCipher"] == SUPPORTED_CIPHER and a["encKeyAlias"] == ALIAS
    assert len(bytes.fromhex(a["encIV"])) == 16 and a["encIV"] == a["encIV"].lower()
    assert a["encIV"] != b["encIV"]
    assert is_encrypted(a) and not is_encrypted({"compressionClass": "LZ4Compressor"})
    with pytest.raises(ConfigError):
        new_encryption_params(ALIAS, cipher="DES/ECB/PKCS5Padding")
