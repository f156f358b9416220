"""Every web UI setting, declared once, and the loader that layers file and environment.

One ``Setting`` (name, type, default, help) feeds the TOML config file, the
``FLEETFLAME_WEB_<NAME>`` environment variables, the Flask config (``app.config[NAME.upper()]``)
and the table in docs/webui.md. Precedence, lowest first: defaults, the config file,
environment variables, then the mapping given to ``create_app`` (tests, embedding).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "SETTINGS",
    "Setting",
    "SettingsError",
    "load_settings",
    "markdown_table",
]

ENV_PREFIX = "FLEETFLAME_WEB_"
CONFIG_ENV = "FLEETFLAME_WEB_CONFIG"  # path of the TOML file, for gunicorn 'webui:create_app()'
# Settings the web UI shares with the collector: read from a [collector] table when the file
# has no value for them in [web], so one file can configure both.
_SHARED_WITH_COLLECTOR = ("database_url", "bucket_seconds")


class SettingsError(ValueError):
    """A setting has a bad value or the config file cannot be read; the message says which."""


@dataclass(frozen=True)
class Setting:
    """One configuration key: its name, type, default and one-line help."""

    name: str
    type: type
    default: Any
    help: str

    @property
    def key(self) -> str:
        """The Flask config key."""
        return self.name.upper()

    @property
    def env_var(self) -> str:
        """The environment variable that overrides this setting."""
        return ENV_PREFIX + self.name.upper()


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "database_url",
        str,
        "sqlite:///fleetflame.db",
        "SQLAlchemy URL of the collector's store; the UI opens it read-only.",
    ),
    Setting("bucket_seconds", int, 60, "Finest bucket width, as configured for the collector."),
    Setting(
        "max_nodes",
        int,
        5000,
        "Frames sent to the browser per flamegraph unless the request asks for fewer; the "
        "rest is shown as [pruned] nodes.",
    ),
    Setting("max_nodes_limit", int, 50000, "The most frames a request may ask for (max_nodes=)."),
    Setting(
        "sample_interval",
        float,
        0.01,
        "Seconds one sample stands for (the samplers' interval): units of pprof exports.",
    ),
    Setting("default_window", str, "-1h", "Window shown when the URL has no from= parameter."),
    Setting("title", str, "fleetflame", "Name shown in the page header and titles."),
    Setting(
        "auth_token",
        str,
        "",
        "When set, every request needs 'Authorization: Bearer TOKEN' (or HTTP basic with this "
        "token as the password); empty means no authentication (e.g. behind a proxy that does it).",
    ),
    Setting(
        "auth_user", str, "", "With auth_password: HTTP basic user name accepted in the browser."
    ),
    Setting("auth_password", str, "", "With auth_user: the HTTP basic password."),
    Setting(
        "cache_entries",
        int,
        16,
        "Recent merged profiles of windows that ended in the past kept in memory (0: none).",
    ),
    Setting(
        "stack_index_mb",
        int,
        300,
        "Estimated memory, per process, for the sort order and frames of stacks already read "
        "(their text once, plus ~400 bytes each), which makes windows of many distinct stacks "
        "fast; past it the frames go, then the order starts over with the window at hand.",
    ),
    Setting(
        "warm_hours",
        float,
        24.0,
        "When a process first opens the database, it reads the stacks sampled in this many "
        "past hours into its stack index in the background (most recent first, up to 80% of "
        "stack_index_mb), so the first views after a restart are as fast as later ones; 0: off.",
    ),
)

_BY_NAME = {setting.name: setting for setting in SETTINGS}
_POSITIVE = (
    "bucket_seconds",
    "max_nodes",
    "max_nodes_limit",
    "sample_interval",
    "stack_index_mb",
)


def _coerce(setting: Setting, value: Any, source: str) -> Any:
    """Converts a value from TOML (typed) or from an environment variable (text)."""
    where = f"{source}: {setting.name}"
    if isinstance(value, str) and setting.type is not str:
        try:
            return setting.type(value.strip().replace("_", ""))
        except ValueError:
            raise SettingsError(
                f"{where}: {value!r} is not a valid {setting.type.__name__}"
            ) from None
    if setting.type is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, setting.type) or isinstance(value, bool):
        raise SettingsError(f"{where}: expected a {setting.type.__name__}, got {value!r}")
    return value


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a TOML file into values by setting name; unknown keys are errors.

    The keys are read from a ``[web]`` table when there is one (database_url and
    bucket_seconds fall back to a ``[collector]`` table), otherwise from the top level.
    """
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    if isinstance(data.get("web"), dict):
        table = dict(data["web"])
        shared = data.get("collector") if isinstance(data.get("collector"), dict) else data
        for name in _SHARED_WITH_COLLECTOR:
            if name not in table and name in shared:
                table[name] = shared[name]
    else:
        table = data
    values = {}
    for name, value in table.items():
        setting = _BY_NAME.get(name)
        if setting is None:
            known = ", ".join(sorted(_BY_NAME))
            raise SettingsError(f"config file {path}: unknown setting {name!r} (known: {known})")
        values[name] = _coerce(setting, value, f"config file {path}")
    return values


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Returns the Flask config keys of every setting: defaults, file, environment, overrides.

    ``config_file`` defaults to the file named by ``FLEETFLAME_WEB_CONFIG``. Overrides use
    Flask keys (upper case); keys that are not settings pass through unchanged.
    """
    environ = os.environ if environ is None else environ
    values = {setting.name: setting.default for setting in SETTINGS}
    config_file = config_file or environ.get(CONFIG_ENV) or None
    if config_file:
        values.update(read_config_file(config_file))
    for setting in SETTINGS:
        if setting.env_var in environ:
            values[setting.name] = _coerce(setting, environ[setting.env_var], setting.env_var)
    config = {name.upper(): value for name, value in values.items()}
    for key, value in (overrides or {}).items():
        setting = _BY_NAME.get(key.lower())
        config[key] = _coerce(setting, value, "config") if setting and key.isupper() else value
    for name in _POSITIVE:
        if config[name.upper()] <= 0:
            raise SettingsError(f"{name}: must be positive, got {config[name.upper()]!r}")
    if config["WARM_HOURS"] < 0:
        raise SettingsError(
            f"warm_hours: must be 0 (off) or positive, got {config['WARM_HOURS']!r}"
        )
    if config["MAX_NODES"] < 10 or config["MAX_NODES_LIMIT"] < config["MAX_NODES"]:
        raise SettingsError("max_nodes must be at least 10 and at most max_nodes_limit")
    if bool(config["AUTH_USER"]) != bool(config["AUTH_PASSWORD"]):
        raise SettingsError("auth_user and auth_password are set together or not at all")
    return config


def markdown_table() -> str:
    """Returns the settings reference as a Markdown table (docs/webui.md embeds it)."""
    lines = [
        "| setting | environment variable | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for s in SETTINGS:
        default = f"`{s.default!r}`" if s.default != "" else '`""`'
        lines.append(f"| `{s.name}` | `{s.env_var}` | {default} | {s.help} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
