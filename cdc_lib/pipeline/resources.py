"""What a pipeline run is pointed at: the store, Kafka, Spark, the schema source (``PipelineConfig``)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from cdc_lib.errors import ConfigError
from cdc_lib.settings import PipelineConfig
from cdc_lib.storage.objects import ObjectStore

MiB = 1 << 20


def open_store(config: PipelineConfig) -> ObjectStore:
    """The store at ``store_url``. A local store must exist: the pipeline never creates it, so that a mistyped
    path fails instead of becoming a new, empty store (the agents create it)."""
    url = config.store_url
    if not url:
        raise ConfigError("store_url is not set")
    if "://" not in url or url.startswith("file://"):
        path = os.path.expanduser(url.removeprefix("file://"))
        if not os.path.isdir(path):
            raise ConfigError(f"store {url}: directory {path} does not exist on this worker (the pipeline never "
                              "creates its store; check store_url, or the volume that should hold it)")
    return ObjectStore.from_url(url, **config.fs_options())


def delta_root(config: PipelineConfig, store: ObjectStore) -> str:
    """The root Delta tables live under: the store's directory, or its s3:// URL."""
    return store.root if store.local else store.url


def encryption_keys(config: PipelineConfig):
    """The keys of encrypted commit logs (``keystore``; ``commitlog.encryption.EncryptionKeys``), or None when
    no keystore is set. The passwords come from their files or the environment only (``settings.secret``)."""
    if not config.keystore:
        return None
    from cdc_lib.commitlog.encryption import EncryptionKeys
    from cdc_lib.settings import KEY_PASSWORD_ENV, KEYSTORE_PASSWORD_ENV, secret
    password = secret("keystore password", file=config.keystore_password_file, env_var=KEYSTORE_PASSWORD_ENV)
    if password is None:
        raise ConfigError(f"keystore {config.keystore} needs its password: keystore_password_file or "
                          f"{KEYSTORE_PASSWORD_ENV}")
    key_password = secret("key password", file=config.key_password_file, env_var=KEY_PASSWORD_ENV)
    return EncryptionKeys.from_keystore(config.keystore, password, key_password)


def load_schema(config: PipelineConfig):
    """The CQL schema the decoder types values with (``schema_source``), with the capture rules applied (the
    include/exclude settings: ``cql.capture``), so every step sees the same tables and columns."""
    from cdc_lib.cql.capture import CaptureRules
    rules = CaptureRules(*(tuple(getattr(config, f.name)) for f in dataclasses.fields(CaptureRules)))
    return rules.apply(_full_schema(config))


def _full_schema(config: PipelineConfig):
    if config.schema_source == "cql":
        if not config.schema_file:
            raise ConfigError("schema_source 'cql' needs schema_file (a CQL file with table IDs)")
        from cdc_lib.cql.schema_from_ddl import load_cql_schema
        return load_cql_schema(Path(config.schema_file))
    # "driver" (PipelineConfig accepts nothing else)
    from cdc_lib.cql import schema_from_cluster as schema_driver
    if not config.cassandra_hosts:
        raise ConfigError("schema_source 'driver' needs cassandra_hosts (or the Cassandra connection)")
    options = {}
    if config.cassandra_username:
        from cassandra.auth import PlainTextAuthProvider
        options["auth_provider"] = PlainTextAuthProvider(config.cassandra_username, config.cassandra_password or "")
    return schema_driver.load_from_cluster(config.cassandra_hosts, port=config.cassandra_port, **options)
