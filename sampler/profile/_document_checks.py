"""The checks ``validate_document`` makes of a /profile.json document, field by field.

Each names the field it refuses in its ``DocumentError``; the stacks take one fast check an
entry, and the detailed ones only to explain an entry that failed it.
"""

from __future__ import annotations

import math
import re

from .document import FORMAT_MAJOR, DocumentError
from .frames import stack_problem
from .profiles import MODES

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from .document import Key, Limits

_FORMAT_PREFIX = "fleetflame.profile/"
_MAJOR = "1"

# What cannot be stored: NUL (PostgreSQL text) and lone surrogates (UTF-8); stacks also never
# hold control characters (frames are escaped) nor empty frames.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def _fail(field_name: str, problem: str) -> DocumentError:
    return DocumentError(f"/profile.json field {field_name!r}: {problem}")


def _text(value: Any, name: str, limit: int, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _fail(name, f"expected a string, got {type(value).__name__}")
    if not empty and not value:
        raise _fail(name, "must not be empty")
    if len(value) > limit:
        raise _fail(name, f"longer than {limit} characters")
    if _UNSTORABLE.search(value):
        raise _fail(name, "contains a NUL character or a lone surrogate")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(name, f"expected a finite number, got {value!r:.40}")
    return float(value)


def _integer(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, f"expected a whole number, got {value!r:.40}")
    if not low <= value <= high:
        raise _fail(name, f"{value} is outside {low}..{high}")
    return value


def _labels(value: Any, name: str, limits: Limits) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _fail(name, f"expected an object of strings, got {type(value).__name__}")
    if len(value) > limits.max_labels:
        raise _fail(name, f"more than {limits.max_labels} labels")
    for key, item in value.items():
        _text(key, f"{name} key", limits.max_name, empty=False)
        _text(item, f"{name}[{key!r}]", limits.max_text)
    return value


def check_head(doc: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Checks every field but the stacks; returns them by Document's names."""
    fmt = doc.get("format")
    if not isinstance(fmt, str) or not fmt.startswith(_FORMAT_PREFIX):
        raise _fail("format", f"expected {FORMAT_MAJOR!r}, got {fmt!r:.60}")
    if fmt[len(_FORMAT_PREFIX) :].split(".", 1)[0] != _MAJOR:
        raise _fail("format", f"version {fmt!r:.60} is not supported (this reader reads /{_MAJOR})")
    instance = doc.get("instance")
    if not isinstance(instance, dict):
        raise _fail("instance", "expected an object")
    fields = {
        "instance_id": _text(instance.get("id"), "instance.id", limits.max_name, empty=False),
        "pid": _integer(instance.get("pid", 0), "instance.pid", 0, 2**31),
        "host": _text(instance.get("host", ""), "instance.host", limits.max_name),
        "start_time": _number(instance.get("start_time", 0.0), "instance.start_time"),
        "labels": _labels(doc.get("labels", {}), "labels", limits),
    }
    mode = doc.get("mode")
    if mode not in MODES:
        raise _fail("mode", f"expected 'cpu' or 'wall', got {mode!r:.40}")
    interval = _number(doc.get("interval"), "interval")
    if not 0 < interval <= 60:
        raise _fail("interval", f"{interval} is outside (0, 60] seconds")
    generation = _integer(doc.get("generation", 0), "generation", 0, 2**63 - 1)
    fields.update(
        mode=mode,
        interval=interval,
        time=_number(doc.get("time"), "time"),
        total_samples=_integer(doc.get("total_samples", 0), "total_samples", 0, 2**63 - 1),
        generation=generation,
        since=_integer(doc.get("since", 0), "since", 0, generation),
    )
    raw_sets = doc.get("label_sets", [{}])
    if not isinstance(raw_sets, list) or not raw_sets:
        raise _fail("label_sets", "expected a non-empty list of objects")
    if len(raw_sets) > limits.max_label_sets:
        raise _fail("label_sets", f"more than {limits.max_label_sets} label sets")
    label_sets = tuple(_labels(s, f"label_sets[{i}]", limits) for i, s in enumerate(raw_sets))
    fields["label_sets"] = label_sets
    # Each set once: two entries of one set would share one counter between them, each
    # count read as the other's growth or reset.
    seen: dict[frozenset[tuple[str, str]], int] = {}
    for i, labels in enumerate(label_sets):
        first = seen.setdefault(frozenset(labels.items()), i)
        if first != i:
            raise _fail(f"label_sets[{i}]", f"the same labels as label_sets[{first}]")
    return fields


def check_stacks(raw_stacks: Any, n_sets: int, limits: Limits, escaped: bool) -> dict[Key, int]:
    """Checks the stacks of a document; returns their counts by (label set, stack)."""
    if not isinstance(raw_stacks, list):
        raise _fail("stacks", "expected a list of [label_set, stack, count]")
    if len(raw_stacks) > limits.max_stacks:
        raise _fail(
            "stacks", f"{len(raw_stacks)} entries, more than the limit of {limits.max_stacks}"
        )
    stacks: dict[Key, int] = {}
    max_count, max_stack = limits.max_count, limits.max_stack
    control = _CONTROL.search if escaped else None
    for i, entry in enumerate(raw_stacks):
        # One fast path check per entry; the detailed checks only run to explain a failure.
        if (
            type(entry) is list
            and len(entry) == 3
            and type(entry[0]) is int
            and 0 <= entry[0] < n_sets
            and type(entry[1]) is str
            and 0 < len(entry[1]) <= max_stack
            and type(entry[2]) is int
            and 0 <= entry[2] <= max_count
            and ";;" not in entry[1]
            and entry[1][0] != ";"
            and entry[1][-1] != ";"
            and (control is None or control(entry[1]) is None)
        ):
            key = (entry[0], entry[1])
            stacks[key] = stacks.get(key, 0) + entry[2]
            continue
        raise _explain_entry(entry, i, n_sets, limits)
    return stacks


def _explain_entry(entry: Any, i: int, n_sets: int, limits: Limits) -> DocumentError:
    name = f"stacks[{i}]"
    if not isinstance(entry, list) or len(entry) != 3:
        return _fail(name, f"expected [label_set, stack, count], got {entry!r:.80}")
    index, stack, count = entry
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n_sets:
        return _fail(name, f"label set index {index!r:.20} is not one of 0..{n_sets - 1}")
    if isinstance(stack, str) and stack and len(stack) <= limits.max_stack:
        if isinstance(count, bool) or not isinstance(count, int):
            return _fail(name, f"count must be a whole number, got {count!r:.40}")
        if count < 0:
            return _fail(name, f"count {count} is negative")
        if count > limits.max_count:
            return _fail(name, f"count {count} is absurd (over {limits.max_count})")
    return _fail(name, stack_problem(stack, limits.max_stack) or "not a valid entry")
