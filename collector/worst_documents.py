"""Reading a worker's /stalls.json and /requests.json into the rows the worst cases keep.

Pure: what the collector's worst-cases job (collector.worst) read from a worker goes in, rows
for stall_events and request_buckets come out. A stall becomes one row, keyed by its sampler
instance and id. A route's request figures are cumulative per sampler series
(docs/wire-format.md): ``route_delta`` gives what it added since the last read (its count,
errors, the bins of its latency, queueing and total sketches, its slowest 1%'s stacks, its
slowest requests not seen before). A worker's document is input: what is not what the sampler
serves raises BadDocument (or SketchError, ValueError, ...), and a bad entry in a list of the
slowest requests is left out rather than costing the route its row.
"""

from __future__ import annotations

import json
import math
from typing import Any

from collector.request_rows import SKETCHES, pack_sketch
from collector.store.ids import event_id
from sampler._sketch import Sketch

__all__ = ["BadDocument", "labels_of", "route_delta", "sketch_delta", "stall_row", "text_of"]

MAX_SLOWEST = 20  # slowest requests read from a route (a worker lists 5)
MAX_SLOW_STACKS = 50  # stacks of one slow request (a worker lists 20)


class BadDocument(ValueError):
    """A document that is not what the sampler serves."""


def sketch_delta(current: Sketch, before: Sketch | None) -> Sketch:
    """What was added to ``current`` since ``before`` (an earlier read of the same sketch)."""
    if before is None:
        return current
    delta = Sketch(current.alpha, current.min_value, current.max_bins)
    for index, count in current.bins.items():
        added = count - before.bins.get(index, 0)
        if added > 0:
            delta.bins[index] = added
    delta.zero = max(0, current.zero - before.zero)
    delta.count = max(0, current.count - before.count)
    delta.sum = max(0.0, current.sum - before.sum)
    delta.max = (
        current.max
        if current.max > before.max
        else (delta.value_of(max(delta.bins)) if delta.bins else 0.0)
    )
    return delta


def route_delta(part: dict, before: dict | None, host: str) -> dict | None:
    """What a route of /requests.json added since ``before`` (its part of the last read), as
    a request_buckets row without its key; None when it served no request since."""
    count = int(part["count"]) - (int(before["count"]) if before else 0)
    if count <= 0:
        return None
    sketches = {}
    for name in SKETCHES:
        current = Sketch.from_document(part[name])
        previous = Sketch.from_document(before[name]) if before else None
        sketches[name] = pack_sketch(sketch_delta(current, previous))
    slow = part.get("slow") or {"count": 0, "stacks": {}}
    slow_before = (before or {}).get("slow") or {"count": 0, "stacks": {}}
    stacks = {}
    for stack, weight in dict(slow["stacks"]).items():
        added = float(weight) - float(slow_before["stacks"].get(stack, 0))
        if added > 0:
            stacks[text_of(stack, "stack")] = round(added, 2)
    seen_ids = {r["id"] for r in _slow_requests((before or {}).get("slowest"), host)}
    slowest = [r for r in _slow_requests(part.get("slowest"), host) if r["id"] not in seen_ids]
    return {
        "count": count,
        "errors": max(0, int(part.get("errors", 0)) - int((before or {}).get("errors", 0))),
        "sketches": json.dumps(sketches),
        "slow": json.dumps(
            {
                "count": max(0, int(slow["count"]) - int(slow_before["count"])),
                "stacks": stacks,
                "slowest": slowest[:5],
            }
        ),
    }


def _slow_requests(listed: Any, host: str) -> list[dict]:
    """The slowest requests of a route as /requests.json lists them, each rebuilt from the
    fields a row keeps, with the ``host`` it ran on; an entry that is not one is left out
    (the worker's document is input: a bad entry must cost itself, not the route's rows)."""
    kept = []
    for r in listed[:MAX_SLOWEST] if isinstance(listed, list) else []:
        if not isinstance(r, dict):
            continue
        ident, duration, start = r.get("id"), r.get("duration"), r.get("start")
        stacks, queue = r.get("stacks"), r.get("queue")
        if not (
            _whole(ident)
            and _seconds(duration)
            and _seconds(start)
            and (queue is None or _seconds(queue))
            and isinstance(stacks, dict)
        ):
            continue
        kept.append(
            {
                "id": ident,
                "start": float(start),
                "duration": float(duration),
                "queue": None if queue is None else float(queue),
                "thread": str(r.get("thread", ""))[:200],
                "status": r.get("status") if _whole(r.get("status")) else 0,
                "path": str(r.get("path", ""))[:2000],
                "host": host,  # where it ran, once merged with other instances' rows
                "stacks": {
                    stack: float(weight)
                    for stack, weight in list(stacks.items())[:MAX_SLOW_STACKS]
                    if isinstance(stack, str) and len(stack) <= 10_000 and _seconds(weight)
                },
            }
        )
    return kept


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seconds(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def stall_row(stall: Any, instance: str, labels: dict[str, str]) -> dict:
    """The stall_events row of a stall of /stalls.json, read from ``instance``."""
    if not isinstance(stall, dict):
        raise BadDocument("a stall is not an object")
    stacks = stall.get("stacks") or {}
    wall = {text_of(s, "stack"): int(c) for s, c in dict(stacks.get("wall") or {}).items()}
    cpu = {text_of(s, "stack"): float(c) for s, c in dict(stacks.get("cpu") or {}).items()}
    duration, start = float(stall["duration"]), float(stall["start"])
    if not (0 <= duration < 86400 * 7 and 0 < start < 1e11):
        raise BadDocument(f"a stall of {duration!r} s at {start!r}")
    return {
        "id": event_id(instance, int(stall["id"])),
        "start": start,
        "duration": duration,
        "service": labels.get("service", ""),
        "host": labels.get("host", ""),
        "instance": instance,
        "kind": text_of(stall["kind"], "kind")[:16],
        "thread": text_of(stall.get("thread", "?"), "thread"),
        "what": text_of(stall.get("what", ""), "what"),
        "stacks": json.dumps({"wall": wall, "cpu": cpu}),
    }


def labels_of(document: dict) -> dict[str, str]:
    """The labels of a document, each key and value cut to 200 characters."""
    labels = document.get("labels") or {}
    if not isinstance(labels, dict):
        raise BadDocument("labels is not an object")
    return {str(k)[:200]: str(v)[:200] for k, v in labels.items()}


def text_of(value: Any, what: str, limit: int = 10_000) -> str:
    """``value`` if it is a string of at most ``limit`` characters; else BadDocument."""
    if not isinstance(value, str) or len(value) > limit:
        raise BadDocument(f"{what} is not a string of at most {limit} characters")
    return value
