"""The sampler's threads named for the operating system, so `top -H` and `ps -L` tell them apart.

CPython 3.11 leaves every thread named as its process; Linux lets a process rename its own
threads through /proc (15 bytes). ``fleetflame-stalls`` shows as ``ff-stalls``.
"""

from __future__ import annotations

import threading


def name_os_thread() -> None:
    """Names the calling thread for the OS after its Python name; never fails."""
    name = threading.current_thread().name
    if name.startswith("fleetflame-"):
        name = "ff-" + name[len("fleetflame-") :]
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name[:15])
    except (OSError, ValueError):
        pass  # not Linux, or /proc not mounted: the name is only a convenience
