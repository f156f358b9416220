"""The stall watcher's loop in C (_native.watch_wait): it stays in C while its wakes find no
work, and returns as soon as one does."""

import collections
import ctypes
import math
import subprocess
import sys
import threading
import time
import types

import pytest

from sampler._engine_native import unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason="the native engine's loop")

PERIOD = 0.01
THRESHOLD = 0.05
REQUEST_THRESHOLD = 0.5
PLANTED = "fleetflame_test_planted_module"


class Watched:
    """What the loop reads of the watcher at each wake (StallWatcher's attributes)."""

    def __init__(self):
        self.period = PERIOD
        self.threshold = THRESHOLD
        self.request_threshold = REQUEST_THRESHOLD
        self._running = {}
        self._pending = collections.deque()
        self._stopping = threading.Event()
        self._modules_seen = len(sys.modules)

    def wait(self):
        from sampler import _native

        started = time.monotonic()
        result = _native.watch_wait(self, threading._active, sys.modules)
        return time.monotonic() - started, result


def later(seconds, action):
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_with_nothing_to_do_it_returns_once_a_second_only():
    elapsed, (threads, waited, holder, on_cpu, handoffs, now) = Watched().wait()
    assert 0.95 <= elapsed < 3
    assert threading.main_thread().ident in threads
    assert waited < THRESHOLD and holder is None and on_cpu is None
    assert abs(now - time.monotonic()) < 0.5


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda w: w._stopping.set(), id="stopping"),
        pytest.param(lambda w: w._pending.append("a stall"), id="a stall pending"),
        pytest.param(lambda w: w._running.update({1: ("loop", time.monotonic())}), id="a call"),
        pytest.param(
            lambda w: sys.modules.setdefault(PLANTED, types.ModuleType(PLANTED)),
            id="a module loaded",
        ),
    ],
)
def test_it_returns_at_the_first_wake_after_work_appears(plant):
    watched = Watched()
    timer = later(0.2, lambda: plant(watched))
    try:
        elapsed, _ = watched.wait()
    finally:
        timer.cancel()
        sys.modules.pop(PLANTED, None)
    assert 0.2 <= elapsed < 0.6


def test_a_call_returns_it_only_once_near_its_kinds_limit():
    watched = Watched()
    # A request is read from its limit less the lead on; a loop callback would be at once.
    watched._running[1] = ("request", time.monotonic())
    elapsed, _ = watched.wait()
    assert REQUEST_THRESHOLD - PERIOD <= elapsed < REQUEST_THRESHOLD + 0.3


def test_a_call_timed_in_c_returns_it_near_its_kinds_limit_too():
    from sampler import _native

    watched = Watched()
    watched._running = _native.RunningCalls()  # TimedCall's table, read in C
    leave = threading.Event()
    request = _native.TimedCall(lambda: leave.wait(10), "request", watched._running, print, repr)
    thread = threading.Thread(target=request)
    thread.start()
    try:
        while not len(watched._running):
            time.sleep(0.001)
        elapsed, _ = watched.wait()
    finally:
        leave.set()
        thread.join(timeout=10)
    assert REQUEST_THRESHOLD - PERIOD - 0.05 <= elapsed < REQUEST_THRESHOLD + 0.3


