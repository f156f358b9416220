"""Every sampler setting, declared once: its default, its parser and its help.

The declaration feeds ``sampler.start()``, the ``FLEETFLAME_*`` environment variables, the
``python -m sampler run`` options and docs/sampler.md (a test checks the docs list them all).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A sampler setting has a value it cannot use; the message names the setting."""


@dataclass(frozen=True)
class Setting:
    """One setting: its name, default, how to parse it from text, and what it does."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    help: str

    @property
    def env(self) -> str:
        """The environment variable that sets it."""
        return "FLEETFLAME_" + self.name.upper()


def parse_bool(text: str) -> bool:
    """Reads 1/0, true/false, yes/no, on/off."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def parse_ports(text: str) -> tuple[int, int] | None:
    """Reads a port (``8021``), a range (``8021-8036``), or ``none``/``off`` for no endpoint."""
    text = str(text).strip()
    if text.lower() in ("none", "off", "false", ""):
        return None
    first, _, last = text.partition("-")
    low, high = int(first), int(last or first)
    if not (0 <= low <= high <= 65535):
        raise ValueError(f"expected a port or a range like 8021-8036, got {text!r}")
    return low, high


def parse_labels(text: str) -> dict[str, str]:
    """Reads ``key=value,key=value``."""
    labels = {}
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {item!r}")
        labels[key.strip()] = value.strip()
    return labels


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {text!r}")
        return text

    return parse


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise ValueError(f"expected a positive number, got {text!r}")
        return value

    return parse


def _optional_str(text: str) -> str | None:
    return str(text) if text else None


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "port",
        "8021",
        parse_ports,
        "TCP port of the HTTP endpoint, or a range such as 8021-8036 from which each process "
        "takes the first free port (preforked workers), 0 for any free port, none for no endpoint.",
    ),
    Setting(
        "host",
        "127.0.0.1",
        str,
        "Address the endpoint binds to. Anything but a loopback address requires a token.",
    ),
    Setting(
        "token",
        None,
        _optional_str,
        "Bearer token every request to the endpoint must carry (Authorization: Bearer TOKEN).",
    ),
    Setting(
        "interval",
        0.01,
        _positive(float),
        "Seconds between samples (0.01 is 100 Hz); one sample stands for this much time.",
    ),
    Setting(
        "mode",
        "cpu",
        _choice("cpu", "wall"),
        "cpu: CPU time of every thread (idle threads do not count); wall: wall-clock time of "
        "every thread, waiting included.",
    ),
    Setting(
        "driver",
        "auto",
        _choice("auto", "signal", "thread"),
        "signal: a timer signal (no wake-ups while the process is idle); thread: a daemon "
        "thread; auto: signal, switching to thread when the main thread cannot run handlers.",
    ),
    Setting(
        "service",
        None,
        _optional_str,
        "Service name reported to the collector (default: the program's name).",
    ),
    Setting(
        "labels",
        {},
        parse_labels,
        "Process labels as key=value,key=value (version=1.4.2,region=eu) sent to the collector.",
    ),
    Setting(
        "max_depth",
        128,
        _positive(int),
        "Frames kept per stack; deeper stacks keep their leaf-most frames under [truncated].",
    ),
    Setting(
        "max_stacks",
        20000,
        _positive(int),
        "Distinct stacks kept; stacks first seen after that count under [other].",
    ),
    Setting(
        "overhead_budget",
        1.0,
        _positive(float),
        "Percent of one CPU the sampler may spend; above it the tick interval is stretched.",
    ),
    Setting("lineno", False, parse_bool, "Append the line number to every frame (module:func:42)."),
    Setting("thread_frames", False, parse_bool, "Add a root frame [thread:NAME] per thread."),
    Setting(
        "follow_fork",
        True,
        parse_bool,
        "After fork(), start a fresh sampler and endpoint in the child (gunicorn preload_app).",
    ),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}


def resolve(
    overrides: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Returns every setting's value: explicit arguments first, then the environment, then defaults."""
    environ = os.environ if environ is None else environ
    unknown = set(overrides) - set(BY_NAME)
    if unknown:
        raise ConfigError(f"unknown sampler setting(s): {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        if overrides.get(setting.name) is not None:
            raw, source = overrides[setting.name], f"argument {setting.name}"
        elif setting.env in environ:
            raw, source = environ[setting.env], f"environment variable {setting.env}"
        else:
            raw, source = setting.default, f"default of {setting.name}"
        try:
            values[setting.name] = _coerce(setting, raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return values


def _coerce(setting: Setting, raw: Any) -> Any:
    if isinstance(raw, str) or setting.name == "port":
        return setting.parse(raw if isinstance(raw, str) else str(raw))
    if setting.name == "labels":
        return {str(k): str(v) for k, v in dict(raw).items()}
    if isinstance(raw, bool) or raw is None:
        return raw
    return setting.parse(str(raw))
