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

    threshold = _stall_timing.Limit("event-loop")
    request_threshold = _stall_timing.Limit("request")

    def __init__(self, running):
        self._running = running
        self._limits = {}
        self.threshold = 10.0
        self.request_threshold = 10.0
        self.told = []

    def finished(self, kind, ident, started, elapsed, what):
        self.told.append((kind, ident, elapsed, what))


def timed(original, kind, watcher, describe):
    """The watcher's wrapper, as sampler/_stall_timing.py's timed() picks it: by its table."""
    if isinstance(watcher._running, dict):
        return _stall_timing.python_timed(original, kind, watcher, describe)
    return _native.TimedCall(original, kind, watcher._running, watcher.finished, describe)


TABLES = [
    pytest.param(dict, id="python"),
    pytest.param(
        lambda: _native.RunningCalls(),
        id="native",
        marks=pytest.mark.skipif(_native is None, reason="the extension is not built"),
    ),
]


@pytest.fixture(params=TABLES)
def watcher(request):
    return Watcher(request.param())


def describe(args):
    return f"a call of {type(args[0]).__name__} with {len(args)} arguments"


@pytest.mark.parametrize("kind", ["event-loop", "request"])
def test_a_method_is_timed_bound_to_its_instance_and_told_past_its_limit(watcher, kind):
    seen = []

    class Handle:
        def _run(self, *args, **kwargs):
            seen.append((self, args, kwargs, watcher._running.copy()))
            return "ran"

    original = Handle._run
    Handle._run = timed(original, kind, watcher, describe)
    handle = Handle()
    assert handle._run(1, key=2) == "ran"
    me = threading.get_ident()
    ((instance, args, kwargs, running),) = seen
    assert instance is handle and args == (1,) and kwargs == {"key": 2}
    assert running[me][0] == kind and isinstance(running[me][1], float)
    assert watcher._running.copy() == {}  # taken out when the call ended
    assert watcher.told == []
    # The limit is read at each call: lowered, the next call is told, with its description.
    setattr(watcher, "request_threshold" if kind == "request" else "threshold", 0.0)
    handle._run()
    ((told_kind, ident, elapsed, what),) = watcher.told
    assert (told_kind, ident, what) == (kind, me, "a call of Handle with 1 arguments")
    assert elapsed >= 0
    assert Handle._run.__wrapped__ is original and Handle._run.__fleetflame_timed__ is True
    assert Handle.__dict__["_run"].__get__(None, Handle) is Handle.__dict__["_run"]


def test_an_error_passes_through_after_the_call_is_taken_out_and_told(watcher):
    watcher.threshold = 0.0

    def fails(self):
        raise ValueError("the call's own")

    wrapped = timed(fails, "event-loop", watcher, describe)
    with pytest.raises(ValueError, match="the call's own"):
        wrapped(object())
    assert watcher._running.copy() == {} and len(watcher.told) == 1


def test_a_nested_call_gives_the_outer_its_entry_back(watcher):
    inner = timed(lambda self: watcher._running.copy(), "request", watcher, describe)
    outer = timed(
        lambda self: (watcher._running.copy(), inner(self)), "event-loop", watcher, describe
    )
    outside, inside = outer(object())
    me = threading.get_ident()
    assert outside[me][0] == "event-loop" and inside[me][0] == "request"
    assert watcher._running.copy() == {}


def test_a_description_that_raises_is_the_error_of_the_call(watcher):
    # describe is the watcher's safe one in use (_stall_kinds._safely); a raw one that raises
    # fails the call in both, as the Python wrapper's finally does.
    watcher.threshold = 0.0

    def broken(args):
        raise KeyError("describe")

    wrapped = timed(lambda self: 1, "event-loop", watcher, broken)
    with pytest.raises(KeyError):
        wrapped(object())
    assert watcher._running.copy() == {}


def test_threads_each_have_their_call_and_give_it_back(watcher):
    # More threads in calls at once than the C table's first slots: each sees its own entry.
    count = 20
    inside = threading.Barrier(count + 1)
    leave = threading.Event()
    seen = {}

    def call(self):
        seen[threading.get_ident()] = watcher._running.copy()[threading.get_ident()]
        inside.wait(timeout=10)
        leave.wait(timeout=10)

    wrapped = timed(call, "request", watcher, describe)
    threads = [threading.Thread(target=wrapped, args=(object(),)) for _ in range(count)]
    for thread in threads:
        thread.start()
    inside.wait(timeout=10)
    running = watcher._running.copy()
    leave.set()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(running) == sorted(thread.ident for thread in threads)
    assert all(kind == "request" for kind, _ in running.values())
    assert {ident: call[1] for ident, call in running.items()} == {
        ident: started for ident, (_, started) in seen.items()
    }
    assert len(watcher._running) == 0 and watcher._running.copy() == {}