def voluntary_switches(native_id):
    with open(f"/proc/self/task/{native_id}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


def test_with_no_call_near_its_limit_it_sleeps_longer_than_a_period():
    # A period of 10 ms would be 100 wakes in the second it waits; with no call to read, it
    # sleeps the smallest limit less its 5 ms lead: 45 ms, ~22 wakes (each a switch or two:
    # its sleep, and taking the GIL back when another thread has it).
    switches = []

    def wait():
        native_id = threading.get_native_id()
        before = voluntary_switches(native_id)
        Watched().wait()
        switches.append(voluntary_switches(native_id) - before)

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join()
    assert switches[0] < 55, switches


def idle_second(watched, other_host_thread=False):
    """The wakes of the watcher's thread in a second with no timed call, after one more such
    second; then, run by that thread, the wait in which a call begins after 0.2 s."""
    from sampler import _native

    watched._running = _native.RunningCalls()  # TimedCall's table, read in C
    # Its own threads: the harness's (pytest-timeout's timer) stand with them, so the host's
    # are the main thread and ``other``.
    harness = {t.ident for t in threading.enumerate() if t is not threading.main_thread()}
    watched._sampler = types.SimpleNamespace(_excluded=harness)
    results = []

    def waits():
        watched._sampler._excluded.add(threading.get_ident())
        native_id = threading.get_native_id()
        watched.wait()  # a second with no call begun
        before = voluntary_switches(native_id)
        results.append((*watched.wait(), voluntary_switches(native_id) - before))
        results.append(watched.wait())

    leave = threading.Event()
    other = threading.Thread(target=leave.wait, args=(10,))
    if other_host_thread:
        other.start()
    thread = threading.Thread(target=waits)
    thread.start()
    try:
        while not results:
            time.sleep(0.01)
        time.sleep(0.2)  # the third wait asleep
        begun = time.monotonic()
        _native.TimedCall(lambda: time.sleep(0.3), "event-loop", watched._running, print, repr)()
        thread.join(timeout=10)
    finally:
        leave.set()
    (idle_elapsed, _, switches), (woken_elapsed, (*_, now)) = results
    return idle_elapsed, switches, woken_elapsed, now - begun


def test_with_no_call_timed_in_c_for_a_second_it_sleeps_until_one_begins():
    # An idle worker's watcher woke ~22 times a second to find nothing: once no call has
    # begun for a second, it sleeps the rest of the loop's second, and the next call to begin
    # wakes it (an event-loop callback blocking 0.3 s is then read at its limit, not later).
    idle_elapsed, switches, woken_elapsed, returned = idle_second(Watched())
    assert 0.95 <= idle_elapsed < 2.5 and switches < 10, (idle_elapsed, switches)
    assert returned < THRESHOLD + 0.15, returned  # at the call's limit less the lead
    assert woken_elapsed < 0.9, woken_elapsed


def test_with_another_host_thread_it_keeps_its_wakes():
    # Another thread may wait for a GIL held by a call that blocks in C (no tick sees it):
    # only the watcher's wakes find that, so it keeps them.
    _, switches, _, _ = idle_second(Watched(), other_host_thread=True)
    assert switches >= 15, switches


@pytest.mark.parametrize("threshold", [math.inf, 8.0])
def test_thresholds_past_a_second_still_return_once_a_second_without_spinning(threshold):
    # The sleep follows the thresholds: an infinite one once made a sleep of no length (a
    # core spent), a long one a sleep past the loop's second of housekeeping.
    watched = Watched()
    watched.threshold = watched.request_threshold = threshold
    cpu = []

    def wait():
        started = time.thread_time()
        cpu.append((watched.wait()[0], time.thread_time() - started))

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join()
    elapsed, used = cpu[0]
    assert 0.95 <= elapsed < 2.5, elapsed
    assert used < 0.2, used


def test_a_wake_asked_for_ends_its_sleep():
    from sampler import _native

    watched = Watched()
    watched.threshold = watched.request_threshold = 8.0
    timer = later(0.2, lambda: (watched._stopping.set(), _native.watch_wake()))
    try:
        elapsed, _ = watched.wait()
    finally:
        timer.cancel()
    assert 0.2 <= elapsed < 0.5, elapsed


def test_a_call_is_returned_a_lead_before_its_limit_not_a_period():
    watched = Watched()
    watched.period = 0.1  # read from a period before its limit, it would return at once
    watched._running[1] = ("loop", time.monotonic())
    elapsed, _ = watched.wait()
    assert THRESHOLD - 0.006 <= elapsed < THRESHOLD + 0.03  # a period: 0.1 s


def hold_the_gil(seconds):
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))  # C code that keeps the GIL


def test_the_gil_held_returns_it_with_the_holder():
    holder = threading.Thread(target=lambda: (time.sleep(0.2), hold_the_gil(0.2)), name="h")
    holder.start()
    try:
        elapsed, (threads, waited, ident, _, _, _) = Watched().wait()
    finally:
        holder.join()
    assert 0.2 <= elapsed < 0.9
    assert 0.1 <= waited <= 0.3
    assert ident == holder.ident and threads[ident].name == "h"


def gil_wait(own):
    from sampler import _native

    return _native.gil_wait(0.03, THRESHOLD, own)


def watch_wait(own):
    watched = Watched()
    watched.period = 0.03
    watched._sampler = types.SimpleNamespace(_excluded=own)  # as StallWatcher reads its own
    _, (_, waited, ident, on_cpu, handoffs, _) = watched.wait()
    return waited, ident, on_cpu, handoffs


