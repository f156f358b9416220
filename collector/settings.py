"""Every collector setting, declared once, and the loader that layers file, environment and CLI.

One ``Setting`` (name, type, default, help) feeds the TOML config file, the
``FLEETFLAME_COLLECTOR_<NAME>`` environment variables, the ``fleetflame collect`` options and
the reference table in docs/collector.md. Precedence, lowest first: defaults, the config file,
environment variables, command-line options.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "ENV_PREFIX",
    "SETTINGS",
    "Setting",
    "Settings",
    "SettingsError",
    "add_arguments",
    "load_settings",
    "markdown_table",
]

ENV_PREFIX = "FLEETFLAME_COLLECTOR_"


class SettingsError(ValueError):
    """A setting has a bad value or the config file cannot be read; the message says which."""


@dataclass(frozen=True)
class Setting:
    """One configuration key: its name, value type, default and one-line help."""

    name: str
    type: str  # "str", "int", "float", "bool", "list", "labels"
    default: Any
    help: str

    @property
    def env_var(self) -> str:
        """The environment variable that overrides this setting."""
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        """The command-line option that overrides this setting."""
        return "--" + self.name.replace("_", "-")


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "database_url",
        "str",
        "sqlite:///fleetflame.db",
        "SQLAlchemy URL of the store: a SQLite file, or postgresql+psycopg://user@host/db.",
    ),
    Setting("bucket_seconds", "int", 60, "Width of the finest time bucket samples are stored in."),
    Setting("retention_days", "int", 30, "Samples older than this many days are deleted."),
    Setting(
        "db_busy_timeout",
        "float",
        5.0,
        "Seconds a write waits for a locked SQLite database before the rows are buffered.",
    ),
    Setting("poll_interval", "float", 10.0, "Seconds between two poll cycles over all targets."),
    Setting("poll_concurrency", "int", 32, "How many targets are fetched at the same time."),
    Setting("connect_timeout", "float", 2.0, "Seconds to wait for a target's TCP connection."),
    Setting("read_timeout", "float", 5.0, "Seconds to wait for each read from a target."),
    Setting(
        "fetch_deadline",
        "float",
        8.0,
        "Seconds a whole fetch (connect, headers and body) may take before it is abandoned.",
    ),
    Setting(
        "max_response_bytes",
        "int",
        64 * 1024 * 1024,
        "A /profile.json larger than this (after decompression) is refused.",
    ),
    Setting(
        "max_stacks", "int", 200_000, "A document with more (label set, stack) entries is refused."
    ),
    Setting(
        "max_count",
        "int",
        10**12,
        "A cumulative count above this is refused as absurd (it would overflow the store).",
    ),
    Setting(
        "targets",
        "list",
        [],
        "Static targets: host:port or a port range host:8021-8036 (closed ports in a range are normal).",
    ),
    Setting(
        "target_labels", "labels", {}, "Labels added to every static target, e.g. environment=prod."
    ),
    Setting(
        "target_files",
        "list",
        [],
        "Discovery files (JSON or TOML, Prometheus file_sd style, glob patterns allowed), "
        "re-read when they change.",
    ),
    Setting("token", "str", "", "Bearer token sent to the samplers (when they require one)."),
    Setting(
        "shard", "str", "1/1", "This collector's shard K/N: it polls the targets that hash to K."
    ),
    Setting("rollup_interval", "float", 300.0, "Seconds between two runs of the rollup job."),
    Setting(
        "retention_interval", "float", 3600.0, "Seconds between two runs of the retention job."
    ),
    Setting(
        "buffer_max_rows",
        "int",
        1_000_000,
        "Sample rows kept in memory while the database is unavailable; the oldest are dropped past it.",
    ),
    Setting(
        "health_listen",
        "str",
        "127.0.0.1:9021",
        "host:port of the /healthz and /metrics server; empty disables it.",
    ),
    Setting("log_format", "str", "kv", "Log lines as key=value pairs (kv) or JSON objects (json)."),
    Setting("log_level", "str", "info", "Lowest level logged: debug, info, warning or error."),
)

_BY_NAME = {setting.name: setting for setting in SETTINGS}
_CHOICES = {
    "log_format": ("kv", "json"),
    "log_level": ("debug", "info", "warning", "error"),
}


class Settings:
    """The effective configuration: one attribute per declared setting."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        for setting in SETTINGS:
            setattr(self, setting.name, values.get(setting.name, setting.default))

    def __getattr__(self, name: str) -> Any:  # only reached for undeclared names
        raise AttributeError(f"no collector setting named {name!r}")

    def as_dict(self) -> dict[str, Any]:
        """Returns every setting by name."""
        return {setting.name: getattr(self, setting.name) for setting in SETTINGS}

    def replace(self, **changes: Any) -> Settings:
        """Returns a copy with some settings changed (validated like any other source)."""
        values = self.as_dict()
        for name, value in changes.items():
            values[name] = _coerce(_lookup(name, "argument"), value, "argument", text=True)
        _check(values)
        return Settings(values)


def _lookup(name: str, source: str) -> Setting:
    setting = _BY_NAME.get(name)
    if setting is None:
        known = ", ".join(sorted(_BY_NAME))
        raise SettingsError(f"{source}: unknown setting {name!r} (known: {known})")
    return setting