@pytest.mark.skipif(_native is None, reason="the extension is not built")
def test_the_c_timing_knows_two_kinds_and_no_limit_until_one_is_set():
    running = _native.RunningCalls()
    with pytest.raises(ValueError, match="'event-loop' or 'request'"):
        _native.TimedCall(len, "callback", running, print, repr)
    with pytest.raises(TypeError):
        _native.TimedCall(len, "request", {}, print, repr)  # the Python wrapper's table
    told = []
    wrapped = _native.TimedCall(
        lambda: None, "event-loop", running, lambda *args: told.append(args), repr
    )
    wrapped()
    assert told == []  # no limit set: none told
    running.set_limit("event-loop", -1.0)
    wrapped()
    assert len(told) == 1 and told[0][0] == "event-loop"


@pytest.mark.skipif(_native is None, reason="the extension is not built")
def test_a_watcher_with_the_c_table_keeps_the_c_timing_whatever_the_switch_says_later(
    monkeypatch,
):
    # The table decides (made at the watcher's start): a module loaded after the switch's
    # variable changed was wrapped with _native() read again, None: the watcher thread died.
    watcher = Watcher(_native.RunningCalls())
    monkeypatch.setenv("FLEETFLAME_PYTHON_TIMING", "1")
    wrapped = _stall_timing.timed(lambda self: "ran", "event-loop", watcher, describe)
    assert isinstance(wrapped, _native.TimedCall) and wrapped(object()) == "ran"


@pytest.mark.parametrize("bad", [float("nan"), -1.0, -1e-9, "nan", "-0.5"])
def test_a_limit_is_seconds_from_zero_and_a_bad_one_changes_nothing(watcher, bad):
    # watch_wait refuses a NaN or negative threshold: the native watcher loop died on it for
    # good (no stall of any kind watched after), its wrappers' reports piling up unread.
    watcher.threshold = 0.25
    with pytest.raises(ValueError, match="seconds"):
        watcher.threshold = bad
    assert watcher.threshold == 0.25
    slow = timed(lambda self: None, "event-loop", watcher, describe)
    slow(object())
    assert watcher.told == []  # the C table's limit unchanged too
    watcher.threshold = float("inf")  # never a stall: allowed, as 0 is
    watcher.threshold = "0"
    assert watcher.threshold == 0.0


@pytest.mark.skipif(_native is None, reason="the extension is not built")
@pytest.mark.parametrize("other_starts", [None, "before the second", "after the first ends"])
def test_calls_that_take_turns_on_one_os_thread_leave_no_call_behind_nor_take_anothers(
    other_starts,
):
    # Under gevent's monkey patching a waitress or werkzeug "thread" is a greenlet on the
    # host's OS thread: two requests start, the first ends first. The C table keys calls by
    # the OS thread, so the second's ending gave back the first's (ended) entry: a call the
    # watcher saw running for good; or, the slot freed and taken meanwhile by another OS
    # thread's call, wrote over that one. (The Python wrapper keys by threading.get_ident,
    # which that patch makes the greenlet's.)
    greenlet = pytest.importorskip("greenlet")
    running = _native.RunningCalls()
    running.set_limit("request", 10.0)
    hub = greenlet.getcurrent()
    request = _native.TimedCall(lambda: hub.switch(), "request", running, print, repr)
    inside, leave = threading.Event(), threading.Event()
    other = threading.Thread(
        target=_native.TimedCall(
            lambda: (inside.set(), leave.wait(10)), "request", running, print, repr
        )
    )

    def start_other(when):
        if other_starts == when:
            other.start()
            inside.wait(10)

    me = threading.get_ident()
    first, second = greenlet.greenlet(request), greenlet.greenlet(request)
    try:
        first.switch()
        start_other("before the second")
        second.switch()
        first.switch()  # the first request ends while the second waits
        start_other("after the first ends")
        second.switch()  # the second ends
        running_now = running.copy()
    finally:
        leave.set()
        if other.is_alive():
            other.join(10)
    assert me not in running_now  # no request runs on this thread now
    if other_starts is not None:
        assert other.ident in running_now  # its call is seen
    assert running.copy() == {} and len(running) == 0


