"""The wire format's document, ``/profile.json``: its version, limits, building and checking.

The sampler builds it, ``fleetflame attach`` builds it for a process read with py-spy, and the
collector checks every document it reads against it (docs/wire-format.md; the checks, field by
field, are in ``_document_checks``). Pure: the caller passes the time and every value in; json
is imported where a document is encoded or decoded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .frames import MAX_LABELS, MAX_NAME, MAX_TEXT
from .profiles import Profile

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "FORMAT_MAJOR",
    "LIMITS",
    "WIRE_FORMAT",
    "Document",
    "DocumentError",
    "Limits",
    "build_document",
    "decode_document",
    "document_head",
    "encode_document",
    "validate_document",
]

WIRE_FORMAT = "fleetflame.profile/1"
FORMAT_MAJOR = WIRE_FORMAT  # what a reader accepts: this major version, any minor one

Key = tuple[int, str]  # (label set index, folded stack)


class DocumentError(ValueError):
    """A /profile.json document is malformed or out of bounds; the message names the field."""


class _Frozen:
    """Attributes set once, by ``__init__``; compared and shown by value."""

    __slots__ = ()

    def _set(self, values: Mapping[str, object]) -> None:
        """Sets each attribute from ``values`` by its name (``__init__`` passes locals())."""
        for name in self._names():
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: make a new one")

    def _names(self) -> tuple[str, ...]:
        names: tuple[str, ...] = getattr(type(self), "__slots__")  # noqa: B009 - each class's own
        return names

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._names())

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Frozen)
        return self._values() == other._values()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._names())
        return f"{type(self).__name__}({fields})"


class Limits(_Frozen):
    """Bounds a document must respect to be accepted (the store's rows repeat none of them:
    collector.store takes its name, label and stack limits from here)."""

    __slots__ = (
        "max_stacks",
        "max_count",
        "max_delta",
        "max_label_sets",
        "max_labels",
        "max_name",
        "max_text",
        "max_stack",
    )
    max_stacks: int
    max_count: int
    max_delta: int
    max_label_sets: int
    max_labels: int
    max_name: int
    max_text: int
    max_stack: int

    def __init__(
        self,
        *,
        max_stacks: int = 200_000,
        max_count: int = 10**12,  # a cumulative count: 300 years of one thread at 100 Hz
        max_delta: int = 10**9,  # growth of one count between two polls (the store's row limit)
        max_label_sets: int = 10_000,
        max_labels: int = MAX_LABELS,
        max_name: int = MAX_NAME,  # characters in service, host, instance id, label key
        max_text: int = MAX_TEXT,  # characters in a label value
        max_stack: int = 65_536,  # characters in one folded stack
    ) -> None:
        self._set(locals())

    def __hash__(self) -> int:
        return hash(self._values())


LIMITS = Limits()  # the defaults: what the collector accepts unless configured otherwise


class Document(_Frozen):
    """A validated /profile.json document."""

    __slots__ = (
        "instance_id",
        "pid",
        "host",
        "start_time",
        "labels",
        "mode",
        "interval",
        "time",
        "total_samples",
        "label_sets",
        "stacks",
        "generation",
        "since",
    )
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
    generation: int  # the sampler's tick number at this snapshot (0: not told)
    since: int  # non-zero: only stacks counted after that tick are listed

    def __init__(
        self,
        *,
        instance_id: str,
        pid: int,
        host: str,
        start_time: float,
        labels: Mapping[str, str],
        mode: str,
        interval: float,
        time: float,
        total_samples: int,
        label_sets: tuple[Mapping[str, str], ...],
        stacks: Mapping[Key, int],
        generation: int = 0,
        since: int = 0,
    ) -> None:
        self._set(locals())

    __hash__ = None  # type: ignore[assignment]  # holds mappings

    def profile(self) -> Profile:
        """Returns the counts merged over label sets, with the document's interval and mode."""
        counts: dict[str, int] = {}
        get = counts.get
        for (_, stack), count in self.stacks.items():
            counts[stack] = get(stack, 0) + count
        return Profile(counts, interval=self.interval, mode=self.mode)


def document_head(
    *,
    instance: Mapping[str, object],
    labels: Mapping[str, str],
    mode: str,
    interval: float,
    effective_interval: float,
    time: float,
    total_samples: int,
    dropped_samples: int = 0,
    generation: int = 0,
    since: int = 0,
    label_sets: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Returns every field of a document but its stacks, in the documented order."""
    return {
        "format": WIRE_FORMAT,
        "instance": dict(instance),
        "labels": dict(labels),
        "mode": mode,
        "interval": interval,
        "effective_interval": effective_interval,
        "time": time,
        "total_samples": total_samples,
        "dropped_samples": dropped_samples,
        "generation": generation,
        "since": since,
        "label_sets": [{}] if label_sets is None else label_sets,
    }


def encode_document(head: Mapping[str, Any], stack_entries: list[bytes]) -> bytes:
    """Returns the UTF-8 JSON of a document: ``head``, then ``stacks`` made of the JSON text
    of its entries (comma-separated pieces of ``[index,"stack",count]``, joined as they are,
    so the caller may pass cached pieces that are copied once, here)."""
    import json

    text = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode()
    return b"".join([text[:-1], b',"stacks":[', *stack_entries, b"]}"])


def build_document(stacks: Iterable[tuple[int, str, int]], **head: Any) -> dict[str, Any]:
    """Returns a whole document as a dict: the fields of document_head (``total_samples``
    defaults to the sum of the counts) and its ``[label set index, stack, count]`` entries."""
    entries = [[index, stack, count] for index, stack, count in stacks if count > 0]
    head.setdefault("total_samples", sum(entry[2] for entry in entries))  # type: ignore[misc]
    document = document_head(**head)
    document["stacks"] = entries
    return document


def validate_document(doc: Any, limits: Limits = LIMITS, *, escaped: bool = True) -> Document:
    """Checks a decoded /profile.json document against the wire format and the limits.

    ``escaped=False`` says the JSON text held no backslash escape and no DEL: then no string in
    it can hold a control character or a surrogate (JSON forbids them raw, UTF-8 cannot encode
    surrogates), and the per-stack scan for them is skipped. The sampler escapes ``\\`` and
    ``"`` in frame names, so its documents always take that fast path.
    """
    from ._document_checks import check_head, check_stacks  # here: they import this module

    if not isinstance(doc, dict):
        raise DocumentError(f"/profile.json: expected a JSON object, got {type(doc).__name__}")
    fields = check_head(doc, limits)
    fields["stacks"] = check_stacks(doc.get("stacks"), len(fields["label_sets"]), limits, escaped)
    return Document(**fields)


def decode_document(raw: bytes, limits: Limits = LIMITS) -> Document:
    """Decodes and validates the bytes of a /profile.json response."""
    import json

    try:
        # Strict UTF-8: json.loads would let encoded surrogates through from bytes.
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DocumentError(f"/profile.json is not valid UTF-8: {str(exc)[:120]}") from None
    except (ValueError, RecursionError) as exc:
        raise DocumentError(f"/profile.json is not valid JSON: {str(exc)[:120]}") from None
    return validate_document(doc, limits, escaped=b"\\" in raw or b"\x7f" in raw)
