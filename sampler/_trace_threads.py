"""Setting a profile function on threads that are already running (CPython 3.10 and 3.11).

``sys.setprofile`` reaches the calling thread and ``threading.setprofile`` the threads started
after it; before 3.12 Python has no call for the threads already running, which 3.12 added as
``sys._setprofileallthreads``. This does what that call does, through ``ctypes`` and the C API
those versions export (``_PyEval_SetProfile`` on each thread state). The one thing not
exported, the C trampoline that calls a Python profile function, is read from the calling
thread's state after ``sys.setprofile``, at an offset found by looking for the function there
and checked twice before anything is written; where any check fails nothing is changed and the
caller is told why.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

# Pointer-sized slots of a PyThreadState searched for c_profileobj (it is the 10th on 3.10 and
# 3.11, after prev, next, interp, a few ints, cframe, c_profilefunc and c_tracefunc).
_SLOTS_SEARCHED = 32


class _Probe:
    """A profile function that does nothing, to be found by its address."""

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        return None


def other_threads_profiler() -> tuple[Callable[[Callable[..., Any]], tuple[int, int]] | None, str]:
    """Returns a function that makes its argument the profile function of every other thread
    of this interpreter that has none and returns how many got it and how many had one of
    their own; or None and why that cannot be done here. The preparation (importing ctypes,
    finding the trampoline) is done before, so the setting itself is quick."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in ((3, 10), (3, 11)):
        version = ".".join(map(str, sys.version_info[:2]))
        return None, f"not possible on {sys.implementation.name} {version}"
    import ctypes

    api = ctypes.pythonapi
    api.PyThreadState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    set_profile = api._PyEval_SetProfile
    set_profile.restype = ctypes.c_int
    set_profile.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.py_object]

    def slots(state: int) -> list[int]:
        return [
            ctypes.c_void_p.from_address(state + i * 8).value or 0 for i in range(_SLOTS_SEARCHED)
        ]

    me = api.PyThreadState_Get()
    previous = sys.getprofile()
    first, second = _Probe(), _Probe()
    try:
        sys.setprofile(first)
        with_first = slots(me)
        sys.setprofile(second)
        with_second = slots(me)
        sys.setprofile(None)
        without = slots(me)
    finally:
        sys.setprofile(previous)
    found = [i for i in range(2, _SLOTS_SEARCHED) if with_first[i] == id(first)]
    if ctypes.sizeof(ctypes.c_void_p) != 8 or len(found) != 1:
        return None, "the profile function's place in the thread state was not found"
    obj = found[0]
    func = obj - 2  # c_profilefunc, c_tracefunc, c_profileobj
    trampoline = with_first[func]
    if not (
        trampoline
        and with_second[obj] == id(second)
        and with_second[func] == trampoline
        and without[obj] == 0
        and without[func] == 0
    ):
        return None, "the thread state did not hold the profile function where expected"

    def profile_others(function: Callable[..., Any]) -> tuple[int, int]:
        count = skipped = 0
        # No other thread may run (and end, freeing its state) while the list is walked: a
        # long switch interval keeps the GIL here, no collection runs finalizers in between.
        interval = sys.getswitchinterval()
        collecting = gc.isenabled()
        gc.disable()
        sys.setswitchinterval(1000.0)
        try:
            state = api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
            while state:
                held = ctypes.c_void_p.from_address(state + func * 8).value
                if state == me:
                    pass
                elif held:
                    skipped += 1
                elif set_profile(state, trampoline, function) == 0:
                    count += 1
                state = api.PyThreadState_Next(state)
        finally:
            sys.setswitchinterval(interval)
            if collecting:
                gc.enable()
        return count, skipped

    return profile_others, ""
