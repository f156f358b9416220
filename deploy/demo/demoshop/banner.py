"""The text the demo prints once everything answers: where each part listens, what to try.

It names the web UI's pages worth opening first (the compare view of the two versions, the
worst cases), the shop's pools, the collector and the samplers' ports, and curl commands to
run against one worker and the fleet. A worker's port changes when the demo deploys 1.4.2:
the caller passes one that answered the last scan.
"""

from __future__ import annotations

from pathlib import Path

from demoshop import GOOD_VERSION, REGRESSED_VERSION
from demoshop.commands import GTHREAD_THREADS, GTHREAD_WORKERS, SHOP_SERVICE, SYNC_WORKERS


def text(
    *,
    urls: dict[str, str],
    run_id: str,
    var: Path,
    sampler_range: str,
    worker_port: int,
    deploy_after: float,
    duration: float,
) -> str:
    """The banner: ``urls`` as Demo.urls gives them, ``worker_port`` a live worker's sampler
    port; ``deploy_after`` below 0 means no deploy, ``duration`` 0 no end but Ctrl-C."""
    ui = urls["web_ui"].rstrip("/")
    lines = [
        "",
        f"fleetflame demo is running on 127.0.0.1 (run {run_id}, files in {var})",
        f"  web UI        {urls['web_ui']}",
        f"  compare       {ui}/compare?service={SHOP_SERVICE}&from=-15m"
        f"&a_label=version:{GOOD_VERSION}&b_label=version:{REGRESSED_VERSION}"
        + (f"   (1.4.2 deploys in {deploy_after:.0f} s)" if deploy_after >= 0 else ""),
        f"  worst cases   {ui}/worst?service={SHOP_SERVICE}&from=-15m   "
        "(stalls, each route's latency, the slowest requests)",
        f"  shop          {urls['shop_sync']} ({SYNC_WORKERS} sync workers), "
        f"{urls['shop_gthread']} (gthread: {GTHREAD_WORKERS} workers x {GTHREAD_THREADS} threads)",
        f"  collector     {urls['collector_health']}",
        f"  samplers      127.0.0.1:{sampler_range} (each worker on its own port; "
        f"{var / 'fleet.json'} lists them)",
        "",
        "try (a worker's port changes when the demo deploys 1.4.2; it prints the new one):",
        f"  curl http://127.0.0.1:{worker_port}/stacks                       # a worker's folded stacks",
        f"  curl -o worker.svg http://127.0.0.1:{worker_port}/flamegraph.svg  # a worker's flamegraph",
        f"  curl '{ui}/api/folded?service={SHOP_SERVICE}&from=-5m'   # the fleet, last 5 minutes",
        "",
        "Ctrl-C stops everything." if not duration else f"stopping by itself after {duration:g} s.",
        "",
    ]
    return "\n".join(lines)
