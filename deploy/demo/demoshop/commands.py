"""The command lines and environments of the demo's processes: what each one runs, and how.

The shop runs under gunicorn twice (SYNC_WORKERS preforked sync workers, and a gthread pool),
each worker sampled through the ``post_fork`` hook of ``deploy/gunicorn.conf.py`` with the
sampler settings of ``sampler_env`` (its service, and the labels ``version`` and ``pool``); a
job worker runs beside them, the collector and the web UI read the configuration files of
demoshop.configs, and the load generator sends requests to both pools. Every process starts
from ``inherited_env()``: the user's environment less the sampler settings the demo sets
itself. Pure: the orchestrator (demoshop.fleet) starts them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from demoshop import ports

REPO = Path(__file__).resolve().parents[3]
DEMO_DIR = REPO / "deploy" / "demo"
SHOP_SERVICE = "demo-shop"
JOBS_SERVICE = "demo-jobs"
SYNC_WORKERS = 4
GTHREAD_WORKERS, GTHREAD_THREADS = 2, 4

# Sampler settings from the user's shell would change where the demo's samplers listen (or stop
# them binding at all); the demo sets these itself. FLEETFLAME_MODE, _INTERVAL and the
# collector's and web UI's variables do pass through, to experiment with.
_NOT_INHERITED = (
    "FLEETFLAME_PORT",
    "FLEETFLAME_HOST",
    "FLEETFLAME_TOKEN",
    "FLEETFLAME_SERVICE",
    "FLEETFLAME_LABELS",
    "FLEETFLAME_ENABLE",
    "FLEETFLAME_DRIVER",
)


def inherited_env() -> dict[str, str]:
    """Returns the environment the demo's processes start from."""
    return {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}


def python(*args: str) -> list[str]:
    """The command line running this Python with ``args``."""
    return [sys.executable, *args]


def sampler_env(
    plan: ports.PortPlan, var: Path, service: str, version: str, pool: str
) -> dict[str, str]:
    """The environment of a shop or job process: its sampler's settings, and the shop's."""
    return {
        "FLEETFLAME_PORT": plan.sampler_range,
        "FLEETFLAME_SERVICE": service,
        "FLEETFLAME_LABELS": f"version={version},pool={pool}",
        "DEMO_VERSION": version,
        "DEMO_DB": str(var / "shop.db"),
        "PYTHONPATH": str(DEMO_DIR),
    }


def pool_argv(plan: ports.PortPlan, pool: str) -> list[str]:
    """The gunicorn command line of the shop's ``pool`` ("sync" or "gthread")."""
    port = plan.shop_sync if pool == "sync" else plan.shop_gthread
    shape = (
        ["--workers", str(SYNC_WORKERS), "--worker-class", "sync"]
        if pool == "sync"
        else [
            "--workers",
            str(GTHREAD_WORKERS),
            "--worker-class",
            "gthread",
            "--threads",
            str(GTHREAD_THREADS),
        ]
    )
    return python(
        "-m",
        "gunicorn",
        "-c",
        str(REPO / "deploy" / "gunicorn.conf.py"),
        *shape,
        "--bind",
        f"{ports.HOST}:{port}",
        "--reuse-port",
        "--graceful-timeout",
        "5",
        "--pythonpath",
        str(DEMO_DIR),
        "demoshop.app:create_app()",
    )


def jobs_argv(var: Path) -> list[str]:
    """The command line of the job worker."""
    return python("-m", "demoshop.jobs", "--db", str(var / "shop.db"))


def collector_argv(config: Path) -> list[str]:
    """The command line of the collector, reading ``config``."""
    return python("-m", "collector", "--config", str(config))


def webui_argv(config: Path, plan: ports.PortPlan) -> list[str]:
    """The command line of the web UI, reading ``config``."""
    return python(
        "-m", "webui", "--config", str(config), "--host", ports.HOST, "--port", str(plan.web_ui)
    )


def loadgen_argv(plan: ports.PortPlan, rate: float) -> list[str]:
    """The command line of the load generator: ``rate`` requests a second to both pools."""
    return python(
        "-m",
        "demoshop.loadgen",
        "--rate",
        str(rate),
        "--url",
        f"http://{ports.HOST}:{plan.shop_sync}",
        "--url",
        f"http://{ports.HOST}:{plan.shop_gthread}",
    )


def expected_workers() -> int:
    """How many sampled processes a version of the shop runs: its workers and the job worker."""
    return SYNC_WORKERS + GTHREAD_WORKERS + 1