@pytest.mark.parametrize("wait", [gil_wait, watch_wait])
def test_a_hold_taken_over_from_the_samplers_own_thread_is_the_hold_of_the_taker(wait):
    # The drain holding the GIL for a moment as the watcher wakes, a host thread taking it from
    # the drain and keeping it: the taker held it, not the drain (asked for the GIL at once,
    # the watcher named the drain, and the handoff was too few to call it contention).
    go = threading.Event()

    def drain():  # the sampler's own: holds the GIL across the watcher's wake (at 0.03 s)
        go.wait()
        time.sleep(0.01)
        hold_the_gil(0.024)

    def host():  # asks for the GIL while the drain holds it, then keeps it
        go.wait()
        time.sleep(0.015)
        hold_the_gil(0.2)
        time.sleep(0.05)  # alive when its hold is read

    own = threading.Thread(target=drain, name="fleetflame-drain")
    taker = threading.Thread(target=host, name="taker")
    own.start()
    taker.start()
    try:
        go.set()
        waited, ident, _, _ = wait({own.ident})
    finally:
        own.join()
        taker.join()
    assert ident == taker.ident, (waited, ident, own.ident)
    assert 0.15 <= waited <= 0.3


def test_the_samplers_own_thread_holding_the_gil_long_is_still_named():
    from sampler import _native

    holder = threading.Thread(target=lambda: (time.sleep(0.05), hold_the_gil(0.2)), name="own")
    holder.start()
    try:
        waited, ident, _, _ = _native.gil_wait(0.1, THRESHOLD, {holder.ident})
    finally:
        holder.join()
    assert ident == holder.ident
    assert 0.1 <= waited <= 0.3


def test_the_samplers_own_thread_keeping_the_gil_while_no_one_waits_is_not_a_wait():
    # The sampler's thread runs Python and nobody else wants the GIL: it keeps it until asked,
    # and the watcher asks only after two switch intervals of reading the holder. That waiting
    # is not the host's: the wait counts from when the watcher asks (one switch interval).
    from sampler import _native

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    own = threading.Thread(target=spin, name="fleetflame-drain")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.01)  # the reading lasts 20 ms, asking 10 ms
    own.start()
    try:
        waited, ident, _, _ = _native.gil_wait(0.03, THRESHOLD, {own.ident})
    finally:
        stop.set()
        own.join()
        sys.setswitchinterval(interval)
    assert waited < 0.02, (waited, ident == own.ident)


def test_a_threshold_changed_while_it_waits_counts_from_the_next_wake():
    watched = Watched()
    watched._running[1] = ("request", time.monotonic())
    timer = later(0.1, lambda: setattr(watched, "request_threshold", 0.2))
    try:
        elapsed, _ = watched.wait()
    finally:
        timer.cancel()
    assert 0.2 - PERIOD <= elapsed < 0.45


def test_wrong_arguments_are_a_clear_error():
    from sampler import _native

    with pytest.raises(TypeError, match="own must be a set"):
        _native.gil_wait(0.0, THRESHOLD, [1])
    with pytest.raises(TypeError, match="watch_wait"):
        _native.watch_wait(Watched())
    with pytest.raises(TypeError, match="watch_wait"):
        _native.watch_wait(Watched(), [], sys.modules)
    with pytest.raises(AttributeError, match="period"):
        _native.watch_wait(object(), {}, {})
    watched = Watched()
    watched.period = -1.0
    with pytest.raises(ValueError, match="0 to 10 seconds"):
        watched.wait()
    watched = Watched()
    watched._running = []
    with pytest.raises(TypeError, match="_running"):
        watched.wait()


def test_the_gil_found_free_as_the_reading_again_ends_is_survived():
    # The sampler's thread holding the GIL at each wake for about the reading's length (10 ms),
    # then letting it go: the reading ends now and then on a free GIL, with no holder to name.
    script = """
import ctypes, sys, threading, time
from sampler import _native
stop = threading.Event()
def own():
    while not stop.is_set():
        ctypes.PyDLL(None).usleep(9800)
        time.sleep(0.0004)
thread = threading.Thread(target=own)
thread.start()
for _ in range(300):
    _native.gil_wait(0.002, 0.05, {thread.ident})
stop.set()
thread.join()
print("survived")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "survived" in result.stdout, result
