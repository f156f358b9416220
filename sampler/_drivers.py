"""What makes the sampler tick: a timer signal, or a daemon thread.

The signal driver costs nothing while the process is idle (``ITIMER_PROF`` only runs on CPU
time), but Python runs signal handlers in the main thread only: while the main thread waits
in ``join()`` or ``select()`` and other threads work, no handler runs. The auto driver watches
for that twice a second (ten times in its first second) and moves to the thread driver.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from ._log import log
from ._osthread import block_host_signals, own_thread

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

Tick = Callable[[FrameType | None], None]

_TIMERS = {
    "cpu": (signal.ITIMER_PROF, signal.SIGPROF),
    "wall": (signal.ITIMER_REAL, signal.SIGALRM),
}


class DriverError(RuntimeError):
    """The requested driver cannot run in this process."""


# The signal driver whose handler is installed, if any: its timer is quieted before the
# program execs (quiet_for_exec).
_installed: SignalDriver | None = None


def quiet_for_exec() -> Callable[[], None] | None:
    """Stops the signal driver's timer and takes off a tick already pending, so that the
    program exec'd meets neither (a setitimer timer and a pending signal survive execve, and
    SIGPROF's default action kills); gives what starts ticking again if the exec fails, or
    None if no timer of ours was set. Any thread; takes no lock (it may run in a fork child
    or a signal handler while another thread is in start() or stop())."""
    driver = _installed
    if driver is None or signal.getsignal(driver._signum) != driver._on_signal:
        return None
    was_active, driver._active = driver._active, False  # a handler running now re-arms nothing
    signal.setitimer(driver._timer, 0, 0)
    _take_pending(driver._signum)

    def resume() -> None:
        driver._active = was_active
        driver.arm(driver.interval)

    return resume


def _take_pending(signum: int) -> None:
    """Takes a ``signum`` already pending off (this thread's and the process's)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        while signal.sigtimedwait({signum}, 0) is not None:
            pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _jittered(interval: float) -> float:
    # +-50 % so ticks do not fall in lock step with periodic work in the host.
    import random  # here, not at import: it costs ~2 ms

    return interval * random.uniform(0.5, 1.5)


class SignalDriver:
    """Ticks on ITIMER_PROF/SIGPROF (cpu mode) or ITIMER_REAL/SIGALRM (wall mode)."""

    name = "signal"

    def __init__(self, mode: str, tick: Tick) -> None:
        self._timer, self._signum = _TIMERS[mode]
        self._tick = tick
        self._previous: Any = None
        self._active = False
        self.interval = 0.01
        self.handler_runs = 0

    def start(self, interval: float) -> None:
        """Installs the handler and arms the timer; raises DriverError where it cannot."""
        if threading.current_thread() is not threading.main_thread():
            raise DriverError("signal handlers can only be installed from the main thread")
        current = signal.getsignal(self._signum)
        if current not in (signal.SIG_DFL, signal.SIG_IGN, None):
            raise DriverError(
                f"{signal.Signals(self._signum).name} already has a handler: {current!r}"
            )
        global _installed
        self._previous = current
        self._active = True
        _installed = self
        signal.signal(self._signum, self._on_signal)
        # SA_RESTART: system calls interrupted by the tick are restarted, not failed with EINTR.
        signal.siginterrupt(self._signum, False)
        self.arm(interval)

    def arm(self, interval: float) -> None:
        """Sets the tick period (the first tick is jittered)."""
        self.interval = interval
        if self._active:
            signal.setitimer(self._timer, _jittered(interval), interval)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A signal already pending when the timer was disarmed must neither tick nor re-arm.
        if not self._active:
            return
        self.handler_runs += 1
        self._tick(frame)
        signal.setitimer(self._timer, _jittered(self.interval), self.interval)

    def disarm(self) -> None:
        """Stops the timer; the handler stays installed until stop() restores the previous one.
        A timer the host set since, with a handler of its own, is left alone: the process has
        one itimer of each kind, and it is the host's now (a CPU limit, an alarm)."""
        self._active = False
        if signal.getsignal(self._signum) == self._on_signal:
            signal.setitimer(self._timer, 0, 0)

    def stop(self) -> None:
        """Stops the timer and puts back the handler that was there before."""
        self.disarm()
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(self._signum) == self._on_signal:
                # A tick generated before the timer stopped may still be pending: under the
                # default action it would kill the process. Take it off first.
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {self._signum})
                try:
                    _take_pending(self._signum)
                    signal.signal(
                        self._signum,
                        self._previous if self._previous is not None else signal.SIG_DFL,
                    )
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            global _installed
            if _installed is self:
                _installed = None
        else:
            # Not allowed here; an armed-off timer makes the remaining handler harmless.
            log.debug(
                "sampler stopped off the main thread: SIGPROF handler left in place, disarmed"
            )


