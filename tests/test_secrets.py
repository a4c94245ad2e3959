"""Secrets stay secret: keystore passwords, encryption keys and object-store credentials come from files or the
environment, never from a command line (every user of the machine reads those in ``ps``), and never reach a log.

Each test runs the real command while ``process_list.ProcessList`` samples ``ps -eo args``, then greps what it
saw and what the command wrote for the secrets it used. A positive control (the deprecated flag that does put
the secret on the command line) shows the sampler sees such a process. The DAG side (task logs and process list
of scheduled runs under a real Airflow) is checked in ``test_airflow_scheduler``.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from process_list import ProcessList

from cdc_lib.commitlog.encryption import EncryptionKeys
from cdc_lib.commitlog.mutation import encode_mutation
from cdc_lib.commitlog.writer import write_segment
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, Workload, sample_schema

REPO = Path(__file__).resolve().parents[1]
ALIAS = "testing:1"


def cli(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CASSANDRA_CDC_")}
    return subprocess.run([sys.executable, "-m", "cdc_lib.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, env={**base, **(env or {})})


@pytest.fixture(scope="module")
def encrypted(tmp_path_factory):
    """(keystore, its password, schema file, an encrypted segment) as Cassandra's TDE writes them."""
    work = tmp_path_factory.mktemp("tde")
    password = "ks-" + secrets.token_hex(12)
    keystore = work / "commitlog.jceks"
    subprocess.run([shutil.which("keytool"), "-genseckey", "-alias", ALIAS, "-keyalg", "AES", "-keysize", "128",
                    "-storetype", "jceks", "-keystore", str(keystore), "-storepass", password, "-keypass", password],
                   check=True, capture_output=True, timeout=60)
    schema = sample_schema()
    schema_file = work / "schema.cql"
    schema_file.write_text(SAMPLE_SCHEMA_CQL)
    workload = Workload(schema, seed=5)
    mutations = [encode_mutation(workload.next_mutation(), schema) for _ in range(50)]
    segment = write_segment(work, 1_763_000_000_001, mutations, keys=EncryptionKeys.from_keystore(keystore, password),
                            key_alias=ALIAS)
    return keystore, password, schema_file, segment


def test_inspect_reads_the_keystore_password_from_a_file_or_the_environment(encrypted, tmp_path):
    keystore, password, schema_file, segment = encrypted
    password_file = tmp_path / "keystore-password"
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    with ProcessList() as ps:
        from_file = cli("inspect", "--schema", schema_file, "--keystore", keystore, "--keystore-password-file",
                        password_file, segment)
        from_env = cli("inspect", "--schema", schema_file, "--keystore", keystore, segment,
                       env={"CASSANDRA_CDC_KEYSTORE_PASSWORD": password})
    assert from_file.returncode == 0 and from_file.stderr == "", from_file.stderr
    assert from_file.stdout.count('"kind":"row"') >= 40         # decrypted and decoded
    assert from_env.returncode == 0 and (from_env.stdout, from_env.stderr) == (from_file.stdout, "")
    assert ps.samples > 5 and ps.lines_with(password) == []

    with ProcessList() as ps:                                   # positive control: the old flag shows it
        on_argv = cli("inspect", "--schema", schema_file, "--keystore", keystore, "--keystore-password", password,
                      segment)
    assert ps.lines_with(password), "the sampler never saw the inspect process"
    assert on_argv.returncode == 0 and on_argv.stdout == from_file.stdout
    assert on_argv.stderr == ("cassandra-cdc inspect: warning: --keystore-password puts a secret on the command "
                              "line, where every user of this machine can read it (ps); use "
                              "--keystore-password-file or CASSANDRA_CDC_KEYSTORE_PASSWORD\n")
    for run in (from_file, from_env, on_argv):
        assert password not in run.stdout + run.stderr

    wrong = cli("inspect", "--schema", schema_file, "--keystore", keystore, segment,
                env={"CASSANDRA_CDC_KEYSTORE_PASSWORD": password + "x"})
    assert wrong.returncode == 1 and "wrong keystore password" in wrong.stderr and password not in wrong.stderr


def test_inspect_reads_raw_keys_from_a_key_file(encrypted, tmp_path):
    keystore, password, schema_file, segment = encrypted
    key = EncryptionKeys.from_keystore(keystore, password).key(ALIAS).hex()
    key_file = tmp_path / "keys"
    key_file.write_text(f"# the commit-log key\n{ALIAS}={key}\n")
    with ProcessList() as ps:
        done = cli("inspect", "--schema", schema_file, "--key-file", key_file, segment)
    assert done.returncode == 0 and done.stderr == "" and done.stdout.count('"kind":"row"') >= 40
    assert ps.lines_with(key) == [] and key not in done.stdout


def test_the_pipeline_reads_the_keystore_password_from_a_file_or_the_environment(encrypted, tmp_path, monkeypatch):
    """``keystore`` with its password in ``keystore_password_file`` or CASSANDRA_CDC_KEYSTORE_PASSWORD (never a
    setting's value); without either the run stops with what to set."""
    from cdc_lib.errors import ConfigError
    from cdc_lib.pipeline.resources import encryption_keys
    from cdc_lib.settings import KEY_PASSWORD_ENV, KEYSTORE_PASSWORD_ENV, PipelineConfig
    keystore, password, _, _ = encrypted
    monkeypatch.delenv(KEYSTORE_PASSWORD_ENV, raising=False)
    monkeypatch.delenv(KEY_PASSWORD_ENV, raising=False)
    assert encryption_keys(PipelineConfig()) is None
    with pytest.raises(ConfigError, match=f"keystore_password_file or {KEYSTORE_PASSWORD_ENV}"):
        encryption_keys(PipelineConfig(keystore=str(keystore)))
    password_file = tmp_path / "pw"
    password_file.write_text(password + "\n")
    from_file = encryption_keys(PipelineConfig(keystore=str(keystore), keystore_password_file=str(password_file)))
    monkeypatch.setenv(KEYSTORE_PASSWORD_ENV, password)
    from_env = encryption_keys(PipelineConfig(keystore=str(keystore)))
    assert from_file.key(ALIAS) == from_env.key(ALIAS) and len(from_env.key(ALIAS)) == 16
    assert password not in repr(PipelineConfig(keystore=str(keystore), keystore_password_file=str(password_file)))
