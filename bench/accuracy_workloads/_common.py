"""What every accuracy workload shares: the sampler from the environment, a module map, a deadline.

bench/accuracy.py starts each workload with ``FLEETFLAME_*`` set, ``ACCURACY_OUT`` (a folder)
and ``ACCURACY_SECONDS`` (how long to run at most, so a workload never outlives a harness that
was killed). A workload writes ``modules-PID.json`` there when it is ready and again when it
exits: which module each source file is (from ``sys.modules``), ``sys.path``, and whatever
facts it adds (``extra``), so that py-spy's ``function (file.py)`` frames can be named like
fleetflame's ``module:qualname``.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

_extras: list[Callable[[], dict[str, Any]]] = []


def start_script() -> float:
    """Starts the sampler and the exit hooks of a script; returns its deadline (monotonic)."""
    import sampler

    sampler.start_from_env()
    # SIGTERM from the harness exits through atexit, which writes the map a last time.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    atexit.register(write_module_map)
    return deadline()


def deadline() -> float:
    """Returns the time.monotonic() by which the workload stops by itself."""
    return time.monotonic() + float(os.environ.get("ACCURACY_SECONDS", "60"))


def record_modules_at_exit() -> None:
    """Writes the module map at interpreter exit (for a module a server imports)."""
    atexit.register(write_module_map)


def add_extra(provide: Callable[[], dict[str, Any]]) -> None:
    """Adds facts the module map carries (read when the map is written)."""
    _extras.append(provide)


def write_module_map() -> None:
    """Writes ACCURACY_OUT/modules-PID.json atomically (nothing without ACCURACY_OUT)."""
    folder = os.environ.get("ACCURACY_OUT")
    if not folder:
        return
    from sampler._trace_write import module_map

    extra: dict[str, Any] = {}
    for provide in _extras:
        extra.update(provide())
    document = {
        "pid": os.getpid(),
        "modules": module_map(None, os.path.realpath),
        "sys_path": [os.path.abspath(p) for p in sys.path if isinstance(p, str)],
        "extra": extra,
    }
    path = os.path.join(folder, f"modules-{os.getpid()}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(document, f)
    os.replace(tmp, path)


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(0)
