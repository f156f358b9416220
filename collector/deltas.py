"""From a target's cumulative /profile.json snapshots to the samples gained since the last one.

Pure: documents and cursor state in, sample rows and cursor updates out; no I/O, no clock.
Counts from a worker only grow for a given ``instance.id``. A new id (a restart or a fork)
means every count is new; a count that goes down for the same id is a reset of that counter,
so its whole new value is new. A delta is never negative.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from collector.store import CursorUpdate, SampleRow

__all__ = [
    "FORMAT_MAJOR",
    "Delta",
    "Limits",
    "Profile",
    "ProfileError",
    "TargetState",
    "compute_delta",
    "decode_profile",
    "validate_profile",
]

FORMAT_MAJOR = "fleetflame.profile/1"

Key = tuple[int, str]  # (label set id, folded stack)

# What the store cannot hold: NUL (PostgreSQL text) and lone surrogates (UTF-8); stacks also
# never hold control characters (the sampler escapes them) nor empty frames.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


class ProfileError(ValueError):
    """A /profile.json document is malformed or out of bounds; the message names the field."""


@dataclass(frozen=True)
class Limits:
    """Sanity bounds a document must respect to be accepted."""

    max_stacks: int = 200_000
    max_count: int = 10**12  # a cumulative count: 300 years of one thread at 100 Hz
    max_delta: int = 10**9  # growth of one count between two polls (the store's row limit)
    max_label_sets: int = 10_000
    max_labels: int = 64
    max_name: int = 256  # characters in service, host, instance id, label key
    max_text: int = 1024  # characters in a label value
    max_stack: int = 65_536  # characters in one folded stack


@dataclass(frozen=True)
class Profile:
    """A validated /profile.json document."""

    instance_id: str
    pid: int
    host: str
    start_time: float
    labels: Mapping[str, str]
    mode: str
    interval: float
    time: float
    total_samples: int
    label_sets: tuple[Mapping[str, str], ...]
    stacks: Mapping[Key, int]  # (label set index, stack) -> cumulative count
    generation: int = 0  # the sampler's tick number at this snapshot (0: not told)
    since: int = 0  # non-zero: only stacks counted after that tick are listed


@dataclass
class TargetState:
    """What the collector last saw from one target: instance id and cumulative counts."""

    instance: str
    counts: dict[Key, int] = field(default_factory=dict)
    label_sets: dict[int, Mapping[str, str]] = field(default_factory=dict)
    generation: int = 0  # the sampler tick these counts are complete up to (0: unknown)

    def since_query(self) -> str:
        """The query asking the target for what changed since these counts ("" if unknown)."""
        if not self.generation:
            return ""
        return f"?since={self.generation}&instance={quote(self.instance, safe='')}"


@dataclass(frozen=True)
class Delta:
    """The outcome of one snapshot: rows to store, the cursor update and the new state."""

    rows: list[SampleRow]
    cursor: CursorUpdate | None  # None when nothing changed
    state: TargetState
    new_instance: bool
    resets: int  # counters that went down (counted as new from zero)
    samples: int  # sum of the rows' counts


def _fail(field_name: str, problem: str) -> ProfileError:
    return ProfileError(f"/profile.json field {field_name!r}: {problem}")


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


def validate_profile(doc: Any, limits: Limits = Limits(), *, escaped: bool = True) -> Profile:
    """Checks a decoded /profile.json document against the wire format and the limits.

    ``escaped=False`` says the JSON text held no backslash escape and no DEL: then no string in
    it can hold a control character or a surrogate (JSON forbids them raw, UTF-8 cannot encode
    surrogates), and the per-stack scan for them is skipped. The sampler escapes ``\\`` and
    ``"`` in frame names, so its documents always take that fast path.
    """
    if not isinstance(doc, dict):
        raise ProfileError(f"/profile.json: expected a JSON object, got {type(doc).__name__}")
    fmt = doc.get("format")
    if not isinstance(fmt, str) or not fmt.startswith("fleetflame.profile/"):
        raise _fail("format", f"expected {FORMAT_MAJOR!r}, got {fmt!r:.60}")
    if fmt.split("/", 1)[1].split(".", 1)[0] != "1":
        raise _fail("format", f"version {fmt!r:.60} is not supported (this collector reads /1)")
    instance = doc.get("instance")
    if not isinstance(instance, dict):
        raise _fail("instance", "expected an object")
    instance_id = _text(instance.get("id"), "instance.id", limits.max_name, empty=False)
    pid = _integer(instance.get("pid", 0), "instance.pid", 0, 2**31)
    host = _text(instance.get("host", ""), "instance.host", limits.max_name)
    start_time = _number(instance.get("start_time", 0.0), "instance.start_time")
    labels = _labels(doc.get("labels", {}), "labels", limits)
    mode = doc.get("mode")
    if mode not in ("cpu", "wall"):
        raise _fail("mode", f"expected 'cpu' or 'wall', got {mode!r:.40}")
    interval = _number(doc.get("interval"), "interval")
    if not 0 < interval <= 60:
        raise _fail("interval", f"{interval} is outside (0, 60] seconds")
    time = _number(doc.get("time"), "time")
    total = _integer(doc.get("total_samples", 0), "total_samples", 0, 2**63 - 1)
    generation = _integer(doc.get("generation", 0), "generation", 0, 2**63 - 1)
    since = _integer(doc.get("since", 0), "since", 0, generation)
    raw_sets = doc.get("label_sets", [{}])
    if not isinstance(raw_sets, list) or not raw_sets:
        raise _fail("label_sets", "expected a non-empty list of objects")
    if len(raw_sets) > limits.max_label_sets:
        raise _fail("label_sets", f"more than {limits.max_label_sets} label sets")
    label_sets = tuple(_labels(s, f"label_sets[{i}]", limits) for i, s in enumerate(raw_sets))
    raw_stacks = doc.get("stacks")
    if not isinstance(raw_stacks, list):
        raise _fail("stacks", "expected a list of [label_set, stack, count]")
    if len(raw_stacks) > limits.max_stacks:
        raise _fail(
            "stacks", f"{len(raw_stacks)} entries, more than the limit of {limits.max_stacks}"
        )
    stacks: dict[Key, int] = {}
    n_sets, max_count, max_stack = len(label_sets), limits.max_count, limits.max_stack
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
    return Profile(
        instance_id=instance_id,
        pid=pid,
        host=host,
        start_time=start_time,
        labels=labels,
        mode=mode,
        interval=interval,
        time=time,
        total_samples=total,
        label_sets=label_sets,
        stacks=stacks,
        generation=generation,
        since=since,
    )


def _explain_entry(entry: Any, i: int, n_sets: int, limits: Limits) -> ProfileError:
    name = f"stacks[{i}]"
    if not isinstance(entry, list) or len(entry) != 3:
        return _fail(name, f"expected [label_set, stack, count], got {entry!r:.80}")
    index, stack, count = entry
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n_sets:
        return _fail(name, f"label set index {index!r:.20} is not one of 0..{n_sets - 1}")
    if not isinstance(stack, str) or not stack:
        return _fail(name, f"stack must be a non-empty string, got {stack!r:.40}")
    if len(stack) > limits.max_stack:
        return _fail(name, f"stack longer than {limits.max_stack} characters")
    if isinstance(count, bool) or not isinstance(count, int):
        return _fail(name, f"count must be a whole number, got {count!r:.40}")
    if count < 0:
        return _fail(name, f"count {count} is negative")
    if count > limits.max_count:
        return _fail(name, f"count {count} is absurd (over {limits.max_count})")
    return _fail(name, f"stack {stack[:60]!r} holds a control character or an empty frame")


def decode_profile(raw: bytes, limits: Limits = Limits()) -> Profile:
    """Decodes and validates the bytes of a /profile.json response."""
    try:
        # Strict UTF-8: json.loads would let encoded surrogates through from bytes.
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProfileError(f"/profile.json is not valid UTF-8: {str(exc)[:120]}") from None
    except (ValueError, RecursionError) as exc:
        raise ProfileError(f"/profile.json is not valid JSON: {str(exc)[:120]}") from None
    return validate_profile(doc, limits, escaped=b"\\" in raw or b"\x7f" in raw)


def _canonical(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _assign_ids(
    profile: Profile, previous: TargetState | None
) -> tuple[list[int], dict[int, Mapping[str, str]]]:
    """Maps the document's label set indexes to cursor ids, reusing ids of known label sets."""
    if previous is None:
        return list(range(len(profile.label_sets))), dict(enumerate(profile.label_sets))
    known = {_canonical(labels): ident for ident, labels in previous.label_sets.items()}
    next_id = max(previous.label_sets, default=-1) + 1
    ids: list[int] = []
    added: dict[int, Mapping[str, str]] = {}
    for labels in profile.label_sets:
        ident = known.get(_canonical(labels))
        if ident is None:
            ident = known[_canonical(labels)] = next_id
            added[ident] = labels
            next_id += 1
        ids.append(ident)
    return ids, added