@pytest.mark.skipif(_native is None, reason="the extension is not built")
def test_a_table_that_cannot_grow_lets_the_call_run_untimed():
    _testcapi = pytest.importorskip("_testcapi")
    running = _native.RunningCalls()
    inside, leave = threading.Barrier(9), threading.Event()
    held = _native.TimedCall(
        lambda: (inside.wait(10), leave.wait(10)), "request", running, print, repr
    )
    threads = [threading.Thread(target=held) for _ in range(8)]  # the table's first 8 slots
    for thread in threads:
        thread.start()
    inside.wait(10)
    ran = []
    ninth = _native.TimedCall(lambda: ran.append(len(running)), "request", running, print, repr)
    _testcapi.set_nomemory(0, 1)  # the next allocation fails: the table's growth
    try:
        ninth()
    finally:
        _testcapi.remove_mem_hooks()
        leave.set()
        for thread in threads:
            thread.join(timeout=10)
    assert ran == [8]  # it ran, with no slot of its own
    assert running.copy() == {}


def test_telling_that_fails_after_the_call_raised_keeps_the_calls_error_as_its_context(watcher):
    # As the Python wrapper's finally: the failure raised, the call's own error its context.
    watcher.threshold = 0.0

    def broken(args):
        raise KeyError("describe")

    def fails(self):
        raise ValueError("the call's own")

    wrapped = timed(fails, "event-loop", watcher, broken)
    with pytest.raises(KeyError) as raised:
        wrapped(object())
    assert isinstance(raised.value.__context__, ValueError)
    assert watcher._running.copy() == {}


@pytest.mark.skipif(_native is None, reason="the extension is not built")
def test_past_sixteen_slots_a_thread_is_given_its_last_slot_only_if_free_or_its_own():
    # Past 16 slots in use a thread is first given the slot it had last, not a scan of them
    # all (a scan of 200 cost ~1,500 instructions a call): never when another thread has
    # taken that slot since.
    running = _native.RunningCalls()
    running.set_limit("request", 10.0)
    inside, leave = threading.Barrier(2), threading.Event()
    held = _native.TimedCall(
        lambda: (inside.wait(10), leave.wait(10)), "request", running, print, repr
    )
    threads = []

    def hold():
        threads.append(threading.Thread(target=held))
        threads[-1].start()
        inside.wait(10)

    seen = []
    mine = _native.TimedCall(
        lambda: seen.append((len(running), sorted(running.copy()))), "request", running, print, repr
    )
    try:
        for _ in range(20):
            hold()
        mine()  # the table's 21st slot, given back at the end
        hold()  # another thread's now
        mine()  # nested calls and calls again after it, in any slot but that one
        _native.TimedCall(mine, "request", running, print, repr)()
    finally:
        leave.set()
        for thread in threads:
            thread.join(timeout=10)
    others = [thread.ident for thread in threads]
    me = threading.get_ident()
    assert seen == [
        (21, sorted(others[:20] + [me])),
        (22, sorted(others + [me])),
        (22, sorted(others + [me])),
    ]
    assert running.copy() == {} and len(running) == 0


def test_a_timed_method_keeps_its_name_module_and_doc(watcher):
    # Tools that name or wrap asyncio's Handle._run (functools.wraps) read these.
    import asyncio

    original = asyncio.Handle._run
    wrapped = timed(original, "event-loop", watcher, describe)
    assert (wrapped.__name__, wrapped.__qualname__) == ("_run", "Handle._run")
    assert (wrapped.__module__, wrapped.__doc__) == (original.__module__, original.__doc__)
    assert wrapped.__wrapped__ is original


def test_a_thread_whose_slot_could_not_be_had_is_timed_again_once_memory_is_back():
    # Past 16 slots in use, a failed growth of the table (-1) was kept as the thread's last
    # slot: its next calls read the slot before the table's first (out of bounds) and, when
    # that read 0, were given -1 again: untimed for as long as the table stayed that full.
    _testcapi = pytest.importorskip("_testcapi")
    if _native is None or not hasattr(_testcapi, "set_nomemory"):
        pytest.skip("needs the extension and _testcapi.set_nomemory")
    running = _native.RunningCalls()
    running.set_limit("request", 10.0)
    holders = 32  # a full table: the next thread's slot needs it to grow
    inside, leave = threading.Barrier(holders + 1), threading.Event()
    held = _native.TimedCall(
        lambda: (inside.wait(10), leave.wait(10)), "request", running, print, repr
    )
    threads = [threading.Thread(target=held) for _ in range(holders)]
    me = threading.get_ident()
    seen = []
    mine = _native.TimedCall(
        lambda: seen.append(me in running.copy()), "request", running, print, repr
    )
    try:
        for thread in threads:
            thread.start()
        inside.wait(10)
        _testcapi.set_nomemory(0, 1)  # the table's growth fails, once
        try:
            mine()
        finally:
            _testcapi.remove_mem_hooks()
        mine()
        mine()
    finally:
        leave.set()
        for thread in threads:
            thread.join(timeout=10)
    assert seen == [False, True, True]
    assert len(running) == 0
