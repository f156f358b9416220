"""The native engine: the C extension samples each thread from a signal sent to that thread.

In cpu mode every Python thread has a timer on its own CPU clock; when it expires the kernel
interrupts that thread where it is, and a C handler copies its frames into a ring: the Python
frame that called C code is on top while the C code runs, so C, Cython and mypyc time is
charged to it, as py-spy does. In wall mode a native thread sends the signal to threads that
are running and reads the waiting ones itself (marked ``[waiting]``). A drain thread turns the
ring's records into the counts of the sampler's StackTable ten times a second, and whenever
someone reads. docs/sampler.md has the design and the figures.
"""

from __future__ import annotations

import sys
import threading
import time
from types import CodeType, FrameType

from . import _labels
from ._log import log
from ._osthread import own_thread
from ._waits import REASONS, WAITING

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from ._budget import _Measure
    from ._core import Sampler
    from ._stacks import StackKey, StackTable

RING_BYTES = 1 << 20  # records waiting for the drain: ~650 samples of 50 frames
DRAIN_SECONDS = 0.1
SYNC_SECONDS = 1.0
# Sampling stays paused this long after a tracer detaches (py-spy attaches a hundred times a
# second while it records).
TRACER_QUIET_SECONDS = 2.0
UNKNOWN = "[unknown]"  # a frame whose code was freed before its name could be read


class DrainTarget:
    """What the native drain counts into: the table's counts, the marks of what changed and
    the carried remainders, and per thread ident the keys of its last sample (where its CPU
    after the last tick goes when it ends), of its entry stack (the same, if it ends
    unsampled) and of its last waiting sample (where it counts again while it has not run
    since, in wall mode). Counting follows StackTable.add's rules (sampler/_native_src/count.c).
    """

    __slots__ = (
        "counts",
        "touched",
        "residues",
        "generation",
        "other",
        "max_stacks",
        "thread_root",
        "last_key",
        "entry_key",
        "last_waiting",
        "recent",
    )

    def __init__(self, table: StackTable) -> None:
        self.counts = table.counts
        self.touched = table.touched
        self.residues = table.residues
        self.generation = table.generation
        self.other = table.other
        self.max_stacks = table.max_stacks
        self.thread_root = table.thread_root if table.thread_frames else None
        self.last_key: dict[int, StackKey] = {}
        self.entry_key: dict[int, StackKey] = {}
        self.last_waiting: dict[int, StackKey] = {}
        # Called with (monotonic seconds, thread ident, key, weight) for every sample, or None.
        self.recent = table.recent.append if table.recent is not None else None


def unavailable() -> str | None:
    """Returns why the native engine cannot run in this process, or None if it can."""
    version = "{}.{}".format(*sys.version_info[:2])
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11):
        return (
            f"the native engine knows CPython 3.11's frames only; this is "
            f"{sys.implementation.name} {version}"
        )
    if not sys.platform.startswith("linux"):
        return "the native engine needs Linux (per-thread CPU timers)"
    try:
        from . import _native
    except ModuleNotFoundError as exc:
        problem = str(exc)
    except ImportError as exc:  # built, but the system would not load it
        return f"the native extension could not be loaded: {exc}"
    else:
        if hasattr(_native, "drain"):
            return None
        problem = f"{_native!r} is not the extension"
    return (
        f"the native engine is not built ({problem}); reinstall fleetflame where a C compiler "
        "and the Python headers are present"
    )


class NativeEngineError(RuntimeError):
    """The native engine could not start; the message says why."""