def compute_delta(
    target: str,
    target_labels: Mapping[str, str],
    previous: TargetState | None,
    profile: Profile,
    *,
    bucket: int,
    max_delta: int = Limits.max_delta,
) -> Delta:
    """Returns the samples ``profile`` gained over ``previous`` as rows in ``bucket``.

    Raises ProfileError when a count grew by more than ``max_delta`` (nothing is consumed,
    so the growth is not lost if the next snapshot is sane again).
    """
    if profile.since and (
        previous is None
        or previous.instance != profile.instance_id
        or previous.generation != profile.since
    ):
        if previous is not None:
            previous.generation = 0  # ask for everything next time
        raise ProfileError(
            f"/profile.json lists what changed since tick {profile.since}, which is not the"
            " snapshot the collector holds; the next poll reads every stack"
        )
    new_instance = previous is None or previous.instance != profile.instance_id
    base = None if new_instance else previous
    ids, added_sets = _assign_ids(profile, base)
    old_counts: Mapping[Key, int] = base.counts if base is not None else {}

    # Row labels: the sample's label set, then process labels, then the target's (operator wins).
    row_labels: list[tuple[str, str, dict[str, str]]] = []
    for labels in profile.label_sets:
        merged = {**labels, **profile.labels, **target_labels}
        service = merged.pop("service", "") or "unknown"
        host = merged.pop("host", "") or profile.host or target.rsplit(":", 1)[0]
        row_labels.append((service, host, merged))

    changed: dict[Key, int] = {}
    gained: dict[tuple[int, str], int] = {}
    resets = 0
    for (index, stack), count in profile.stacks.items():
        key = (ids[index], stack)
        old = old_counts.get(key, 0)
        if count == old:
            continue
        changed[key] = count
        if count < old:
            resets += 1
            diff = count
        else:
            diff = count - old
        if diff > max_delta:
            raise ProfileError(
                f"/profile.json stack {stack[:60]!r} grew by {diff} samples since the last poll,"
                f" more than the limit of {max_delta}"
            )
        if diff > 0:
            gained[(index, stack)] = diff

    # Two label sets can merge into one row once target labels override theirs: sum them.
    merged_rows: dict[tuple[str, str, tuple[tuple[str, str], ...], str], SampleRow] = {}
    samples = 0
    for (index, stack), diff in gained.items():
        service, host, labels = row_labels[index]
        row_key = (service, host, _canonical(labels), stack)
        existing = merged_rows.get(row_key)
        if existing is not None:
            diff += existing.count
        merged_rows[row_key] = SampleRow(
            bucket=bucket,
            mode=profile.mode,
            service=service,
            host=host,
            instance=profile.instance_id,
            labels=labels,
            stack=stack,
            count=diff,
        )
        samples += gained[(index, stack)]

    if base is None:
        state = TargetState(
            profile.instance_id, dict(changed), dict(added_sets), profile.generation
        )
    else:
        state = TargetState(
            profile.instance_id,
            {**base.counts, **changed},
            {**base.label_sets, **added_sets},
            profile.generation,
        )
    cursor = None
    if new_instance or changed or added_sets:
        cursor = CursorUpdate(
            target=target,
            instance=profile.instance_id,
            replaced=new_instance,
            counts=changed,
            label_sets=added_sets,
        )
    return Delta(
        rows=list(merged_rows.values()),
        cursor=cursor,
        state=state,
        new_instance=new_instance,
        resets=resets,
        samples=samples,
    )


def merge_cursor_updates(first: CursorUpdate, second: CursorUpdate) -> CursorUpdate:
    """Folds two consecutive cursor updates of one target into one with the same effect."""
    if second.replaced or first.instance != second.instance:
        return second
    return CursorUpdate(
        target=second.target,
        instance=second.instance,
        replaced=first.replaced,
        counts={**first.counts, **second.counts},
        label_sets={**first.label_sets, **second.label_sets},
    )
