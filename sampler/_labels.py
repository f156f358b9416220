"""Sample labels: ``with sampler.tag(route="/upload"):`` and ``@sampler.tagged(...)``.

A tag is recorded against the frame that opened it, so the sampler finds it while walking any
thread's stack, and an asyncio task's labels follow the task, whichever thread runs it. The
labels in force are also kept in a context variable, so nested tags, and tags opened by a task
created inside a tagged block, merge with the labels of their context.
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections import deque
from collections.abc import Callable

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])

# Distinct label sets are bounded: a service that tags with request ids must not grow forever.
MAX_LABEL_SETS = 10_000
OVERFLOW = (("fleetflame", "label-sets-over-limit"),)
_MAX_TEXT = 200

_lock = threading.Lock()
_sets: list[tuple[tuple[str, str], ...]] = [()]
_ids: dict[tuple[tuple[str, str], ...], int] = {(): 0}
# id(frame) -> label set id, for every frame inside a tag; read by the sampler's stack walk.
frame_tags: dict[int, int] = {}
# The native engine drains samples after they were taken, when a tag may have closed (and its
# frame's id been reused): while it runs, each tag also keeps spans of its clock (ticked at
# every tag opened or closed, read with every sample), id(frame) -> [[opened, closed, label
# set id], ...]. Closed spans go once no sample can still need them (prune_spans).
tag_spans: dict[int, list[list[int]]] = {}
OPEN = 2**63
_closed: deque[tuple[int, list[int]]] = deque()
_clock: Callable[[], int] | None = None
# (labels in force, a tag's own labels) -> (the merged labels, their set id): a tag opened again
# under the same labels (a request's) merges and interns nothing.
_merged: dict[tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]], tuple[Any, int]] = {}
_current: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "fleetflame_labels", default=()
)


def label_set(set_id: int) -> dict[str, str]:
    """Returns the labels of an interned label set."""
    return dict(_sets[set_id])


def label_set_count() -> int:
    """Returns how many distinct label sets exist."""
    return len(_sets)


def current_labels() -> dict[str, str]:
    """Returns the labels in force in the calling context."""
    return dict(_current.get())


def _intern(items: tuple[tuple[str, str], ...]) -> int:
    set_id = _ids.get(items)
    if set_id is not None:
        return set_id
    with _lock:
        if items not in _ids:
            if len(_sets) >= MAX_LABEL_SETS:
                items = OVERFLOW
                if items in _ids:
                    return _ids[items]
            _ids[items] = len(_sets)
            _sets.append(items)
        return _ids[items]


def keep_spans(clock: Callable[[], int] | None) -> None:
    """Starts keeping spans on ``clock`` (the native engine's tag clock), or stops with None."""
    global _clock
    tag_spans.clear()
    _closed.clear()
    _clock = clock
    if clock is not None:
        now = clock()
        for frame_key, set_id in list(frame_tags.items()):
            tag_spans[frame_key] = [[now, OPEN, set_id]]


def prune_spans(before: int) -> None:
    """Forgets the spans closed before tag time ``before``."""
    # A frame's spans follow one another in time (one tag at a time is innermost in a frame,
    # and a frame's id is reused only once it is gone), so the closed ones are a prefix of its
    # list: cut at once, not one by one (a request's frame is reused request after request).
    keys = set()
    while _closed and _closed[0][1][1] <= before:
        keys.add(_closed.popleft()[0])
    for frame_key in keys:
        spans = tag_spans.get(frame_key)
        if spans is None:
            continue
        cut = 0
        while cut < len(spans) and spans[cut][1] <= before:
            cut += 1
        del spans[:cut]
        if not spans:
            tag_spans.pop(frame_key, None)


def _retag(frame_key: int, set_id: int | None) -> None:
    # The frame's tag changes to set_id (None: untagged) at the clock's next tick.
    assert _clock is not None
    now = _clock()
    spans = tag_spans.get(frame_key)
    if spans and spans[-1][1] == OPEN:
        spans[-1][1] = now
        _closed.append((frame_key, spans[-1]))
    if set_id is not None:
        if spans is None:
            spans = tag_spans.setdefault(frame_key, [])
        spans.append([now, OPEN, set_id])


def _clean(labels: dict[str, Any]) -> dict[str, str]:
    cleaned = {}
    for key, value in labels.items():
        if type(key) is not str or len(key) > _MAX_TEXT:
            key = str(key)[:_MAX_TEXT]
        if type(value) is not str or len(value) > _MAX_TEXT:
            value = str(value)[:_MAX_TEXT]
        cleaned[key] = value
    return cleaned


def _merge(outer: tuple[tuple[str, str], ...], own: dict[str, str]) -> tuple[Any, int]:
    """The labels in force inside a tag with labels ``own`` opened under ``outer``, and their
    set id (cached: a request's tag is opened again and again under the same labels)."""
    key = (outer, tuple(own.items()))
    found = _merged.get(key)
    if found is None:
        merged = dict(outer)
        merged.update(own)
        items = tuple(sorted(merged.items()))
        found = (items, _intern(items))
        if len(_merged) >= MAX_LABEL_SETS:
            _merged.clear()
        _merged[key] = found
    return found


class _Tag:
    """Labels recorded against one frame while a with block or a tagged call runs in it.

    Opened and closed once a request (by the middleware): kept to a few calls."""

    __slots__ = ("_labels", "_frame_key", "_previous", "_token", "_outer", "_open")
    _token: contextvars.Token[Any] | None

    def __init__(self, labels: dict[str, Any]) -> None:
        self._labels = _clean(labels)

    def enter(self, frame: Any) -> None:
        self._outer = _current.get()
        self._frame_key = id(frame)
        self._open = False
        self._token = _current.set(self._open_on_frame())

    def enter_later(self, frame: Any) -> None:
        """Readies the tag for ``frame`` without opening it: the first ``relabel`` opens it.
        A request's tag costs nothing before its route is known."""
        self._outer = _current.get()
        self._frame_key = id(frame)
        self._token = None
        self._open = False

    def _open_on_frame(self) -> tuple[tuple[str, str], ...]:
        # The frame's labels from now on; returns the labels in force.
        items, set_id = _merge(self._outer, self._labels)
        frame_key = self._frame_key
        if not self._open:
            self._previous = frame_tags.get(frame_key)
            self._open = True
        frame_tags[frame_key] = set_id
        if _clock is not None:
            _retag(frame_key, set_id)
        return items  # type: ignore[no-any-return]

    def relabel(self, **labels: Any) -> int:
        """Changes this tag's labels from now on (opening it, after ``enter_later``); returns
        the new label set's id.

        For what is known only after the tag opened (a request's route, once routed); samples
        taken before keep the labels they were taken under, with either engine."""
        self._labels.update(_clean(labels))
        _current.set(self._open_on_frame())  # undone by __exit__
        return frame_tags[self._frame_key]

    def __enter__(self) -> None:
        self.enter(sys._getframe(1))

    def __exit__(self, *exc_info: object) -> None:
        if not self._open:
            return
        frame_key, previous = self._frame_key, self._previous
        if previous is None:
            frame_tags.pop(frame_key, None)
        else:
            frame_tags[frame_key] = previous
        if _clock is not None:
            _retag(frame_key, previous)
        if self._token is not None:
            _current.reset(self._token)  # the value before enter
        else:
            # Opened by relabel, perhaps in a framework hook's context rather than this one
            # (a token only resets in its own): back to the labels in force before.
            _current.set(self._outer)


def tag(**labels: Any) -> _Tag:
    """Attaches labels to every sample taken inside the ``with`` block."""
    return _Tag(labels)


def tagged(**labels: Any) -> Callable[[F], F]:
    """Decorates a function (or coroutine function) so samples inside its calls carry labels."""

    import functools
    import inspect

    def decorate(func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                scope = _Tag(labels)
                scope.enter(sys._getframe(0))
                try:
                    return await func(*args, **kwargs)
                finally:
                    scope.__exit__()

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            scope = _Tag(labels)
            scope.enter(sys._getframe(0))
            try:
                return func(*args, **kwargs)
            finally:
                scope.__exit__()

        return wrapper  # type: ignore[return-value]

    return decorate