class NativeEngine:
    """Starts the C engine, keeps its threads registered and drains it into the StackTable."""

    name = "native"

    def __init__(self, sampler: Sampler) -> None:
        from . import _native

        self._native: Any = _native
        self._sampler = sampler
        # Held until stop() lets it go: the drain thread waits on it between drains (one C call
        # a wake-up, where an Event's wait builds a lock of its own every time).
        self._stopping = threading.Lock()
        self._stopping.acquire()
        self._closing = False  # stop() has begun: a drain failing now is no reason to fall back
        self._ready = threading.Event()
        self.drain_seconds = DRAIN_SECONDS
        self._thread: threading.Thread | None = None
        self._previous_hook: Any = None
        self._hooked = False
        self._handler_ns = 0
        self._target = DrainTarget(sampler.table)
        self._gone: set[int] = set()
        # Source file -> module name, for code whose function was freed before the drain.
        self._modules: dict[str, str] = {}
        self._modules_seen = 0
        self._paused_for_tracer = False
        self._traced_at = 0.0

    @property
    def driver_name(self) -> str:
        """What makes it tick: per-thread CPU timers, or the wall thread."""
        return "wall-thread" if self._sampler.mode == "wall" else "thread-cpu-timers"

    def start(self, interval: float) -> None:
        """Starts sampling every Python thread; raises NativeEngineError where it cannot."""
        sampler, table = self._sampler, self._sampler.table
        reasons = tuple(None if name is None else table.intern(name) for name in REASONS)
        markers = (table.truncated_id, table.intern(WAITING), table.intern(UNKNOWN), reasons)
        try:
            self._native.start(
                sampler.mode,
                interval,
                table.max_depth,
                table.lineno,
                markers=markers,
                ring_bytes=RING_BYTES,
            )
        except (RuntimeError, OSError) as exc:
            raise NativeEngineError(str(exc)) from None
        try:
            _labels.use_native(self._native)
            self._hook_new_threads()
            sampler._excluded.on_change = self._on_excluded
            self._thread = threading.Thread(target=self._run, name="fleetflame-drain", daemon=True)
            self._thread.start()
            self._ready.wait()
            self._native.sync_threads(set(sampler._excluded))
        except BaseException:
            self.stop()
            raise

    def arm(self, interval: float) -> None:
        """Sets the sampling interval of every thread (the overhead budget stretches it)."""
        self._native.set_interval(interval)

    def stop(self) -> None:
        """Stops sampling, then counts what was sampled before."""
        self._closing = True
        self._unhook_new_threads()
        self._sampler._excluded.on_change = None
        self._native.stop()
        if self._stopping.locked():
            self._stopping.release()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        with self._sampler._lock:
            self.drain()
        _labels.use_native(None)
        self._native.release()

    def after_fork_in_child(self) -> None:
        """Forgets the parent's threads, timers and records (a new engine starts after)."""
        self._unhook_new_threads()
        self._native.after_fork_child()  # first: it frees the tag tables
        _labels.use_native(None)

    def forget_inherited(self) -> None:
        """In a process forked in C (no fork hooks ran): as after a fork (nothing joined)."""
        self.after_fork_in_child()

    def catch_up(self) -> None:
        """Counts what was sampled so far (called holding the sampler's lock)."""
        with self._sampler.budget.measure() as block:
            self.drain(block)

    def drain(self, block: _Measure | None = None) -> int:
        """Moves the ring's records into the counts; returns how many (holding the lock).
        ``block``: the overhead budget's measure of the work around it."""
        table, target = self._sampler.table, self._target
        table.generation += 1
        target.generation = table.generation
        records, added, dropped, freeing_ns = self._native.drain(self._resolve, target)
        if block is not None:
            # Freeing code objects that died while sampled (kept until read) is the host's
            # work, deferred to the drain: not the sampler's overhead.
            block.exclude(freeing_ns / 1e9)
        table.total += added
        self._sampler.ticks += records
        self._sampler.dropped += dropped
        return int(records)

    def _resolve(self, code: CodeType, function: Any, line: int) -> int:
        # Called by the drain for a code object it has not named yet; the name is the one the
        # pure-Python engine gives the same frame: its globals' __name__, else the file.
        filename = code.co_filename
        if function is not None:
            module = getattr(function, "__globals__", {}).get("__name__")
            if module and not filename.startswith("<") and len(self._modules) < 100_000:
                self._modules[filename] = module
        else:
            # Freed before the drain (a generator expression's, a closure's): the module of
            # another function from the same file, or the module loaded from it.
            module = self._modules.get(filename) or self._module_from_file(filename)
        return self._sampler.table.intern_frame(module, code, line)

    def name_file(self, filename: str, module: str) -> None:
        """Names the code of ``filename`` as ``module``'s where its function is gone by the
        drain and sys.modules no longer holds it (a program run as ``__main__`` by runpy)."""
        self._modules[filename] = module

    def _module_from_file(self, filename: str) -> str | None:
        if len(sys.modules) != self._modules_seen:
            self._modules_seen = len(sys.modules)
            for name, module in list(sys.modules.items()):
                path = getattr(module, "__file__", None)
                if isinstance(path, str) and len(self._modules) < 100_000:
                    self._modules.setdefault(path, name)
        return self._modules.get(filename)

    def _run(self) -> None:
        self._sampler._excluded.run_as_own(self._drain_loop)

    def _drain_loop(self) -> None:
        sampler = self._sampler
        own_thread()
        self._ready.set()
        next_sync = time.monotonic() + SYNC_SECONDS
        while not self._stopping.acquire(timeout=self.drain_seconds):
            try:
                if sampler.settings["pause_when_traced"]:
                    self._watch_tracer()
                with sampler.budget.measure() as block:
                    with sampler._lock:
                        drained = self.drain(block)
                    if time.monotonic() >= next_sync:
                        next_sync = time.monotonic() + SYNC_SECONDS
                        self._sync()
                handler_ns = self._native.handler_ns()
                spent, self._handler_ns = handler_ns - self._handler_ns, handler_ns
                sampler.budget.spent(spent / 1e9, ticks=drained)
            except NativeEngineError as exc:
                if not self._closing:
                    sampler.fall_back(str(exc))
                return
            except Exception as exc:  # noqa: BLE001 - never let the engine fail the host
                if self._closing:
                    return
                sampler.errors += 1
                if sampler.errors == 1:
                    log.exception("fleetflame sampler: the native drain failed")
                if sampler.errors >= 3:
                    sampler.fall_back(f"the native engine failed: {exc!r}")
                    return

    def _watch_tracer(self) -> None:
        # py-spy pauses a thread with PTRACE_INTERRUPT; a signal delivered at that moment is
        # re-injected and the pause lost, and py-spy waits forever with the host's other
        # threads stopped (benfred/py-spy#565). Per-thread timers make that likely within
        # seconds of `py-spy record`: no timer runs while a tracer is attached.
        tracer = self._native.tracer_pid()
        now = time.monotonic()
        if tracer:
            self._traced_at = now
            if not self._paused_for_tracer:
                self._paused_for_tracer = True
                self._native.pause_all(True)
                log.warning(
                    "fleetflame sampler: process %d traces this one (py-spy, a debugger); "
                    "native sampling paused until it detaches",
                    tracer,
                )
        elif self._paused_for_tracer and now - self._traced_at >= TRACER_QUIET_SECONDS:
            self._paused_for_tracer = False
            self._native.pause_all(False)
            log.warning("fleetflame sampler: the tracer detached; native sampling resumed")

    def _sync(self) -> None:
        sampler = self._sampler
        if not self._native.handlers_are_ours():
            raise NativeEngineError(
                "another handler replaced the native engine's SIGPROF, SIGSEGV or SIGBUS handler"
            )
        alive = self._native.sync_threads(set(sampler._excluded))
        # A thread leaves the interpreter's list a moment before its exit record is written:
        # what is kept of it goes once it has been gone for two syncs.
        with sampler._lock:
            gone = set()
            target = self._target
            for keys in (target.last_key, target.entry_key, target.last_waiting):
                for ident in [ident for ident in keys if ident not in alive]:
                    gone.add(ident)
                    if ident in self._gone:
                        del keys[ident]
            self._gone = gone

    def _on_excluded(self, ident: int, excluded: bool) -> None:
        # A host thread serving the endpoint (make_wsgi_app) is left out while it does.
        self._native.pause_thread(ident, excluded)

    # -- registering threads as they start --------------------------------------------------

    def _hook_new_threads(self) -> None:
        # threading runs its profile hook once a new thread starts; this one registers the
        # thread (its timer starts counting at once) and takes itself off again.
        self._previous_hook = threading.getprofile()
        threading.setprofile(self._on_thread_start)
        self._hooked = True

    def _unhook_new_threads(self) -> None:
        if self._hooked:
            if threading.getprofile() == self._on_thread_start:
                threading.setprofile(self._previous_hook)
            self._hooked = False

    def _on_thread_start(self, frame: FrameType, event: str, arg: Any) -> Any:
        previous = self._previous_hook
        if event == "call" and frame.f_code is _THREAD_RUN:
            # threading's own run() calls the thread's target next: the thread registers
            # there, so its entry stack (where its CPU goes if it ends unsampled) is its target.
            return previous(frame, event, arg) if previous is not None else None
        sys.setprofile(previous)
        if not threading.current_thread().name.startswith("fleetflame-"):
            self._native.register_current_thread()
        return previous(frame, event, arg) if previous is not None else None

    def info(self) -> dict[str, Any]:
        """Engine details for /info."""
        stats = self._native.stats()
        return {
            "driver": self.driver_name,
            "native": {
                "threads_sampled": stats["threads"],
                "samples": stats["samples"],
                "signals": stats["signals"],
                "faults": stats["faults"],
                "torn_samples": stats["torn"],
                "ring_full_samples": stats["dropped"],
                "samples_without_python": stats["no_python"],
                "timer_failures": stats["timer_failures"],
                "code_objects_named": stats["names_cached"],
                "tags_open": stats["tags_open"],
                "tags_lost": stats["tags_lost"],
                "handler_seconds": round(stats["handler_ns"] / 1e9, 6),
            },
        }


_THREAD_RUN = threading.Thread.run.__code__
