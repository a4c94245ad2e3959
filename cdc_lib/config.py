"""Settings loading shared by the agent and the pipeline.

One rule everywhere: **flags > environment > YAML file > defaults**. A settings class is a dataclass; ``load``
fills it from those four sources and converts each value to the field's type, so every consumer gets typed,
validated settings and a :class:`ConfigError` naming the source of any bad value.

* Flags: a mapping of field name to value (``None`` means "not given", as argparse leaves it).
* Environment: ``CASSANDRA_CDC_<FIELD>`` (upper case), e.g. ``CASSANDRA_CDC_STORE_URL``. Mapping fields take JSON
  (``CASSANDRA_CDC_STORAGE_OPTIONS='{"endpoint_url": "http://127.0.0.1:8333"}'``).
* YAML file: given explicitly or by ``CASSANDRA_CDC_CONFIG``. Top-level keys are shared by every consumer; a
  section named after the consumer (``agent:``, ``pipeline:``) overrides them. Other consumers' sections are
  ignored; an unknown key at the top level or in our section is an error (it is almost always a typo).
  Example::

      store_url: s3://cdc-bucket/prod
      cluster: main
      storage_options: {endpoint_url: "http://minio:9000"}
      agent:
        cdc_raw: /var/lib/cassandra/cdc_raw
        cdc_total_space: 4096MiB

* Defaults: the dataclass defaults. A field without a default is required.

A field may carry ``metadata={"parse": fn}`` to convert strings its own way (sizes, for example).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar

from .errors import ConfigError

ENV_PREFIX = "CASSANDRA_CDC_"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"

T = TypeVar("T")

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
    "t": 1000 ** 4, "tb": 1000 ** 4,
    "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any) -> int:
    """A byte count from ``4096``, ``"4096MiB"``, ``"1.5GiB"`` or ``"10MB"`` (binary and decimal units)."""
    if isinstance(value, bool):
        raise ConfigError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"size must not be negative: {value}")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ConfigError(f"not a size: {value!r}")
        return int(value)
    m = _SIZE_RE.match(str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"not a size: {value!r} (examples: 4096MiB, 2GiB, 1048576)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_bool(value: Any) -> bool:
    """``true/false``, ``yes/no``, ``on/off``, ``1/0`` (case-insensitive) or a real bool."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "y"):
        return True
    if text in ("0", "false", "no", "off", "n", ""):
        return False
    raise ConfigError(f"not a boolean: {value!r}")


def parse_key_values(items: list[str] | None) -> dict[str, Any]:
    """``["endpoint_url=http://x", "anon=true"]`` -> dict; values that parse as JSON scalars are converted."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
            if isinstance(value, (dict, list)):
                value = raw
        except ValueError:
            value = raw
        out[key.strip()] = value
    return out


def _convert(cls_name: str, field: dataclasses.Field, hint: Any, value: Any, source: str) -> Any:
    """``value`` converted to the field's type; ConfigError names the field and where the value came from."""
    where = f"{cls_name}.{field.name} (from {source})"
    parse = field.metadata.get("parse") if field.metadata else None
    try:
        if value is None:
            return None
        if parse is not None:
            return parse(value)
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            non_none = [a for a in args if a is not type(None)]
            if isinstance(value, str) and value.strip().lower() in ("", "none", "null") and type(None) in args:
                return None
            hint = non_none[0] if len(non_none) == 1 else str
            origin = typing.get_origin(hint)
        if hint is bool:
            return parse_bool(value)
        if hint is int:
            if isinstance(value, bool):
                raise ConfigError("not an integer")
            return int(value)
        if hint is float:
            if isinstance(value, bool):
                raise ConfigError("not a number")
            return float(value)
        if hint is str:
            if isinstance(value, (dict, list)):
                raise ConfigError("expected a string")
            return str(value)
        if hint is Path:
            return Path(str(value)).expanduser()
        if hint is dict or origin is dict:
            if isinstance(value, str):
                value = json.loads(value) if value.strip() else {}
            if not isinstance(value, Mapping):
                raise ConfigError("expected a mapping")
            return dict(value)
        if hint is list or origin is list:
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            return list(value)
        return value
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: bad value {value!r}: {e}") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The YAML file as a mapping (an empty file is an empty mapping)."""
    import yaml  # PyYAML; imported here so that callers without a file do not need it

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    return data


def load(cls: type[T], *, flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
         config_file: str | Path | None = None, section: str | None = None,
         env_prefix: str = ENV_PREFIX) -> T:
    """An instance of dataclass ``cls`` from flags > environment > YAML file > defaults.

    ``env`` defaults to ``os.environ``; ``config_file`` defaults to ``$CASSANDRA_CDC_CONFIG`` if set. ``section``
    names this consumer's YAML section (``"agent"``).
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    env = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    values: dict[str, tuple[Any, str]] = {}

    if config_file is None:
        config_file = env.get(CONFIG_FILE_ENV) or None
    if config_file is not None:
        data = read_yaml(config_file)
        ours: dict[str, Any] = {}
        for key, value in data.items():
            if key in fields:
                ours[key] = value
            elif isinstance(value, dict) and key != section:
                continue  # another consumer's section
            elif key != section:
                raise ConfigError(f"config file {config_file}: unknown setting {key!r}")
        if section is not None and section in data and section not in fields:
            sect = data[section] or {}
            if not isinstance(sect, dict):
                raise ConfigError(f"config file {config_file}: section {section!r} must be a mapping")
            for key, value in sect.items():
                if key not in fields:
                    raise ConfigError(f"config file {config_file}: unknown setting {section}.{key}")
                ours[key] = value
        for key, value in ours.items():
            values[key] = (value, f"config file {config_file}")

    for name in fields:
        var = env_prefix + name.upper()
        if var in env:
            values[name] = (env[var], f"environment {var}")

    for name, value in (flags or {}).items():
        if name not in fields:
            raise ConfigError(f"unknown flag for {cls.__name__}: {name}")
        if value is not None:
            values[name] = (value, "flag --" + name.replace("_", "-"))

    kwargs: dict[str, Any] = {}
    for name, (value, source) in values.items():
        kwargs[name] = _convert(cls.__name__, fields[name], hints.get(name, Any), value, source)
    missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        hint = ", ".join(f"--{m.replace('_', '-')} / {env_prefix}{m.upper()}" for m in missing)
        raise ConfigError(f"{cls.__name__}: missing required setting(s): {hint}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{cls.__name__}: {e}") from None
