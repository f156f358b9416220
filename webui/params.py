"""Reads API query parameters into windows and filters; errors name the parameter.

Pure: the caller passes the query arguments (anything with ``get`` and ``getlist``, such as
Flask's ``request.args``) and the current time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sampler.profile import LIMITS, MODES, WindowError, label_param, parse_label, parse_window

__all__ = [
    "MODES",
    "ParamError",
    "Selection",
    "label_param",
    "parse_choice",
    "parse_compare",
    "parse_float",
    "parse_int",
    "parse_label",
    "parse_selection",
]

N = TypeVar("N", int, float)
# Parameters that filter on a column rather than a label.
_COLUMNS = {"service": "services", "host": "hosts", "instance": "instances"}


class Args(Protocol):
    """Query arguments: Flask's MultiDict or anything alike."""

    def get(self, key: str, default: Any = None) -> Any: ...

    def getlist(self, key: str) -> list[str]: ...


class ParamError(ValueError):
    """A query parameter is missing or malformed; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


@dataclass(frozen=True)
class Selection:
    """One side of a query: a window [start, end) and the filters on the samples."""

    start: int
    end: int
    mode: str = "cpu"
    services: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = field(default=())

    def describe(self) -> str:
        """Returns a short human description of the filters (for titles and exports)."""
        parts = [*self.services, *(f"host={h}" for h in self.hosts)]
        parts += [f"instance={i}" for i in self.instances]
        parts += [f"{k}={v}" for k, v in self.labels]
        return " ".join(parts) or "all services"


def _values(args: Args, name: str) -> list[str]:
    """The parameter's values exactly as given (an empty one filters nothing): a stored name
    may hold spaces at its ends, tabs, any character but NUL."""
    values = [value for value in args.getlist(name) if value]
    for value in values:
        _check(name, value, "the value", LIMITS.max_name)
    return values


def _check(param: str, text: str, what: str, longest: int) -> None:
    """Refuses text no stored name or value can be: longer than the store takes, or with a
    NUL (which PostgreSQL cannot even be asked for)."""
    if len(text) > longest:
        raise ParamError(
            param,
            f"{what} is {len(text):,} characters long, more than the store holds ({longest:,})",
        )
    if "\x00" in text:
        raise ParamError(param, f"{what} holds a NUL character, which no stored name holds")


def _text(args: Args, name: str, default: str) -> str:
    text = args.get(name)
    return default if text is None or not text.strip() else text


def _window(args: Args, prefix: str, start: str, end: str, now: int) -> tuple[int, int]:
    """Reads ``from`` and ``to`` (with the prefix), ``start`` and ``end`` where missing."""
    names = {"start": prefix + "from", "end": prefix + "to"}
    try:
        window = parse_window(
            _text(args, names["start"], start), _text(args, names["end"], end), now
        )
    except WindowError as exc:
        raise ParamError(names[exc.side], str(exc)) from None
    return window.start, window.end


def _labels(args: Args, name: str) -> list[tuple[str, str]]:
    labels = []
    for item in args.getlist(name):
        if not item:
            continue
        label = parse_label(item)
        if label is None or not label[0]:
            raise ParamError(
                name,
                f"expected key:value (e.g. version:1.4.2; a key holding ':' as a JSON string, "
                f'"k:1":value), got {item[:80]!r}',
            )
        key, value = label
        _check(name, key, "the key", LIMITS.max_name)
        _check(name, value, "the value", LIMITS.max_text)
        labels.append(label)
    return labels


def parse_selection(
    args: Args,
    now: int,
    *,
    default_window: str = "-1h",
    prefix: str = "",
    base: Selection | None = None,
) -> Selection:
    """Reads ``from``, ``to``, ``mode``, ``service``, ``host``, ``instance`` and ``label``.

    With a ``prefix`` (``a_`` or ``b_``) the prefixed parameters are read on top of ``base``:
    a prefixed window replaces the base window, prefixed filters are added to the base's.
    """
    if base is None:
        start, end = _window(args, "", default_window, "now", now)
        mode = args.get("mode") or "cpu"
        if mode not in MODES:
            raise ParamError("mode", f"{mode[:20]!r} is not one of {', '.join(MODES)}")
        filters: dict[str, list[Any]] = {"services": [], "hosts": [], "instances": [], "labels": []}
    else:
        start, end = _window(args, prefix, str(base.start), str(base.end), now)
        mode = base.mode
        filters = {
            "services": list(base.services),
            "hosts": list(base.hosts),
            "instances": list(base.instances),
            "labels": list(base.labels),
        }
    for param, attribute in _COLUMNS.items():
        filters[attribute] += _values(args, prefix + param)
    filters["labels"] += _labels(args, prefix + "label")
    return Selection(
        start,
        end,
        mode,
        tuple(filters["services"]),
        tuple(filters["hosts"]),
        tuple(filters["instances"]),
        tuple(filters["labels"]),
    )


def parse_compare(
    args: Args, now: int, *, default_window: str = "-1h"
) -> tuple[Selection, Selection]:
    """Reads the two sides of a comparison: shared parameters, then ``a_*`` and ``b_*`` ones."""
    base = parse_selection(args, now, default_window=default_window)
    return (
        parse_selection(args, now, prefix="a_", base=base),
        parse_selection(args, now, prefix="b_", base=base),
    )


def parse_int(args: Args, name: str, default: int, low: int, high: int) -> int:
    """Reads an integer parameter within [low, high]."""
    return _number(args, name, default, low, high, int, "a whole number")


def parse_float(args: Args, name: str, default: float, low: float, high: float) -> float:
    """Reads a number parameter within [low, high]."""
    return _number(args, name, default, low, high, float, "a number")


def _number(
    args: Args, name: str, default: N, low: N, high: N, kind: Callable[[str], N], what: str
) -> N:
    text = args.get(name)
    if text is None or text == "":
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ParamError(name, f"{text[:20]!r} is not {what}") from None
    if value != value or not low <= value <= high:  # NaN is no number in any range
        raise ParamError(name, f"must be between {low} and {high}, got {text[:20]}")
    return value


def parse_choice(args: Args, name: str, choices: tuple[str, ...]) -> str:
    """Reads a parameter that takes one of ``choices`` (the first is the default)."""
    value = args.get(name) or choices[0]
    if value not in choices:
        raise ParamError(name, f"{value[:20]!r} is not one of {', '.join(choices)}")
    return value
