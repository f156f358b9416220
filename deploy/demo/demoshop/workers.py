"""The demo's workers as it has seen them: who answers on each port of the samplers' range.

Each scan asks every sampler port for its ``/info`` and records each instance that answers
once (its pid, port, service, version and pool, its parent process and whether that is a
gunicorn master the demo started, so a preforked worker), then when it was last seen. The
orchestrator (demoshop.fleet) scans every few seconds and lists the records in fleet.json, for
people and tests; a worker counts as live for 5 seconds after it last answered, which is how
the demo knows a version is up and which port to print.
"""

from __future__ import annotations

import time
from typing import Any

from demoshop import ports, procs

# Instance id -> what the demo knows of it.
Workers = dict[str, dict[str, Any]]
LIVE_SECONDS = 5


def scan(plan: ports.PortPlan, masters: set[int], workers: Workers) -> None:
    """Asks every sampler port of ``plan`` who answers there, and records them in
    ``workers``; ``masters`` are the pids of every gunicorn master the demo started."""
    now = time.time()
    for port in plan.samplers:
        info = ports.get_json(f"http://{ports.HOST}:{port}/info", timeout=1.0)
        if not info or "instance" not in info:
            continue
        instance = info["instance"]
        record = workers.setdefault(
            instance["id"],
            {
                "instance": instance["id"],
                "pid": instance["pid"],
                "port": port,
                "service": info["labels"].get("service"),
                "version": info["labels"].get("version"),
                "pool": info["labels"].get("pool"),
                "parent_pid": procs.parent_pid(instance["pid"]),
                "first_seen": now,
            },
        )
        record["last_seen"] = now
        record["preforked"] = record["parent_pid"] in masters


def live(workers: Workers, version: str, *, pool: str | None = None) -> list[dict[str, Any]]:
    """The workers of ``version`` (and of ``pool``, if given) that answered in the last
    LIVE_SECONDS."""
    fresh = time.time() - LIVE_SECONDS
    return [
        w
        for w in workers.values()
        if (pool is None or w["pool"] == pool)
        and w["version"] == version
        and w["last_seen"] >= fresh
    ]
