"""The demo orchestrator behind ``make demo``: the shop fleet, the collector, the web UI and load.

Everything listens on 127.0.0.1. The shop runs under gunicorn twice (4 preforked sync workers,
and a gthread pool), each worker sampled through the ``post_fork`` hook of
``deploy/gunicorn.conf.py``; a job worker runs beside them. After ``--deploy-after`` seconds,
version 1.4.2 replaces 1.4.1 in a rolling deploy (new pools bind the same ports with
SO_REUSEPORT, then the old ones drain), so the compare view has a real regression to show.
Ctrl-C (or ``--duration``) stops every process group and checks that the ports are free.
What each process runs is in demoshop.commands, the workers seen in demoshop.workers, the text
printed once everything answers in demoshop.banner.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from demoshop import (
    GOOD_VERSION,
    REGRESSED_VERSION,
    banner,
    catalog,
    commands,
    configs,
    ports,
    procs,
    settings,
    workers,
)
from demoshop.commands import JOBS_SERVICE, REPO, SHOP_SERVICE

STOP_TIMEOUT = 15.0
READY_TIMEOUT = 90.0


class DemoError(RuntimeError):
    """The demo cannot start or run; the message says what to do."""


class Demo:
    """One run of the demo: its ports, its processes and the fleet it has seen."""

    def __init__(self, options: Any) -> None:
        self.options = options
        self.var = Path(options.var_dir).resolve()
        self.run_id = secrets.token_hex(6)
        self.stop_event = threading.Event()
        self.started = time.time()
        self.plan: ports.PortPlan | None = None
        self.supervisor = procs.Supervisor(self.run_id, self.var / "logs", commands.inherited_env())
        self.pools: dict[str, procs.Child] = {}  # role -> current child
        self.masters: set[int] = set()  # every gunicorn master started, old versions included
        self.workers: workers.Workers = {}  # instance id -> what we know of it
        self.deployed_at: float | None = None
        self.version = GOOD_VERSION

    # -- setup -------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Locks the var folder, ends leftovers of a killed run, checks the ports."""
        self.var.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.var / "demo.lock", "w")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DemoError(
                f"another demo is running with {self.var}; stop it, or pass --var-dir"
            ) from None
        previous = self.var / "run.json"
        if previous.exists():
            with contextlib.suppress(ValueError, KeyError, OSError):
                old_run = json.loads(previous.read_text())["run_id"]
                if left := procs.kill_leftovers(old_run):
                    print(f"ended {len(left)} processes left over by an interrupted demo run")
        configs.write_atomically(previous, json.dumps({"run_id": self.run_id, "pid": os.getpid()}))
        if self.options.fresh:
            for name in ("fleetflame.db", "shop.db", "fleet.json"):
                for suffix in ("", "-wal", "-shm", "-journal"):
                    with contextlib.suppress(FileNotFoundError):
                        (self.var / (name + suffix)).unlink()
            for folder in ("logs", "index"):
                shutil.rmtree(self.var / folder, ignore_errors=True)
        if self.options.base_port == "auto":
            plan = ports.find_free_plan()
        else:
            plan = ports.PortPlan(int(self.options.base_port))
            if busy := ports.busy_ports(plan):
                raise DemoError(
                    f"port(s) {', '.join(map(str, busy))} on 127.0.0.1 are in use: stop what "
                    "listens there, or pick other ports with --base-port N (or auto)"
                )
        self.plan = plan
        catalog.ensure_catalog(self.var / "shop.db")

    # -- processes ---------------------------------------------------------------------------

    def _start_pool(self, pool: str, version: str) -> procs.Child:
        assert self.plan is not None
        env = commands.sampler_env(self.plan, self.var, SHOP_SERVICE, version, pool)
        argv = commands.pool_argv(self.plan, pool)
        child = self.supervisor.start(f"shop-{pool}-{version}", argv, env, cwd=REPO)
        self.masters.add(child.pid)
        return child

    def _start_jobs(self, version: str) -> procs.Child:
        assert self.plan is not None
        env = commands.sampler_env(self.plan, self.var, JOBS_SERVICE, version, "jobs")
        return self.supervisor.start(f"jobs-{version}", commands.jobs_argv(self.var), env, cwd=REPO)

    def start(self) -> None:
        """Starts collector, web UI, the shop at 1.4.1, the job worker and the load generator."""
        assert self.plan is not None
        collector_cfg = configs.write_collector_config(
            self.var, self.plan, self.options.poll_interval
        )
        self.collector = self.supervisor.start(
            "collector", commands.collector_argv(collector_cfg), {}, cwd=REPO
        )
        web_cfg = configs.write_web_config(self.var)
        self.web = self.supervisor.start(
            "webui", commands.webui_argv(web_cfg, self.plan), {}, cwd=REPO
        )
        for pool in ("sync", "gthread"):
            self.pools[pool] = self._start_pool(pool, GOOD_VERSION)
        self.pools["jobs"] = self._start_jobs(GOOD_VERSION)
        self._wait_ready(GOOD_VERSION)
        self.loadgen = self.supervisor.start(
            "loadgen",
            commands.loadgen_argv(self.plan, self.options.rate),
            {"PYTHONPATH": str(commands.DEMO_DIR)},
            cwd=REPO,
        )

    def _wait_ready(self, version: str) -> None:
        assert self.plan is not None
        checks = {
            "shop (sync pool)": lambda: ports.answers(
                f"http://{ports.HOST}:{self.plan.shop_sync}/healthz"
            ),
            "shop (gthread pool)": lambda: ports.answers(
                f"http://{ports.HOST}:{self.plan.shop_gthread}/healthz"
            ),
            "collector": lambda: ports.answers(
                f"http://{ports.HOST}:{self.plan.collector_health}/healthz"
            ),
            "web UI": lambda: ports.answers(f"http://{ports.HOST}:{self.plan.web_ui}/healthz"),
            f"{commands.expected_workers()} samplers at {version}": lambda: (
                self._count_version(version) >= commands.expected_workers()
            ),
        }
        deadline = time.monotonic() + READY_TIMEOUT
        for name, check in checks.items():
            while not check():
                self._check_children()
                if self.stop_event.is_set():
                    return
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"{name} did not come up within {READY_TIMEOUT:.0f} s; see {self.var / 'logs'}"
                    )
                time.sleep(0.3)

    def _check_children(self) -> None:
        for child in self.supervisor.exited():
            if child.name == "loadgen" and self.stop_event.is_set():
                continue
            tail = child.log_path.read_text(errors="replace").splitlines()[-15:]
            raise DemoError(
                f"{child.name} exited with status {child.popen.returncode}; the end of "
                f"{child.log_path}:\n    " + "\n    ".join(tail)
            )

    # -- the fleet ---------------------------------------------------------------------------

    def scan(self) -> None:
        """Asks every sampler port who answers there, and records the workers in fleet.json."""
        assert self.plan is not None
        workers.scan(self.plan, self.masters, self.workers)
        self.write_state()

    def _count_version(self, version: str) -> int:
        self.scan()
        return len(workers.live(self.workers, version))

    def write_state(self, **extra: Any) -> None:
        """Writes var/demo/fleet.json: ports, processes and every worker seen (for people and tests)."""
        assert self.plan is not None
        state = {
            "run_id": self.run_id,
            "started": self.started,
            "deployed_at": self.deployed_at,
            "version": self.version,
            "database_url": configs.database_url(self.var),
            "urls": self.urls(),
            "sampler_ports": self.plan.sampler_range,
            "processes": {c.name: c.pid for c in self.supervisor.children},
            "workers": list(self.workers.values()),
            **extra,
        }
        configs.write_atomically(self.var / "fleet.json", json.dumps(state, indent=2))

    def urls(self) -> dict[str, str]:
        assert self.plan is not None
        base = f"http://{ports.HOST}"
        return {
            "web_ui": f"{base}:{self.plan.web_ui}/",
            "shop_sync": f"{base}:{self.plan.shop_sync}/",
            "shop_gthread": f"{base}:{self.plan.shop_gthread}/",
            "collector_health": f"{base}:{self.plan.collector_health}/healthz",
        }

    def deploy(self, version: str) -> None:
        """Rolls ``version`` out: new pools next to the old ones, then the old ones drain."""
        print(
            f"deploying demo-shop {version} (rolling: new workers first, then the old ones drain)",
            flush=True,
        )
        old = dict(self.pools)
        for pool in ("sync", "gthread"):
            self.pools[pool] = self._start_pool(pool, version)
        self.pools["jobs"] = self._start_jobs(version)
        self.version = version
        self._wait_ready(version)
        for child in old.values():
            self.supervisor.stop(child, STOP_TIMEOUT)
        self.deployed_at = time.time()
        port = self._live_worker_port(version)
        print(
            f"demo-shop {version} is live; compare the versions in the web UI\n"
            f"  its workers answer on new ports (the old ones are gone), for example:\n"
            f"  curl http://127.0.0.1:{port}/stacks",
            flush=True,
        )

    def _live_worker_port(self, version: str) -> int:
        """The sampler port of a sync worker of ``version`` that answered the last scan."""
        assert self.plan is not None
        self.scan()
        live = workers.live(self.workers, version, pool="sync")
        return min(w["port"] for w in live) if live else self.plan.samplers[0]

    # -- run and stop ------------------------------------------------------------------------

    def banner(self) -> str:
        """The URLs and curl commands printed once everything answers."""
        assert self.plan is not None
        return banner.text(
            urls=self.urls(),
            run_id=self.run_id,
            var=self.var,
            sampler_range=self.plan.sampler_range,
            worker_port=self._live_worker_port(self.version),
            deploy_after=self.options.deploy_after,
            duration=self.options.duration,
        )

    def loop(self) -> None:
        """Refreshes fleet.json and deploys 1.4.2 on time, until Ctrl-C or --duration."""
        deploy_at = (
            self.started + self.options.deploy_after if self.options.deploy_after >= 0 else None
        )
        end = self.started + self.options.duration if self.options.duration else None
        while not self.stop_event.wait(2.0):
            self._check_children()
            self.scan()
            now = time.time()
            if deploy_at is not None and now >= deploy_at and self.version == GOOD_VERSION:
                self.deploy(REGRESSED_VERSION)
            if end is not None and now >= end:
                break

    def shutdown(self) -> int:
        """Stops every process group, newest first; returns 0 when all went cleanly."""
        order = [
            "loadgen",
            *(c.name for c in self.supervisor.children if c.name.startswith("shop-")),
            *(c.name for c in self.supervisor.children if c.name.startswith("jobs-")),
            "webui",
            "collector",
        ]
        killed = []
        for name in order:
            for child in [c for c in self.supervisor.children if c.name == name]:
                if not self.supervisor.stop(child, STOP_TIMEOUT):
                    killed.append(name)
        killed += self.supervisor.stop_all(STOP_TIMEOUT)
        leftovers = procs.pids_of_run(self.run_id)
        busy: list[int] = []
        if self.plan is not None:
            # Ports are released when the listening processes are gone; allow a moment.
            ports.wait_until(lambda: not ports.listening_ports(self.plan), timeout=10)
            busy = ports.listening_ports(self.plan)
            self.write_state(
                stopped=time.time(), killed=killed, leftover_pids=leftovers, busy_ports=busy
            )
        clean = not killed and not leftovers and not busy
        print(
            "demo stopped: "
            + (
                "every process exited, every port is free"
                if clean
                else f"had to kill {killed}, leftover pids {leftovers}, busy ports {busy}"
            ),
            flush=True,
        )
        return 0 if clean else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; returns the exit status."""
    options = settings.parse_args(argv)
    demo = Demo(options)
    interrupts = 0

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        demo.stop_event.set()
        if interrupts == 1:
            print(
                "\nstopping the demo (Ctrl-C again is not needed; it takes a few seconds)",
                flush=True,
            )

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    status = 1
    try:
        demo.prepare()
        demo.start()
        if not demo.stop_event.is_set():
            demo.scan()
            print(demo.banner(), flush=True)
            demo.loop()
        status = 0
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr, flush=True)
    finally:
        if demo.plan is not None:
            shutdown_status = demo.shutdown()
            status = status or shutdown_status
    return status