def _parse_labels(text: str, source: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(
                f"{source}: expected key=value pairs separated by commas, got {item!r}"
            )
        labels[key.strip()] = value.strip()
    return labels


def _coerce(setting: Setting, value: Any, source: str, *, text: bool = False) -> Any:
    """Converts a value from TOML (typed) or from ``text`` (env, CLI) to the setting's type."""
    where = f"{source}: {setting.name}"
    kind = setting.type
    if text and isinstance(value, str) and kind != "str":
        raw = value.strip()
        try:
            if kind == "int":
                return int(raw.replace("_", ""))
            if kind == "float":
                return float(raw)
            if kind == "bool":
                if raw.lower() in ("1", "true", "yes", "on"):
                    return True
                if raw.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(raw)
            if kind == "list":
                return [part.strip() for part in raw.split(",") if part.strip()]
            if kind == "labels":
                return _parse_labels(raw, where)
        except SettingsError:
            raise
        except ValueError:
            raise SettingsError(f"{where}: {value!r} is not a valid {kind}") from None
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "list": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "labels": isinstance(value, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()),
    }[kind]
    if not ok:
        expected = {"list": "a list of strings", "labels": "a table of strings"}.get(
            kind, f"a {kind}"
        )
        raise SettingsError(f"{where}: expected {expected}, got {value!r}")
    if kind == "float":
        return float(value)
    if kind in ("list", "labels"):
        return type(value)(value)
    return value


def _check(values: Mapping[str, Any]) -> None:
    """Validates ranges and choices that types alone do not catch."""
    for name, choices in _CHOICES.items():
        if values[name] not in choices:
            raise SettingsError(f"{name}: {values[name]!r} is not one of {', '.join(choices)}")
    positive = ("bucket_seconds", "poll_interval", "poll_concurrency", "connect_timeout")
    positive += ("read_timeout", "fetch_deadline", "max_response_bytes", "max_stacks", "max_count")
    positive += ("rollup_interval", "retention_interval", "buffer_max_rows", "retention_days")
    positive += ("db_busy_timeout",)
    for name in positive:
        if values[name] <= 0:
            raise SettingsError(f"{name}: must be positive, got {values[name]!r}")
    from collector.targets import TargetError, parse_shard

    try:
        parse_shard(values["shard"])
    except TargetError as exc:
        raise SettingsError(f"shard: {exc}") from None


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a TOML config file into raw values by setting name; unknown keys are errors."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    # A [collector] table is accepted too, so one file can hold several components' settings.
    if isinstance(data.get("collector"), dict):
        data = {**{k: v for k, v in data.items() if k != "collector"}, **data["collector"]}
    values: dict[str, Any] = {}
    for name, value in data.items():
        setting = _lookup(name, f"config file {path}")
        values[name] = _coerce(setting, value, f"config file {path}")
    # Relative discovery paths are relative to the config file, not to the working directory.
    base = Path(path).resolve().parent
    if "target_files" in values:
        values["target_files"] = [str(base / pattern) for pattern in values["target_files"]]
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds one ``--option`` per setting; unset options default to None (meaning: not given)."""
    group = parser.add_argument_group(
        "settings (also in the config file and FLEETFLAME_COLLECTOR_*)"
    )
    for setting in SETTINGS:
        metavar = {"list": "A,B", "labels": "K=V,K=V"}.get(setting.type, setting.type.upper())
        group.add_argument(
            setting.flag,
            dest=f"setting_{setting.name}",
            default=None,
            metavar=metavar,
            help=f"{setting.help} [default: {_render_default(setting)}]",
        )


def load_settings(
    config: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | argparse.Namespace | None = None,
) -> Settings:
    """Returns the effective settings: defaults, then the config file, env vars and overrides."""
    values: dict[str, Any] = {s.name: s.default for s in SETTINGS}
    if config is not None:
        values.update(read_config_file(config))
    env = os.environ if environ is None else environ
    for name, text in env.items():
        if name.startswith(ENV_PREFIX):
            setting = _lookup(name[len(ENV_PREFIX) :].lower(), f"environment variable {name}")
            values[setting.name] = _coerce(setting, text, f"environment variable {name}", text=True)
    if isinstance(overrides, argparse.Namespace):
        overrides = {
            key[len("setting_") :]: value
            for key, value in vars(overrides).items()
            if key.startswith("setting_") and value is not None
        }
    for name, value in (overrides or {}).items():
        setting = _lookup(name, "command line")
        values[name] = _coerce(setting, value, f"option {setting.flag}", text=True)
    _check(values)
    return Settings(values)


def _render_default(setting: Setting) -> str:
    value = setting.default
    if setting.type == "labels":
        return ",".join(f"{k}={v}" for k, v in value.items()) or "(none)"
    if setting.type == "list":
        return ",".join(value) or "(none)"
    if value == "":
        return "(empty)"
    return str(value)


def markdown_table() -> str:
    """Renders the settings reference table that docs/collector.md embeds."""
    lines = [
        "| setting | environment variable | type | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in SETTINGS:
        default = _render_default(s).replace("|", "\\|")
        lines.append(f"| `{s.name}` | `{s.env_var}` | {s.type} | `{default}` | {s.help} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
