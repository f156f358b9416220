"""Every sampler setting, declared once (``sampler.settings``): name, type, default, help.

The declaration feeds ``sampler.start()``, the ``FLEETFLAME_*`` environment variables, the
``python -m sampler run`` options and the table in docs/sampler.md (``python -m
sampler.settings`` prints it; a test compares it with the docs).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from .profile.frames import MAX_NAME, MAX_TEXT, label_text
from .settings import Setting, SettingsError, boolean, declare, labels, string

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any


class ConfigError(SettingsError):
    """A sampler setting has a value it cannot use; the message names the setting."""


parse_bool = boolean  # the sampler's name for it (FLEETFLAME_ENABLE)


def parse_ports(value: str) -> tuple[int, int] | None:
    """Reads a port (``8021``), a range (``8021-8036``), or ``none``/``off`` for no endpoint."""
    value = str(value).strip()
    if value.lower() in ("none", "off", "false", ""):
        return None
    first, _, last = value.partition("-")
    low, high = int(first), int(last or first)
    if not (0 <= low <= high <= 65535):
        raise ValueError(f"expected a port or a range like 8021-8036, got {value!r}")
    return low, high


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


def _token(text: str) -> str | None:
    # A header value loses its surrounding whitespace on the way, so such a token could never
    # match (a secret read with its trailing newline); a blank one would guard nothing.
    if not text:
        return None
    if not text.strip():
        raise ValueError("a blank token (only whitespace) protects nothing; set a real secret")
    if text != text.strip():
        raise ValueError(
            "the token starts or ends with whitespace (a trailing newline?), which no "
            "Authorization header can carry; remove it"
        )
    if not text.isprintable():
        raise ValueError("the token has control characters, which no HTTP header can carry")
    return text


SETTINGS: tuple[Setting, ...] = declare(
    "FLEETFLAME_",
    Setting(
        "port",
        parse_ports,
        "8021",
        "TCP port of the HTTP endpoint, or a range such as 8021-8036 from which each process "
        "takes the first free port (preforked workers), 0 for any free port, none for no endpoint.",
    ),
    Setting(
        "host",
        string,
        "127.0.0.1",
        "Address the endpoint binds to. Anything but a loopback address requires a token.",
    ),
    Setting(
        "token",
        _token,
        None,
        "Bearer token every request to the endpoint must carry (Authorization: Bearer TOKEN).",
    ),
    Setting(
        "interval",
        _positive(float),
        0.01,
        "Seconds between samples (0.01 is 100 Hz); one sample stands for this much time.",
    ),
    Setting(
        "mode",
        _choice("cpu", "wall"),
        "cpu",
        "cpu: CPU time of every thread (idle threads do not count); wall: wall-clock time of "
        "every thread, waiting included.",
    ),
    Setting(
        "driver",
        _choice("auto", "signal", "thread"),
        "auto",
        "The python engine's driver. signal: a timer signal (no wake-ups while the process is "
        "idle); thread: a daemon thread; auto: signal, switching to thread when the main thread "
        "cannot run handlers. Choosing signal or thread chooses the python engine.",
    ),
    Setting(
        "engine",
        _choice("auto", "native", "python"),
        "auto",
        "native: the C extension walks each thread's frames from a signal on that thread (time "
        "lands where it was spent, C code included); python: the pure-Python drivers above; "
        "auto: native where it is built and supported, python otherwise (/info says why).",
    ),
    Setting(
        "pause_when_traced",
        boolean,
        True,
        "Native engine: pause sampling while a tracer such as py-spy or gdb is attached (py-spy "
        "0.4 can hang, holding the process's threads stopped, when a signal reaches a thread it "
        "is pausing: benfred/py-spy#565).",
    ),
    Setting(
        "service",
        _optional_str,
        None,
        "Service name reported to the collector (default: the program's name).",
    ),
    Setting(
        "labels",
        labels,
        {},
        "Process labels as key=value,key=value (version=1.4.2,region=eu) sent to the collector.",
    ),
    Setting(
        "max_depth",
        _positive(int),
        128,
        "Frames kept per stack; deeper stacks keep their leaf-most frames under [truncated].",
    ),
    Setting(
        "max_stacks",
        _positive(int),
        20000,
        "Distinct stacks kept; stacks first seen after that count under [other].",
    ),
    Setting(
        "overhead_budget",
        _positive(float),
        1.0,
        "Percent of one CPU the sampler may spend; above it the tick interval is stretched.",
    ),
    Setting("lineno", boolean, False, "Append the line number to every frame (module:func:42)."),
    Setting("thread_frames", boolean, False, "Add a root frame [thread:NAME] per thread."),
    Setting(
        "follow_fork",
        boolean,
        True,
        "After fork(), start a fresh sampler and endpoint in the child (gunicorn preload_app).",
    ),
    Setting(
        "stalls",
        boolean,
        True,
        "Watch for stalls (an asyncio callback or a WSGI request running long, the GIL held "
        "long) and serve them at /stalls.json.",
    ),
    Setting(
        "stall_threshold",
        _positive(float),
        0.05,
        "Seconds an asyncio callback may run, or the GIL be held, before it is a stall.",
    ),
    Setting(
        "request_stall_threshold",
        _positive(float),
        0.5,
        "Seconds a WSGI server's worker may spend on one request before it is a stall.",
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
        elif setting.env_var in environ:
            raw, source = environ[setting.env_var], f"environment variable {setting.env_var}"
        else:
            raw, source = setting.default, f"default of {setting.name}"
        try:
            values[setting.name] = _coerce(setting, raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return values


def _coerce(setting: Setting, raw: Any) -> Any:
    if isinstance(raw, str) or setting.name == "port":
        return setting.type(raw if isinstance(raw, str) else str(raw))
    if setting.name == "labels":
        return {
            label_text(str(k), MAX_NAME): label_text(str(v), MAX_TEXT) for k, v in dict(raw).items()
        }
    if isinstance(raw, bool) or raw is None:
        return raw
    return setting.type(str(raw))
