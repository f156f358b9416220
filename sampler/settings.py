"""One way to declare settings, shared by the sampler, the collector and the web UI.

A ``Setting`` is declared once: its name, type, default, environment variable and help. The
declaration feeds a program's arguments and command-line options, its environment variables,
its TOML config file (collector, web UI), and its table in the docs (``markdown_table``), which a
test compares with docs/sampler.md, docs/collector.md and docs/webui.md. Each program keeps its
own layering (which source wins) and its checks across settings; reading each source is here.

Standard library only and cheap to import: every process running the sampler imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .profile.frames import MAX_NAME, MAX_TEXT, label_text

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    import argparse
    import os
    from typing import Any

__all__ = [
    "Setting",
    "SettingsError",
    "add_arguments",
    "boolean",
    "declare",
    "integer",
    "is_loopback",
    "labels",
    "listen_address",
    "markdown_table",
    "number",
    "option_values",
    "port",
    "read_toml",
    "render_default",
    "string",
    "text_list",
    "typed_values",
    "text_values",
]


class SettingsError(ValueError):
    """A setting has a value it cannot use, or its file cannot be read; the message names it."""


class Setting:
    """One setting: its name, type (a function reading it from text), default and help.

    A plain class, not a dataclass: dataclasses cost ~7 ms at import (they import inspect)."""

    __slots__ = ("name", "type", "default", "help", "env_var")

    def __init__(self, name: str, type: Callable[[str], Any], default: Any, help: str) -> None:
        self.name = name
        self.type = type  # text -> value; raises ValueError saying what is wrong
        self.default = default
        self.help = help
        self.env_var = ""  # set by declare()

    def __repr__(self) -> str:
        return f"Setting({self.name!r}, {self.default!r})"

    @property
    def env(self) -> str:
        """The environment variable that sets it (the name the sampler's API has always used)."""
        return self.env_var

    @property
    def flag(self) -> str:
        """The command-line option that sets it."""
        return "--" + self.name.replace("_", "-")

    @property
    def kind(self) -> str:
        """The name of its type: str, int, float, bool, list, labels, or the parser's name."""
        return str(getattr(self.type, "kind", getattr(self.type, "__name__", "value")))

    def accept(self, value: Any, *, text: bool = False) -> Any:
        """Returns a typed value (from TOML or a program) as the setting's type, or raises
        ValueError; with ``text``, a string is read as text is (from the environment)."""
        if text and isinstance(value, str):
            return self.type(value)
        expected = _TYPED.get(self.kind)
        if expected is None:  # a type of the program's own: read what the value says
            return self.type(value if isinstance(value, str) else str(value))
        described, fits, convert = expected
        if not fits(value):
            raise ValueError(f"expected {described}, got {value!r:.60}")
        return convert(value)


def declare(env_prefix: str, *settings: Setting) -> tuple[Setting, ...]:
    """Returns ``settings`` with their environment variables: ``env_prefix`` + NAME."""
    for setting in settings:
        setting.env_var = env_prefix + setting.name.upper()
    return settings


# -- types: text in, value out --------------------------------------------------------------


def _kind(name: str) -> Callable[[Callable[[str], Any]], Callable[[str], Any]]:
    def mark(parse: Callable[[str], Any]) -> Callable[[str], Any]:
        parse.kind = name  # type: ignore[attr-defined]
        return parse

    return mark


@_kind("str")
def string(value: str) -> str:
    """Any text, as it is."""
    return value


@_kind("int")
def integer(value: str) -> int:
    """A whole number; ``1_000`` is allowed."""
    try:
        return int(value.strip().replace("_", ""))
    except ValueError:
        raise ValueError(f"{value!r} is not a valid int") from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 in brackets or not) is only this host's:
    ``localhost``, 127.0.0.0/8 or ::1. Binding to any other exposes what is served."""
    if host == "localhost":
        return True
    import ipaddress  # here, not at import: the sampler's start stays cheap

    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


@_kind("port")
def port(value: str) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    number: int = integer(value)
    if not 0 <= number <= 65535:
        raise ValueError(f"{value!r} is not a port (0 to 65535)")
    return number


@_kind("host:port")
def listen_address(value: str) -> str:
    """``host:port`` to listen on (``[::1]:9021`` for IPv6), or empty for none."""
    value = value.strip()
    if value:
        host, colon, number = value.rpartition(":")
        if not colon or not number.strip():
            raise ValueError(f"{value!r} is not host:port")
        port(number)
    return value


@_kind("float")
def number(value: str) -> float:
    """A number."""
    try:
        return float(value.strip().replace("_", ""))
    except ValueError:
        raise ValueError(f"{value!r} is not a valid float") from None


@_kind("bool")
def boolean(value: str) -> bool:
    """1/0, true/false, yes/no, on/off."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


@_kind("list")
def text_list(value: str) -> list[str]:
    """Comma-separated items: ``a:1,b:2``."""
    return [item.strip() for item in value.split(",") if item.strip()]


