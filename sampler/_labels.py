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
from collections.abc import Callable

from .profile.frames import MAX_LABELS, label_text

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])

# Distinct label sets are bounded: a service that tags with request ids must not grow forever.
MAX_LABEL_SETS = 10_000
OVERFLOW = (("fleetflame", "label-sets-over-limit"),)
CUT = ("fleetflame", "labels-over-limit")  # a label set cut to the wire's MAX_LABELS
_MAX_TEXT = 200

_lock = threading.Lock()
_sets: list[tuple[tuple[str, str], ...]] = [()]
_ids: dict[tuple[tuple[str, str], ...], int] = {(): 0}
# id(frame) -> label set id, for every frame inside a tag; read by the sampler's stack walk.
frame_tags: dict[int, int] = {}
# The native engine's tag_set while it runs: it keeps its own table of the open tags, read by
# its signal handler, so a sample carries the labels in force when it was taken.
_native_set: Callable[[int, int], object] | None = None
_native: Any = None
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


def use_native(native: Any) -> None:
    """Keeps the native engine's table of open tags (given its module) from the tags open now
    on; None stops."""
    global _native_set, _native
    if native is None:
        _native_set = None
        if _native is not None:
            _native.tags_clear()
        _native = None
        return
    # Set before the copy: a tag opened meanwhile is either copied or set by its own call.
    _native, _native_set = native, native.tag_set
    native.tags_load(frame_tags)


def _clean(labels: dict[str, Any]) -> dict[str, str]:
    cleaned = {}
    for key, value in labels.items():
        # Written out, then cut: a lone surrogate takes six characters written out.
        if type(key) is not str or len(key) > _MAX_TEXT or not key.isascii():
            key = label_text(str(key), _MAX_TEXT)
        if type(value) is not str or len(value) > _MAX_TEXT or not value.isascii():
            value = label_text(str(value), _MAX_TEXT)
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
        if len(items) > MAX_LABELS:  # the wire's bound: the first in key order, and a mark
            items = tuple(sorted(items[: MAX_LABELS - 1] + (CUT,)))
        found = (items, _intern(items))
        if len(_merged) >= MAX_LABEL_SETS:
            _merged.clear()
        _merged[key] = found
    return found


class _FrameTag:
    """Labels recorded against one frame, from when the tag opens until it closes."""

    __slots__ = ("_frame_key", "_outer", "_previous", "_open", "_token")
    _token: contextvars.Token[Any] | None

    def _ready(self, frame: Any) -> None:
        self._outer = _current.get()
        self._frame_key = id(frame)
        self._open = False
        self._token = None

    def _open_as(self, set_id: int) -> None:
        # The frame's samples carry label set ``set_id`` from now on.
        frame_key = self._frame_key
        if not self._open:
            self._previous = frame_tags.get(frame_key)
            self._open = True
        frame_tags[frame_key] = set_id
        native_set = _native_set  # once: a tracer's line event may switch threads between reads
        if native_set is not None:
            native_set(frame_key, set_id)

    def __exit__(self, *exc_info: object) -> None:
        if not self._open:
            return
        frame_key, previous = self._frame_key, self._previous
        if previous is None:
            frame_tags.pop(frame_key, None)
        else:
            frame_tags[frame_key] = previous
        native_set = _native_set
        if native_set is not None:
            native_set(frame_key, -1 if previous is None else previous)
        if self._token is not None:
            _current.reset(self._token)  # the value before enter
        else:
            # Opened later, perhaps in a framework hook's context rather than this one (a
            # token only resets in its own): back to the labels in force before.
            _current.set(self._outer)


class _Tag(_FrameTag):
    """Labels recorded against one frame while a with block or a tagged call runs in it."""

    __slots__ = ("_labels",)

    def __init__(self, labels: dict[str, Any]) -> None:
        self._labels = _clean(labels)

    def enter(self, frame: Any) -> None:
        self._ready(frame)
        self._token = _current.set(self._open_on_frame())

    def enter_later(self, frame: Any) -> None:
        """Readies the tag for ``frame`` without opening it: the first ``relabel`` opens it."""
        self._ready(frame)

    def _open_on_frame(self) -> tuple[tuple[str, str], ...]:
        # The frame's labels from now on; returns the labels in force.
        items, set_id = _merge(self._outer, self._labels)
        self._open_as(set_id)
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


class RouteTag(_FrameTag):
    """A request's tag, opened and closed by the middleware once a request: one label,
    ``route``, on the request's frame from when the route is known; kept to a few
    dictionary operations."""

    __slots__ = ()

    def __init__(self, frame: Any) -> None:
        self._ready(frame)

    def route(self, route: str) -> int:
        """Labels the frame's samples ``route=route`` from now on; returns the label set id."""
        found = _routes.get((self._outer, route))
        if found is None:
            found = _route_set(self._outer, route)
        self._open_as(found[1])
        _current.set(found[0])  # undone by close
        return found[1]

    close = _FrameTag.__exit__


# (labels in force, route) -> the merged labels and their set id, for RouteTag.
_routes: dict[tuple[tuple[tuple[str, str], ...], str], tuple[Any, int]] = {}


def _route_set(outer: tuple[tuple[str, str], ...], route: str) -> tuple[Any, int]:
    found = _merge(outer, _clean({"route": route}))
    if len(_routes) >= MAX_LABEL_SETS:
        _routes.clear()
    _routes[(outer, route)] = found
    return found


def native_route_tags() -> Any:
    """The native extension, bound to this module's state, so its RouteTag (and the WSGI
    wrapper's tags) open and close here in C; None where it is not built."""
    global _native_bound
    if _native_bound is None:
        try:
            from . import _native
        except ImportError:
            _native_bound = False
        else:
            _native.labels_bind(_current, frame_tags, _routes, _route_set)
            _native_bound = _native
    return _native_bound or None


_native_bound: Any = None  # the bound extension; False: not built


def route_tag_type() -> type[Any]:
    """RouteTag in C where the native extension is built, else in Python: the same calls."""
    native = native_route_tags()
    return native.RouteTag if native is not None else RouteTag


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
