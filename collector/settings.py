"""Every collector setting, declared once (``sampler.settings``), and how the sources layer.

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
from pathlib import Path
from typing import Any

from sampler import settings
from sampler.settings import (
    Setting,
    SettingsError,
    declare,
    integer,
    labels,
    listen_address,
    number,
    read_toml,
    string,
    text_list,
    text_values,
    typed_values,
)

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

SETTINGS: tuple[Setting, ...] = declare(
    ENV_PREFIX,
    Setting(
        "database_url",
        string,
        "sqlite:///fleetflame.db",
        "SQLAlchemy URL of the store: a SQLite file, or postgresql+psycopg://user@host/db.",
    ),
    Setting(
        "bucket_seconds", integer, 60, "Width of the finest time bucket samples are stored in."
    ),
    Setting(
        "retention_days",
        integer,
        30,
        "Samples older than this many days are deleted; more than 7 (the hourly tier's age).",
    ),
    Setting(
        "db_busy_timeout",
        number,
        5.0,
        "Seconds a write waits for a locked SQLite database before the rows are buffered.",
    ),
    Setting(
        "poll_interval",
        number,
        10.0,
        "Seconds between two poll rounds; a target whose last poll is still running is skipped.",
    ),
    Setting("poll_concurrency", integer, 32, "How many targets are fetched at the same time."),
    Setting("connect_timeout", number, 2.0, "Seconds to wait for a target's TCP connection."),
    Setting("read_timeout", number, 5.0, "Seconds to wait for each read from a target."),
    Setting(
        "fetch_deadline",
        number,
        8.0,
        "Seconds a whole fetch (connect, headers and body) may take before it is abandoned.",
    ),
    Setting(
        "max_response_bytes",
        integer,
        64 * 1024 * 1024,
        "A /profile.json larger than this (after decompression) is refused.",
    ),
    Setting(
        "max_stacks",
        integer,
        200_000,
        "A document with more (label set, stack) entries is refused.",
    ),
    Setting(
        "max_count",
        integer,
        10**12,
        "A cumulative count above this is refused as absurd (it would overflow the store).",
    ),
    Setting(
        "targets",
        text_list,
        [],
        "Static targets: host:port or a port range host:8021-8036 (closed ports in a range are normal).",
    ),
    Setting(
        "target_labels", labels, {}, "Labels added to every static target, e.g. environment=prod."
    ),
    Setting(
        "target_files",
        text_list,
        [],
        "Discovery files (JSON or TOML, Prometheus file_sd style, glob patterns allowed), "
        "re-read when they change.",
    ),
    Setting("token", string, "", "Bearer token sent to the samplers (when they require one)."),
    Setting(
        "shard", string, "1/1", "This collector's shard K/N: it polls the targets that hash to K."
    ),
    Setting(
        "worst_interval",
        number,
        30.0,
        "Seconds between two reads of each target's stalls and slow requests (/stalls.json, "
        "/requests.json); 0 turns them off.",
    ),
    Setting(
        "findings_interval",
        number,
        60.0,
        "Seconds between two scheduled comparisons of each service's latest window with its "
        "baseline (the previous version, or the same window a day earlier); 0 turns them off.",
    ),
    Setting("findings_window", integer, 300, "Seconds of the latest window those compare."),
    Setting(
        "findings_fail_above",
        number,
        2.0,
        "A significant rise of a function's share by more than this many points is a finding.",
    ),
    Setting(
        "findings_webhook",
        string,
        "",
        "URL each new finding is POSTed to as JSON (retried with backoff); empty: log only.",
    ),
    Setting(
        "web_url",
        string,
        "",
        "The web UI's address, for the links in findings (e.g. https://profiling.internal).",
    ),
    Setting("rollup_interval", number, 300.0, "Seconds between two runs of the rollup job."),
    Setting("retention_interval", number, 3600.0, "Seconds between two runs of the retention job."),
    Setting(
        "buffer_max_rows",
        integer,
        1_000_000,
        "Sample rows held in memory until written: past it, polls wait for the writer while the "
        "database is up, and the oldest rows are dropped while it is down.",
    ),
    Setting(
        "health_listen",
        listen_address,
        "127.0.0.1:9021",
        "host:port of the /healthz and /metrics server; empty disables it.",
    ),
    Setting(
        "log_format", string, "kv", "Log lines as key=value pairs (kv) or JSON objects (json)."
    ),
    Setting("log_level", string, "info", "Lowest level logged: debug, info, warning or error."),
)


_CHOICES = {
    "log_format": ("kv", "json"),
    "log_level": ("debug", "info", "warning", "error"),
}
_POSITIVE = (
    "bucket_seconds",
    "findings_window",
    "poll_interval",
    "poll_concurrency",
    "connect_timeout",
    "read_timeout",
    "fetch_deadline",
    "max_response_bytes",
    "max_stacks",
    "max_count",
    "rollup_interval",
    "retention_interval",
    "buffer_max_rows",
    "retention_days",
    "db_busy_timeout",
)


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
        values = {**self.as_dict(), **typed_values(SETTINGS, changes, "argument", text=True)}
        _check(values)
        return Settings(values)


def _check(values: Mapping[str, Any]) -> None:
    """Validates ranges and choices that types alone do not catch."""
    for name, choices in _CHOICES.items():
        if values[name] not in choices:
            raise SettingsError(f"{name}: {values[name]!r} is not one of {', '.join(choices)}")
    for name in _POSITIVE:
        if values[name] <= 0:
            raise SettingsError(f"{name}: must be positive, got {values[name]!r}")
    from collector.store.tiers import DEFAULT_ROLLUPS

    rolled_up = max(after for _width, after in DEFAULT_ROLLUPS) // 86400
    if values["retention_days"] <= rolled_up:
        raise SettingsError(
            f"retention_days: must be more than {rolled_up} (rows are rolled up to hours after "
            f"{rolled_up} days and kept as that), got {values['retention_days']!r}"
        )
    from collector.targets import TargetError, parse_shard, parse_target_spec

    try:
        parse_shard(values["shard"])
    except TargetError as exc:
        raise SettingsError(f"shard: {exc}") from None
    for spec in values["targets"]:
        try:
            parse_target_spec(spec)
        except TargetError as exc:
            raise SettingsError(f"targets: {exc}") from None


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a TOML config file into values by setting name; unknown keys are errors."""
    data = read_toml(path)
    # A [collector] table is accepted too, so one file can hold several components' settings.
    if isinstance(data.get("collector"), dict):
        data = {**{k: v for k, v in data.items() if k != "collector"}, **data["collector"]}
    data = {k: v for k, v in data.items() if not (k == "web" and isinstance(v, dict))}
    values = typed_values(SETTINGS, data, f"config file {path}")
    # Relative discovery paths are relative to the config file, not to the working directory.
    base = Path(path).resolve().parent
    if "target_files" in values:
        values["target_files"] = [str(base / pattern) for pattern in values["target_files"]]
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds one ``--option`` per setting; unset options default to None (meaning: not given)."""
    settings.add_arguments(
        parser, SETTINGS, f"settings (also in the config file and {ENV_PREFIX}*)"
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
    values.update(text_values(SETTINGS, env, env_prefix=ENV_PREFIX))
    if isinstance(overrides, argparse.Namespace):
        values.update(settings.option_values(SETTINGS, overrides))
    elif overrides:
        values.update(typed_values(SETTINGS, overrides, "command line", text=True))
    _check(values)
    return Settings(values)


def markdown_table() -> str:
    """Renders the settings reference table that docs/collector.md embeds."""
    return settings.markdown_table(SETTINGS, types=True)


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
