"""The pure-Python engine: a driver calls tick(), which walks every thread's frames.

It runs wherever Python does, and is the fallback where the native engine cannot: its samples
are taken when the Python code of the tick gets to run (between two bytecodes of the main
thread, or when the sampling thread gets the GIL), so time spent in C code lands on the Python
frame that runs next, not on the one that called it. docs/sampler.md has the measured figures.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType

from ._drivers import SignalDriver, make_driver

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from ._core import Sampler


class PythonEngine:
    """Ticks from a timer signal or a thread; each tick samples every thread."""

    name = "python"

    def __init__(self, sampler: Sampler) -> None:
        self._sampler = sampler
        self._main_ident = threading.main_thread().ident or 0  # a forked child has its own
        self._ticking = False
        self.driver = make_driver(
            sampler.settings["driver"],
            sampler.mode,
            self.tick,
            sampler._excluded.add,
            self._on_driver_switch,
            self._lateness,
        )

    @property
    def driver_name(self) -> str:
        """The driver ticking now: signal or thread."""
        return str(self.driver.name)

    def start(self, interval: float) -> None:
        """Records the CPU every thread used so far (not counted), then starts ticking."""
        self._sampler.table.baseline(self._sampler._excluded)
        self.driver.start(interval)

    def arm(self, interval: float) -> None:
        """Sets the tick period (the overhead budget stretches it)."""
        self.driver.arm(interval)

    def stop(self) -> None:
        """Stops ticking and charges the CPU read at the last tick."""
        self.driver.stop()
        sampler = self._sampler
        with sampler._lock:
            sampler.table.flush()
            sampler.table.forget_frames()

    def after_fork_in_child(self) -> None:
        """Stops the parent's driver in a forked child (a new engine starts after)."""
        self.driver.stop()

    def forget_inherited(self) -> None:
        """In a process forked in C (no fork hooks ran), the parent's driver: its signal
        handler put back, its threads (not here) not waited for."""
        for driver in (self.driver, getattr(self.driver, "_signal", None)):
            if isinstance(driver, SignalDriver):
                driver.stop()

    def catch_up(self) -> None:
        """Brings the counts up to date for a reader (called holding the sampler's lock)."""
        if self._ticking:
            return  # the main thread is in a tick, which samples; its stack now is the tick's
        sampler = self._sampler
        frames = sys._current_frames()
        with sampler.budget.measure():
            sampler.table.settle(frames, sampler._excluded, sampler.budget.effective_interval)

    def tick(self, frame: FrameType | None) -> None:
        """Takes one sample of every thread; never raises, never blocks."""
        sampler = self._sampler
        budget = sampler.budget
        self._ticking = True
        try:
            self._tick(frame)
        finally:
            self._ticking = False
        budget.spent(0.0, ticks=1)

    def _tick(self, frame: FrameType | None) -> None:
        sampler = self._sampler
        with sampler.budget.measure():
            try:
                if not sampler._lock.acquire(blocking=False):
                    sampler.dropped += 1
                    return
                try:
                    frames = sys._current_frames()
                    if frame is not None:
                        # Called from the signal handler: the main thread's stack is the
                        # handler's own; the interrupted frame is the host's.
                        frames[self._main_ident] = frame
                    sampler.table.sample(frames, sampler._excluded)
                    sampler.ticks += 1
                finally:
                    sampler._lock.release()
            except Exception:  # noqa: BLE001 - the host program must never see the sampler fail
                sampler.errors += 1
                if sampler.errors == 1:
                    sampler.log_tick_failure()

    def _lateness(self) -> tuple[float, float]:
        table = self._sampler.table
        return table.late, table.total

    def _on_driver_switch(self) -> None:
        sampler = self._sampler
        with sampler._lock:
            sampler.dropped += sampler.table.rebaseline(sampler._excluded)

    def info(self) -> dict[str, object]:
        """Engine details for /info."""
        return {"driver": self.driver_name}
