"""Every web UI setting, declared once (``sampler.settings``), and how the sources layer.

One ``Setting`` (name, type, default, help) feeds the TOML config file, the
``FLEETFLAME_WEB_<NAME>`` environment variables, the ``fleetflame web`` options, the Flask
config (``app.config[NAME.upper()]``) and the table in docs/webui.md. Precedence, lowest first:
defaults, the config file, environment variables, then the mapping given to ``create_app``
(tests, embedding).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sampler import settings
from sampler.settings import (
    Setting,
    SettingsError,
    declare,
    integer,
    number,
    read_toml,
    string,
    text_values,
    typed_values,
)

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


class WebSetting(Setting):
    """A setting of the web UI, which Flask knows by its upper-case name."""

    __slots__ = ()

    @property
    def key(self) -> str:
        """The Flask config key."""
        return self.name.upper()


SETTINGS: tuple[Setting, ...] = declare(
    ENV_PREFIX,
    WebSetting(
        "database_url",
        string,
        "sqlite:///fleetflame.db",
        "SQLAlchemy URL of the collector's store; the UI opens it read-only.",
    ),
    WebSetting(
        "bucket_seconds", integer, 60, "Finest bucket width, as configured for the collector."
    ),
    WebSetting(
        "max_nodes",
        integer,
        5000,
        "Frames sent to the browser per flamegraph unless the request asks for fewer; the "
        "rest is shown as [pruned] nodes.",
    ),
    WebSetting(
        "max_nodes_limit", integer, 50000, "The most frames a request may ask for (max_nodes=)."
    ),
    WebSetting(
        "sample_interval",
        number,
        0.01,
        "Unused, kept so older config files load: every profile now carries its samplers' "
        "own interval, which the exports and seconds use.",
    ),
    WebSetting(
        "default_window", string, "-1h", "Window shown when the URL has no from= parameter."
    ),
    WebSetting("title", string, "fleetflame", "Name shown in the page header and titles."),
    WebSetting(
        "auth_token",
        string,
        "",
        "When set, every request needs 'Authorization: Bearer TOKEN' (or HTTP basic with this "
        "token as the password); empty means no authentication (e.g. behind a proxy that does it).",
    ),
    WebSetting(
        "auth_user", string, "", "With auth_password: HTTP basic user name accepted in the browser."
    ),
    WebSetting("auth_password", string, "", "With auth_user: the HTTP basic password."),
    WebSetting(
        "sampler_token",
        string,
        "",
        "Bearer token sent to the workers' samplers by the worker view (the collector's token), "
        "when they require one.",
    ),
    WebSetting(
        "cache_entries",
        integer,
        16,
        "Recent merged profiles of windows that ended in the past kept in memory (0: none).",
    ),
    WebSetting(
        "stack_index_mb",
        integer,
        300,
        "Estimated memory, per process, for the sort order and frames of stacks already read "
        "(their text once, plus ~400 bytes each), which makes windows of many distinct stacks "
        "fast; past it the frames go, then the order starts over with the window at hand.",
    ),
    WebSetting(
        "warm_hours",
        number,
        24.0,
        "When a process first opens the database, it reads the stacks sampled in this many "
        "past hours into its stack index in the background (most recent first, up to 80% of "
        "stack_index_mb), so the first views after a restart are as fast as later ones; 0: off.",
    ),
    WebSetting(
        "index_dir",
        string,
        "~/.cache/fleetflame",
        "Directory where each process saves its stack and function indexes (the sorted text "
        "of the stacks it has read and their functions, two files per database, readable by "
        "their owner only) and loads them from at start: a restarted server's first view and "
        "function table of many stacks need not read, sort and number them all; empty: off.",
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


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a TOML file into values by setting name; unknown keys are errors.

    The keys are read from a ``[web]`` table when there is one (database_url and
    bucket_seconds fall back to a ``[collector]`` table), otherwise from the top level.
    """
    data = read_toml(path)
    if isinstance(data.get("web"), dict):
        table = dict(data["web"])
        shared = data.get("collector") if isinstance(data.get("collector"), dict) else data
        for name in _SHARED_WITH_COLLECTOR:
            if name not in table and name in shared:
                table[name] = shared[name]
    else:
        table = data
    return typed_values(SETTINGS, table, f"config file {path}")


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
    values.update(text_values(SETTINGS, environ, env_prefix=ENV_PREFIX, strict=False))
    config = {name.upper(): value for name, value in values.items()}
    for key, value in (overrides or {}).items():
        setting = _BY_NAME.get(key.lower())
        if setting is not None and key.isupper():
            value = typed_values([setting], {setting.name: value}, "config", text=True)[
                setting.name
            ]
        config[key] = value
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
    _check_default_window(config["DEFAULT_WINDOW"])
    _check_database_url(config["DATABASE_URL"])
    return config


def _check_default_window(window: str) -> None:
    # Read at every request without from=: a bad one made every such request a 400.
    from sampler.profile import parse_time

    try:
        parse_time(window, 10**9)
    except ValueError as exc:
        raise SettingsError(f"default_window: {exc}") from None


def _check_database_url(url: str) -> None:
    # A database it cannot read made every request a 500 (the collector refuses it at start).
    from collector.store import StoreError
    from collector.store.engines.base import backend_of

    try:
        backend_of(url)
    except StoreError as exc:
        raise SettingsError(f"database_url: {exc}") from None


def markdown_table() -> str:
    """Returns the settings reference as a Markdown table (docs/webui.md embeds it)."""
    return settings.markdown_table(SETTINGS)


if __name__ == "__main__":
    print(markdown_table(), end="")
