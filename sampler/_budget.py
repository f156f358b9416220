"""The overhead budget: how much CPU the sampler's own work takes, and the interval it allows.

Only the sampler's own work is counted: the CPU of its ticks, handlers and drains, without the
garbage collections that happen to run inside them (they collect the host's garbage, which
would be collected anyway) and without other threads' time. Over each window of about a
second, when that work took more than ``percent`` of one CPU the interval is stretched; when
it takes less than half of it again the interval comes back.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from collections.abc import Callable

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

# How far the interval may stretch: at most this many times the configured one, and an hour.
MAX_STRETCH = 50.0
MAX_INTERVAL = 3600.0


class OverheadBudget:
    """Windows of own work, and the interval they allow."""

    def __init__(self, interval: float, percent: float, arm: Callable[[float], None]) -> None:
        self.interval = interval
        self.percent = percent
        self.effective_interval = interval
        self._arm = arm
        self._busy = 0.0
        self._ticks = 0
        self._window_start = time.perf_counter()
        # (seconds of wall time, seconds of own work, ticks) per window of about a second.
        self.history: deque[tuple[float, float, int]] = deque(maxlen=60)

    def measure(self) -> _Measure:
        """Returns a context manager that counts the CPU of its block, less collections."""
        return _Measure(self)

    def spent(self, seconds: float, ticks: int = 0) -> None:
        """Counts ``seconds`` of own work (and ``ticks`` samples taken by it)."""
        self._busy += seconds
        self._ticks += ticks
        now = time.perf_counter()
        if now - self._window_start >= 1.0:
            self._close_window(now)

    def _close_window(self, now: float) -> None:
        elapsed = now - self._window_start
        self.history.append((elapsed, self._busy, self._ticks))
        percent = 100.0 * self._busy / elapsed
        self._busy, self._ticks, self._window_start = 0.0, 0, now
        stretched = self.effective_interval
        if percent > self.percent:
            stretched = min(
                self.interval * MAX_STRETCH, MAX_INTERVAL, stretched * percent / self.percent * 1.2
            )
        elif percent < self.percent / 2 and stretched > self.interval:
            stretched = max(self.interval, stretched / 1.5)
        if stretched != self.effective_interval:
            self.effective_interval = stretched
            self._arm(stretched)

    def summary(self) -> dict[str, float]:
        """Overhead percent and ticks per second over the windows kept (the last minute)."""
        wall = sum(h[0] for h in self.history)
        busy = sum(h[1] for h in self.history)
        ticks = sum(h[2] for h in self.history)
        return {
            "overhead_percent": round(100.0 * busy / wall, 4) if wall else 0.0,
            "ticks_per_second": round(ticks / wall, 2) if wall else 0.0,
        }


class _Measure:
    """Counts the CPU of a block of the sampler's own work, less the collections inside it.

    Its collection hook is in gc.callbacks only while the block runs: a hook left there for
    good would run after every collection of the host, and the python engine's late ticks
    would land on it."""

    __slots__ = ("_budget", "_cpu", "_gc", "_host", "_ident", "_started")

    def __init__(self, budget: OverheadBudget) -> None:
        self._budget = budget

    def exclude(self, seconds: float) -> None:
        """Takes ``seconds`` of the host's work that this block did for it (the code objects
        the native drain frees) off the block's own work."""
        self._host += seconds

    def __enter__(self) -> _Measure:
        self._gc = 0.0
        self._host = 0.0
        self._started = -1.0
        self._ident = threading.get_ident()
        gc.callbacks.append(self._on_gc)
        self._cpu = time.thread_time()
        return self

    def __exit__(self, *exc_info: object) -> None:
        cpu = time.thread_time() - self._cpu
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:  # pragma: no cover - someone cleared gc.callbacks
            pass
        self._budget.spent(max(0.0, cpu - self._gc - self._host))

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != self._ident:
            return
        if phase == "start":
            self._started = time.thread_time()
        elif self._started >= 0:
            self._gc += time.thread_time() - self._started
            self._started = -1.0
