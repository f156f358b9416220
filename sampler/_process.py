"""The process's one sampler: ``start()``, ``stop()``, ``running()``, ``start_from_env()``.

At most one sampler runs per process. It survives ``fork()``: the child starts over with fresh
counts, a new instance id, its own timer and its own endpoint (gunicorn's ``preload_app``);
with ``follow_fork`` off it stops in the child, as in a child ``subprocess`` forks to exec.
Its timer stops before the program execs (sampler/_exec.py).
"""

from __future__ import annotations

import atexit
import os
import threading

from . import _cpuclock, _exec, _settings
from ._core import Sampler, SamplerError
from ._log import log
from ._osthread import green_threads
from .settings import is_loopback

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

_running: Sampler | None = None
# Taken by start() and stop(), and around every fork (a child must not inherit it held by a
# thread it does not have: its exit's stop() waited forever); reentrant, for a fork inside.
_start_lock = threading.RLock()
_exit_hook_installed = False


def start(**overrides: Any) -> Sampler:
    """Starts sampling and the HTTP endpoint; returns the running Sampler (the same one twice)."""
    global _running, _exit_hook_installed
    with _start_lock:
        if _running is not None and _running.instance["pid"] != os.getpid():
            raise SamplerError(
                "the sampler runs in the parent of this process, which forked it without "
                "Python's fork hooks (uWSGI without py-call-osafterfork): a thread started "
                "here could hang on a lock the parent's threads held; set py-call-osafterfork "
                "(deploy/uwsgi/uwsgi.ini) or lazy-apps"
            )
        if _running is not None:
            return _running
        green = green_threads()
        if green is not None:
            raise SamplerError(
                f"threads are {green}'s greenlets here (gevent or eventlet monkey patching): "
                "the sampler's threads would stop the process; start the sampler before "
                "monkey patching (gunicorn: in post_fork, as deploy/gunicorn.conf.py does)"
            )
        settings = _settings.resolve(overrides)
        _check_bounds(settings)
        _cpuclock.note_a_fork()
        host, token = settings["host"], settings["token"]
        if settings["port"] is not None and not token and not is_loopback(host):
            raise _settings.ConfigError(
                f"binding the sampler endpoint to {host!r} exposes stack traces: set a token "
                "(token=... or FLEETFLAME_TOKEN) or bind to 127.0.0.1"
            )
        _exec.install()  # first: a program may exec while its timer is being set
        sampler = Sampler(settings)
        sampler.start()
        _running = sampler
        if not _exit_hook_installed:
            atexit.register(stop)
            _exit_hook_installed = True
        return sampler


# Beyond these the engines cannot work: a timer of under 0.1 ms, an interval a budget stretch
# could not express, a stack record larger than the native engine's ring.
_BOUNDS = {"interval": (0.0001, 3600.0), "max_depth": (1, 4096)}


def _check_bounds(settings: dict[str, Any]) -> None:
    for name, (low, high) in _BOUNDS.items():
        if not low <= settings[name] <= high:
            raise _settings.ConfigError(
                f"{name} must be from {low:g} to {high:g}, got {settings[name]!r}"
            )


def stop() -> None:
    """Stops the running sampler, if any, restoring any previous signal handler."""
    global _running
    # Held until the sampler has stopped: a start() meanwhile waits, rather than starting an
    # engine whose process-wide state (timers, tag table) this stop would then tear down.
    with _start_lock:
        sampler, _running = _running, None
        if sampler is not None and sampler.instance["pid"] != os.getpid():
            _forget_inherited(sampler)
        elif sampler is not None:
            sampler.stop()


def _forget_inherited(sampler: Sampler) -> None:
    """Forgets the sampler a process forked in C inherited (uWSGI's workers without
    py-call-osafterfork: no fork hook ran). Its threads are the parent's and not here, so none
    is waited for (stopping joined each for 5 s: 35 s at a worker's exit); its endpoint's socket
    is closed, its wrappers taken off, its engine's process state (the native engine's, the
    signal handler) put back. Nothing is started here: a thread started in such a child can
    hang on a lock one of the parent's threads held at the fork (start() refuses)."""
    try:
        if sampler.server is not None:
            sampler.server.close_inherited()
            sampler.server = None
        if sampler.stalls is not None:
            sampler.stalls.after_fork_in_child()
        sampler.engine.forget_inherited()
    except Exception:  # noqa: BLE001 - never break the host
        log.exception("fleetflame sampler: could not forget the parent's sampler")


# What _before_fork took: (the sampler whose lock it holds, whether it ran).
_held_for_fork: tuple[Sampler | None, bool] = (None, False)


def running() -> Sampler | None:
    """Returns the running sampler, or None."""
    return _running


def start_from_env() -> Sampler | None:
    """Starts the sampler if FLEETFLAME_PORT or FLEETFLAME_ENABLE is set; never raises."""
    if not (
        os.environ.get("FLEETFLAME_PORT")
        or _settings.parse_bool(os.environ.get("FLEETFLAME_ENABLE", "0"))
    ):
        return None
    try:
        return start()
    except (SamplerError, _settings.ConfigError) as exc:
        log.warning("fleetflame sampler not started: %s", exc)
        return None


def _before_fork() -> None:
    global _held_for_fork
    _start_lock.acquire()
    sampler = _running
    if sampler is not None:
        # The child must not inherit the lock taken, nor counts half copied.
        sampler._lock.acquire()
    _held_for_fork = sampler, True


def _after_fork_parent() -> None:
    _release_for_fork(in_child=False)


def _after_fork_child() -> None:
    try:
        _restart_in_child()
    finally:
        _release_for_fork(in_child=True)


def _release_for_fork(in_child: bool) -> None:
    """Releases what _before_fork took, if it ran: uWSGI forks in C and calls only the child's
    hook (py-call-osafterfork), which released locks never taken (a RuntimeError at every
    worker's start). The child's sampler has a lock of its own (_restart_in_child)."""
    global _held_for_fork
    sampler, held = _held_for_fork
    _held_for_fork = None, False
    if not held:
        return
    if sampler is not None and not in_child:
        sampler._lock.release()
    _start_lock.release()


def _restart_in_child() -> None:
    global _running
    sampler = _running
    if sampler is None:
        return
    try:
        # A child subprocess forked to exec is not sampled: the timer it would set survives the
        # exec, and kills the program exec'd (sampler/_exec.py).
        if sampler.settings["follow_fork"] and not _exec.forked_to_exec():
            sampler.after_fork_in_child()
        else:
            _running = None
            sampler._lock = threading.Lock()
            if sampler.server is not None:  # the parent's listening socket is the parent's
                sampler.server.close_inherited()
                sampler.server = None
            # The parent's engine state (its timers, threads, locks) is not the child's.
            sampler.engine.after_fork_in_child()
            sampler.stop()
    except Exception:  # noqa: BLE001 - never break the host's fork
        log.exception("fleetflame sampler: could not restart after fork; sampling stopped")
        _running = None


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
)
