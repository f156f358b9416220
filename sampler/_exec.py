"""The sampler out of the way of a program that replaces itself (``os.exec*``).

An interval timer set with ``setitimer`` (the python engine's signal driver) survives
``execve``, and so does a signal pending at that moment; the program exec'd has the default
action for SIGPROF, which kills it ("Profiling timer expired"). So ``os.execv`` and
``os.execve`` (which every ``os.exec*`` calls) first stop that timer and take off a tick
already pending, and set the timer again if the exec fails: the sampler itself goes on, its
counts and endpoint as they were. (The native engine's timers, made with ``timer_create``,
end at an exec.) A child that ``subprocess`` forks to exec (with a ``preexec_fn``, the only
kind that runs Python's fork hooks) is not sampled at all: see ``forked_to_exec``.
"""

from __future__ import annotations

import functools
import os
import sys

from ._drivers import quiet_for_exec

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_installed = False


def install() -> None:
    """Wraps ``os.execv`` and ``os.execve``, once."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in ("execv", "execve"):
        setattr(os, name, _quiet_first(getattr(os, name)))


def _quiet_first(exec_: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(exec_)
    def exec_quietly(*args: Any, **kwargs: Any) -> Any:
        resume = quiet_for_exec()
        try:
            return exec_(*args, **kwargs)
        except BaseException:
            if resume is not None:
                resume()
            raise

    return exec_quietly


def forked_to_exec() -> bool:
    """Whether this process is a child ``subprocess`` forked to exec a program (its
    ``preexec_fn`` about to run): the parent's frames it inherited include Popen's."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_execute_child" and code.co_filename.endswith("subprocess.py"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
