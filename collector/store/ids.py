"""The ids of stacks, label sets, series and fleet series: hashes of their canonical text.

Every id is a signed 64-bit BLAKE2b hash, so the writer knows the id of what it writes
without asking the database, and two collectors sharing one database agree on every id.
Pure module; ids never change once stored (migrations that compute them keep a frozen copy).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from sampler.profile import DEFAULT_INTERVAL

__all__ = [
    "INSTANCE_LABELS",
    "event_id",
    "fleet_id",
    "fleet_labels",
    "label_set_id",
    "labels_text",
    "series_id",
    "stack_id",
]

# Labels that name one instance (the Kubernetes discovery labels each pod's target with its
# pod and node): a fleet series leaves them out, or it would be one per instance.
INSTANCE_LABELS = frozenset({"pod", "node"})


def fleet_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    """Returns the labels a fleet series keeps: all but INSTANCE_LABELS."""
    if INSTANCE_LABELS.isdisjoint(labels):
        return labels
    return {k: v for k, v in labels.items() if k not in INSTANCE_LABELS}


def _hash64(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def stack_id(stack: str) -> int:
    """Returns the id of a folded stack: a signed 64-bit hash of its text."""
    return _hash64(stack)


def event_id(instance: str, number: int) -> int:
    """Returns the id of a sampler instance's numbered event (a stall): a 64-bit hash."""
    return _hash64(f"{instance}\0{number}")


def labels_text(labels: Mapping[str, str]) -> str:
    """Returns the canonical JSON text of a label set (sorted keys, no spaces)."""
    return json.dumps(dict(sorted(labels.items())), ensure_ascii=False, separators=(",", ":"))


def label_set_id(text: str) -> int:
    """Returns the id of a label set from its canonical text."""
    return _hash64("labels\x00" + text)


def series_id(
    mode: str,
    service: str,
    host: str,
    instance: str,
    labels_id: int,
    interval: float = DEFAULT_INTERVAL,
) -> int:
    """Returns the id of a series; NUL cannot occur in the parts, so it separates them. The
    default interval adds nothing, so ids from before intervals were stored still match."""
    parts = ["series", mode, service, host, instance, str(labels_id)]
    if interval != DEFAULT_INTERVAL:
        parts.append(repr(float(interval)))
    return _hash64("\x00".join(parts))


def fleet_id(mode: str, service: str, labels_id: int, interval: float) -> int:
    """Returns the id of a fleet series: a series without its host and instance."""
    return _hash64("\x00".join(("fleet", mode, service, str(labels_id), repr(float(interval)))))