@_kind("labels")
def labels(value: str) -> dict[str, str]:
    """``key=value,key=value``."""
    out = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value pairs separated by commas, got {item!r}")
        out[label_text(key.strip(), MAX_NAME)] = label_text(val.strip(), MAX_TEXT)
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TYPED: dict[str, tuple[str, Callable[[Any], bool], Callable[[Any], Any]]] = {
    "str": ("a str", lambda v: isinstance(v, str), str),
    "int": ("an int", _is_int, int),
    "float": ("a float", lambda v: _is_int(v) or isinstance(v, float), float),
    "bool": ("a bool", lambda v: isinstance(v, bool), bool),
    "list": (
        "a list of strings",
        lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
        list,
    ),
    "labels": (
        "a table of strings",
        lambda v: (
            isinstance(v, dict)
            and all(isinstance(k, str) and isinstance(i, str) for k, i in v.items())
        ),
        lambda v: {label_text(k, MAX_NAME): label_text(i, MAX_TEXT) for k, i in v.items()},
    ),
}


# -- sources ----------------------------------------------------------------------------------


def _by_name(settings: Iterable[Setting]) -> dict[str, Setting]:
    return {setting.name: setting for setting in settings}


def _unknown(settings: Iterable[Setting], name: str, source: str) -> SettingsError:
    known = ", ".join(sorted(_by_name(settings)))
    return SettingsError(f"{source}: unknown setting {name!r} (known: {known})")


def typed_values(
    settings: Iterable[Setting], values: Mapping[str, Any], source: str, *, text: bool = False
) -> dict[str, Any]:
    """Reads typed values by setting name (a TOML table); unknown names are errors. With
    ``text``, strings are read as text (a program passing what a user typed)."""
    by_name = _by_name(settings)
    out = {}
    for name, value in values.items():
        setting = by_name.get(name)
        if setting is None:
            raise _unknown(by_name.values(), name, source)
        try:
            out[name] = setting.accept(value, text=text)
        except ValueError as exc:
            raise SettingsError(f"{source}: {name}: {exc}") from None
    return out


def text_values(
    settings: Iterable[Setting],
    environ: Mapping[str, str],
    *,
    env_prefix: str,
    strict: bool = True,
    ignore: Iterable[str] = (),
) -> dict[str, Any]:
    """Reads the settings given in ``environ`` (their env_var); with ``strict``, a variable
    starting with ``env_prefix`` that names no setting (but those in ``ignore``) is an error."""
    settings = list(settings)
    by_env = {setting.env_var: setting for setting in settings}
    skip = set(ignore)
    out = {}
    for variable, value in environ.items():
        setting = by_env.get(variable)
        if setting is None:
            if strict and variable.startswith(env_prefix) and variable not in skip:
                name = variable[len(env_prefix) :].lower()
                raise _unknown(settings, name, f"environment variable {variable}")
            continue
        try:
            out[setting.name] = setting.type(value)
        except ValueError as exc:
            raise SettingsError(f"environment variable {variable}: {exc}") from None
    return out


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Returns a TOML file's contents; a missing or malformed file is a SettingsError."""
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]
    try:
        with open(path, "rb") as file:
            data: dict[str, Any] = tomllib.load(file)
            return data
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None


def add_arguments(parser: argparse.ArgumentParser, settings: Iterable[Setting], title: str) -> None:
    """Adds one ``--option`` per setting; an option not given is None (meaning: not given)."""
    group = parser.add_argument_group(title)
    for setting in settings:
        metavar = {"list": "A,B", "labels": "K=V,K=V"}.get(setting.kind, setting.kind.upper())
        group.add_argument(
            setting.flag,
            dest=f"setting_{setting.name}",
            default=None,
            metavar=metavar,
            help=f"{setting.help} [default: {render_default(setting)}]".replace("%", "%%"),
        )


def option_values(settings: Iterable[Setting], namespace: argparse.Namespace) -> dict[str, Any]:
    """Reads the options ``add_arguments`` added that were given on the command line."""
    out = {}
    for setting in settings:
        value = getattr(namespace, f"setting_{setting.name}", None)
        if value is not None:
            try:
                out[setting.name] = setting.accept(value, text=True)
            except ValueError as exc:
                raise SettingsError(f"option {setting.flag}: {exc}") from None
    return out


# -- docs -------------------------------------------------------------------------------------


def render_default(setting: Setting) -> str:
    """The default as the docs and ``--help`` show it."""
    value = setting.default
    if value is None:
        return "none"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "(none)"
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value) or "(none)"
    if value == "":
        return "(empty)"
    return str(value)


def markdown_table(
    settings: Iterable[Setting], *, meaning: str = "meaning", types: bool = False
) -> str:
    """Renders the reference table of ``settings`` that the docs embed."""
    head = ["setting", "environment variable", *(["type"] if types else []), "default", meaning]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in settings:
        default = render_default(s).replace("|", "\\|")
        kind = [s.kind] if types else []
        cells = [f"`{s.name}`", f"`{s.env_var}`", *kind, f"`{default}`", s.help]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
