"""The sampler out of the way of a program that replaces itself (``os.exec*``).

An interval timer set with ``setitimer`` (the python engine's signal driver) survives
``execve``, and so does a signal pending at that moment; the program exec'd has the default
action for SIGPROF, which kills it ("Profiling timer expired"). So while a sampler runs,
``os.execv`` and ``os.execve`` (which every ``os.exec*`` calls) stop it first, and start it
again, as it was asked, if the exec fails. A child that ``subprocess`` forks to exec (with a
``preexec_fn``, the only kind that runs Python's fork hooks) is not sampled at all: see
``forked_to_exec``.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_installed = False


def install(stop: Callable[[], dict[str, Any] | None], start: Callable[..., Any]) -> None:
    """Wraps ``os.execv`` and ``os.execve``, once: ``stop()`` stops the running sampler and
    gives what it was started with (None if none runs); ``start(**those)`` starts it again."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in ("execv", "execve"):
        setattr(os, name, _stopping_first(getattr(os, name), stop, start))


def _stopping_first(
    exec_: Callable[..., Any], stop: Callable[[], dict[str, Any] | None], start: Callable[..., Any]
) -> Callable[..., Any]:
    def exec_after_stop(*args: Any, **kwargs: Any) -> Any:
        started_with = stop()
        try:
            return exec_(*args, **kwargs)
        except BaseException:
            if started_with is not None:
                start(**started_with)
            raise

    exec_after_stop.__name__ = exec_.__name__
    exec_after_stop.__qualname__ = exec_.__qualname__
    exec_after_stop.__doc__ = exec_.__doc__
    exec_after_stop.__wrapped__ = exec_  # type: ignore[attr-defined]
    return exec_after_stop


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
