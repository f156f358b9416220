"""The stall watcher's timing of a call: the extension's TimedCall against the Python wrapper
it stands for (sampler/_stall_timing.py's python_timed), held to the same behaviour."""

import threading

import pytest

from sampler import _stall_timing

pytestmark = pytest.mark.parallel  # the calls' times are given, not measured

try:
    from sampler import _native
except ImportError:
    _native = None


class Watcher:
    """What a wrapper uses of the StallWatcher: its running calls, limits and what it is told."""

    def __init__(self):
        self._running = {}
        self.threshold = 10.0
        self.request_threshold = 10.0
        self.told = []

    def limit(self, kind):
        return self.request_threshold if kind == "request" else self.threshold

    def finished(self, kind, ident, started, elapsed, what):
        self.told.append((kind, ident, elapsed, what))


def python_timed(original, kind, watcher, describe):
    return _stall_timing.python_timed(original, kind, watcher, describe)


def native_timed(original, kind, watcher, describe):
    limit = "request_threshold" if kind == "request" else "threshold"
    return _native.TimedCall(
        original, kind, watcher._running, watcher, limit, watcher.finished, describe
    )


WRAPPERS = [
    pytest.param(python_timed, id="python"),
    pytest.param(
        native_timed,
        id="native",
        marks=pytest.mark.skipif(_native is None, reason="the extension is not built"),
    ),
]


@pytest.fixture(params=WRAPPERS)
def timed(request):
    return request.param


def describe(args):
    return f"a call of {type(args[0]).__name__} with {len(args)} arguments"


@pytest.mark.parametrize("kind", ["event-loop", "request"])
def test_a_method_is_timed_bound_to_its_instance_and_told_past_its_limit(timed, kind):
    watcher = Watcher()
    seen = []

    class Handle:
        def _run(self, *args, **kwargs):
            seen.append((self, args, kwargs, dict(watcher._running)))
            return "ran"

    original = Handle._run
    Handle._run = timed(original, kind, watcher, describe)
    handle = Handle()
    assert handle._run(1, key=2) == "ran"
    me = threading.get_ident()
    ((instance, args, kwargs, running),) = seen
    assert instance is handle and args == (1,) and kwargs == {"key": 2}
    assert running[me][0] == kind and isinstance(running[me][1], float)
    assert watcher._running == {}  # taken out when the call ended
    assert watcher.told == []
    # The limit is read at each call: lowered, the next call is told, with its description.
    setattr(watcher, "request_threshold" if kind == "request" else "threshold", -1.0)
    handle._run()
    ((told_kind, ident, elapsed, what),) = watcher.told
    assert (told_kind, ident, what) == (kind, me, "a call of Handle with 1 arguments")
    assert elapsed >= 0
    assert Handle._run.__wrapped__ is original and Handle._run.__fleetflame_timed__ is True
    assert Handle.__dict__["_run"].__get__(None, Handle) is Handle.__dict__["_run"]


def test_an_error_passes_through_after_the_call_is_taken_out_and_told(timed):
    watcher = Watcher()
    watcher.threshold = -1.0

    def fails(self):
        raise ValueError("the call's own")

    wrapped = timed(fails, "event-loop", watcher, describe)
    with pytest.raises(ValueError, match="the call's own"):
        wrapped(object())
    assert watcher._running == {} and len(watcher.told) == 1


def test_a_nested_call_gives_the_outer_its_entry_back(timed):
    watcher = Watcher()
    inner = timed(lambda self: dict(watcher._running), "request", watcher, describe)
    outer = timed(
        lambda self: (dict(watcher._running), inner(self)), "event-loop", watcher, describe
    )
    outside, inside = outer(object())
    me = threading.get_ident()
    assert outside[me][0] == "event-loop" and inside[me][0] == "request"
    assert watcher._running == {}


def test_a_description_that_raises_is_the_error_of_the_call(timed):
    # describe is the watcher's safe one in use (_stall_kinds._safely); a raw one that raises
    # fails the call in both, as the Python wrapper's finally does.
    watcher = Watcher()
    watcher.threshold = -1.0

    def broken(args):
        raise KeyError("describe")

    wrapped = timed(lambda self: 1, "event-loop", watcher, broken)
    with pytest.raises(KeyError):
        wrapped(object())
    assert watcher._running == {}