class ThreadDriver:
    """Ticks from a daemon thread that sleeps for the interval."""

    name = "thread"

    def __init__(self, tick: Tick, on_thread: Callable[[int], None]) -> None:
        self._tick = tick
        self._on_thread = on_thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.interval = 0.01

    def start(self, interval: float) -> None:
        """Starts the ticking thread."""
        self.interval = interval
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fleetflame-sampler", daemon=True)
        self._thread.start()

    def arm(self, interval: float) -> None:
        """Sets the tick period."""
        self.interval = interval

    def _run(self) -> None:
        self._on_thread(threading.get_ident())
        own_thread()
        while not self._stop.wait(_jittered(self.interval)):
            self._tick(None)

    def stop(self) -> None:
        """Stops the ticking thread and waits for it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None


class AutoDriver:
    """The signal driver, falling back to the thread driver where signals cannot be used.

    With ``watch=True`` a 2 Hz thread (10 Hz in its first second) also moves to the thread
    driver when the main thread does not run the signal handler (it waits in join() or
    select() while other threads work).
    """

    # Switch when fewer than this share of the expected ticks ran, two checks in a row.
    STARVED_SHARE = 0.25

    CHECK_SECONDS = 0.5
    # For its first second, checks come five times as often, and one tick in ten due or fewer
    # switches at once: a program whose main thread waits from the start (joins its workers,
    # as under `python -m sampler run`) lost its first second's samples.
    FIRST_SECONDS = 1.0
    FIRST_CHECK_SECONDS = 0.1

    # ... or when more than this share of the samples arrived late, two checks in a row.
    LATE_SHARE = 0.5

    def __init__(
        self,
        mode: str,
        tick: Tick,
        on_thread: Callable[[int], None],
        watch: bool,
        on_switch: Callable[[], None] | None = None,
        lateness: Callable[[], tuple[float, float]] | None = None,
    ) -> None:
        self._mode = mode
        self._lateness = lateness
        self._on_switch = on_switch
        self._on_thread = on_thread
        self._watch_enabled = watch
        self._signal = SignalDriver(mode, tick)
        self._thread_driver = ThreadDriver(tick, on_thread)
        self._on_signals = False
        self._signal_installed = False
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.interval = 0.01

    @property
    def name(self) -> str:
        """The driver that is ticking now."""
        return "signal" if self._on_signals else "thread"

    def start(self, interval: float) -> None:
        """Starts with signals where possible, otherwise with the thread driver at once."""
        self.interval = interval
        try:
            self._signal.start(interval)
        except DriverError as exc:
            log.warning("fleetflame sampler: %s; sampling from a thread instead", exc)
            self._thread_driver.start(interval)
            return
        self._on_signals = self._signal_installed = True
        if self._watch_enabled:
            self._stop.clear()
            self._watchdog = threading.Thread(
                target=self._watch, name="fleetflame-watchdog", daemon=True
            )
            self._watchdog.start()

    def arm(self, interval: float) -> None:
        """Sets the tick period."""
        self.interval = interval
        if self._on_signals:
            self._signal.arm(interval)
        else:
            self._thread_driver.arm(interval)

    def _watch(self) -> None:
        block_host_signals()
        self._on_thread(threading.get_ident())
        strikes = 0
        clock = time.process_time if self._mode == "cpu" else time.monotonic
        start_clock, start_runs = clock(), self._signal.handler_runs
        start_late, start_total = self._lateness() if self._lateness else (0.0, 0.0)
        first_until = time.monotonic() + self.FIRST_SECONDS
        while not self._stop.wait(
            self.FIRST_CHECK_SECONDS if time.monotonic() < first_until else self.CHECK_SECONDS
        ):
            # Evidence is pooled over checks until ~10 ticks were due, so a lightly loaded
            # process is judged too, just more slowly.
            expected = (clock() - start_clock) / self.interval
            if expected < 10:
                continue
            ran = self._signal.handler_runs - start_runs
            late, total = self._lateness() if self._lateness else (0.0, 0.0)
            late_share = (late - start_late) / max(total - start_total, 1.0)
            starved = ran < self.STARVED_SHARE * expected or late_share > self.LATE_SHARE
            strikes = strikes + 1 if starved else 0
            if ran <= 0.1 * expected and time.monotonic() < first_until:
                strikes = 2  # one in ten or fewer ran, early: most will not
            start_clock, start_runs = clock(), self._signal.handler_runs
            start_late, start_total = late, total
            if strikes >= 2:
                log.warning(
                    "fleetflame sampler: the main thread is not running signal handlers in time "
                    "(%d of ~%d ticks ran, %.0f%% of samples late); sampling from a thread instead",
                    ran,
                    int(expected),
                    100 * late_share,
                )
                self._signal.disarm()
                self._on_signals = False
                if self._on_switch is not None:
                    self._on_switch()
                self._thread_driver.start(self.interval)
                return

    def stop(self) -> None:
        """Stops whichever driver is ticking and the watchdog; restores the signal handler."""
        self._stop.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=5)
        self._watchdog = None
        if self._signal_installed:
            self._signal.stop()
            self._signal_installed = self._on_signals = False
        self._thread_driver.stop()


def make_driver(
    name: str,
    mode: str,
    tick: Tick,
    on_thread: Callable[[int], None],
    on_switch: Callable[[], None] | None = None,
    lateness: Callable[[], tuple[float, float]] | None = None,
) -> Any:
    """Returns the driver called ``name``: signal, thread or auto (signal with a watchdog)."""
    if name == "thread":
        return ThreadDriver(tick, on_thread)
    return AutoDriver(
        mode, tick, on_thread, watch=name == "auto", on_switch=on_switch, lateness=lateness
    )
