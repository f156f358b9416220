"""Sample labels: ``with sampler.tag(route="/upload"):`` and ``@sampler.tagged(...)``.

A tag is recorded against the frame that opened it, so the sampler finds it while walking any
thread's stack, and an asyncio task's labels follow the task, whichever thread runs it. The
labels in force are also kept in a context variable, so nested tags, and tags opened by a task
created inside a tagged block, merge with the labels of their context.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import threading
from collections.abc import Callable
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


def _clean(labels: dict[str, Any]) -> dict[str, str]:
    return {str(k)[:_MAX_TEXT]: str(v)[:_MAX_TEXT] for k, v in labels.items()}


class _Tag:
    """Labels recorded against one frame while a with block or a tagged call runs in it."""

    __slots__ = ("_labels", "_frame_key", "_previous", "_token")

    def __init__(self, labels: dict[str, Any]) -> None:
        self._labels = _clean(labels)

    def enter(self, frame: Any) -> None:
        merged = dict(_current.get())
        merged.update(self._labels)
        items = tuple(sorted(merged.items()))
        self._token = _current.set(items)
        self._frame_key = id(frame)
        self._previous = frame_tags.get(self._frame_key)
        frame_tags[self._frame_key] = _intern(items)

    def __enter__(self) -> None:
        self.enter(sys._getframe(1))

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is None:
            frame_tags.pop(self._frame_key, None)
        else:
            frame_tags[self._frame_key] = self._previous
        _current.reset(self._token)


def tag(**labels: Any) -> _Tag:
    """Attaches labels to every sample taken inside the ``with`` block."""
    return _Tag(labels)


def tagged(**labels: Any) -> Callable[[F], F]:
    """Decorates a function (or coroutine function) so samples inside its calls carry labels."""

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
