"""Gunicorn configuration that starts a fleetflame sampler in every worker it forks.

Activation is by environment variables only; without them the hooks do nothing:

    FLEETFLAME_PORT=8021-8036 FLEETFLAME_SERVICE=api FLEETFLAME_LABELS=version=1.4.2 \\
        gunicorn -c deploy/gunicorn.conf.py --workers 4 myapp.wsgi:application

Each worker takes the first free port of the ``FLEETFLAME_PORT`` range, so point the
collector at the same range (``127.0.0.1:8021-8036``) and it finds every worker. Settings
given on gunicorn's command line override the defaults below.

Why ``post_fork`` and not the app module: the master process never serves requests, so it
should not sample; each worker starts its own sampler, with its own instance id and port,
right after the fork. The sampler is fork-safe as well: an app loaded with ``preload_app``
that calls ``sampler.start()`` at import gets a fresh sampler in every child.
"""

from __future__ import annotations

import os

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "4"))
# Workers stop sampling when they exit; a short grace period keeps deploys quick.
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
# Gunicorn >= 25.1 opens a control socket at one fixed path per user, which several masters on
# one host (two pools, a rolling deploy) would fight over; older versions ignore the setting.
control_socket_disable = os.environ.get("GUNICORN_CONTROL_SOCKET", "off") == "off"


def post_fork(server, worker):  # noqa: ANN001 - gunicorn's hook signature
    """Starts this worker's sampler when FLEETFLAME_PORT or FLEETFLAME_ENABLE is set."""
    import sampler
    from sampler._engine_native import unavailable

    threaded = server.cfg.threads > 1 or "thread" in str(server.cfg.worker_class_str)
    python_engine = os.environ.get("FLEETFLAME_ENGINE") == "python" or unavailable() is not None
    if threaded and python_engine:
        # Threaded workers serve requests off the main thread while the main thread sleeps in
        # select(); the python engine's timer signal only runs on the main thread, so it would
        # fire late and miss the busy threads: its sampling thread sees them on time. (The
        # native engine times each thread by its own CPU clock: nothing to choose, and naming
        # a python driver would choose the python engine, far less accurate on these workers.)
        os.environ.setdefault("FLEETFLAME_DRIVER", "thread")
    started = sampler.start_from_env()
    if started is not None:
        server.log.info(
            "fleetflame sampler in worker %s: %s", worker.pid, started.url or "no endpoint"
        )


def worker_exit(server, worker):  # noqa: ANN001 - gunicorn's hook signature
    """Stops the sampler so the worker's port is free for its replacement at once."""
    import sampler

    sampler.stop()
