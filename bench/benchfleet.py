"""What the store and web benchmarks share: a synthetic fleet, scratch databases, a real
``fleetflame web`` in a subprocess, and the measures of a process (CPU, memory).

The fleet: ``instances`` workers in 5 services, each with ``stacks`` distinct stacks 20-50
frames deep drawn from one shared call tree (so stacks share prefixes), of which ``active``
have samples in any one minute (Zipf-like popularity), as the issue's measurements assume
(50 instances x 2,000 stacks, 200 active a minute).
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import psycopg.sql
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collector.store import CursorUpdate, SampleRow  # noqa: E402

PG_ADMIN_URL = os.environ.get(
    "FLEETFLAME_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
DAY = 86400
SERVICES = 5
_TICKS = os.sysconf("SC_CLK_TCK")


def make_stacks(rng: random.Random, count: int) -> list[str]:
    """Returns ``count`` distinct stacks 20-50 frames deep grown from a shared call tree."""
    modules = [f"app.mod{i}" for i in range(40)] + ["json", "re", "socket", "ssl", "sqlalchemy.orm"]
    trunk = [f"{rng.choice(modules)}:f{i}" for i in range(60)]
    stacks: set[str] = set()
    while len(stacks) < count:
        shared = rng.randint(8, 18)  # common prefix: the server loop, the framework
        depth = rng.randint(20, 50)
        frames = trunk[:shared] + [
            f"{rng.choice(modules)}:fn{rng.randint(0, 300)}" for _ in range(depth - shared)
        ]
        stacks.add(";".join(frames))
    return sorted(stacks)


class Fleet:
    """The synthetic fleet: per instance its stacks and a popularity-weighted sampler."""

    def __init__(self, instances: int, stacks: int, active: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        self.pool = make_stacks(rng, stacks * 2)
        self.active = active
        self.weights = [1 / (rank + 1) ** 0.8 for rank in range(stacks)]
        self.labels = {"version": "1.4.2", "env": "prod"}
        self.instances = []
        for i in range(instances):
            self.instances.append(
                {
                    "service": f"svc{i % SERVICES}",
                    "host": f"host-{i // 2}",
                    "instance": uuid.UUID(int=rng.getrandbits(128)).hex[:16],
                    "stacks": rng.sample(self.pool, stacks),
                    "cumulative": {},
                }
            )
        self.rng = rng

    def minute(self, bucket: int) -> tuple[list[SampleRow], list[CursorUpdate]]:
        """Returns one minute of fleet rows and the cursor updates that produced them."""
        rows: list[SampleRow] = []
        cursors: list[CursorUpdate] = []
        rng, labels = self.rng, self.labels
        for inst in self.instances:
            picked = dict.fromkeys(rng.choices(inst["stacks"], self.weights, k=self.active * 2))
            changed = {}
            cumulative = inst["cumulative"]
            service, host, instance = inst["service"], inst["host"], inst["instance"]
            for stack in list(picked)[: self.active]:
                count = rng.randint(1, 60)
                rows.append(SampleRow(bucket, "cpu", service, host, instance, labels, stack, count))
                key = (0, stack)
                cumulative[key] = changed[key] = cumulative.get(key, 0) + count
            cursors.append(
                CursorUpdate(
                    f"{host}:{8021 + len(cursors) % 2}",
                    instance,
                    not inst.get("seen"),
                    changed,
                    {0: {}},
                )  # fmt: skip
            )
            inst["seen"] = True
        return rows, cursors

    def hour_by_service(self, bucket: int) -> list[SampleRow]:
        """Returns an hour of the fleet in one bucket, one pseudo-instance per service: each
        of the service's stacks sampled in the hour (nearly all of them: 95%) once, with the
        hour's count. What the fleet tiers hold of an hour, at a fraction of the rows."""
        rng = self.rng
        rows = []
        for s in range(SERVICES):
            own = set().union(*(i["stacks"] for i in self.instances[s::SERVICES]))
            service = f"svc{s}"
            rows += [
                SampleRow(bucket, "cpu", service, "hourly", service, self.labels, stack, rng.randint(50, 3000))
                for stack in sorted(own)
                if rng.random() < 0.95
            ]  # fmt: skip
        return rows


@contextmanager
def database(engine: str) -> Iterator[str]:
    """Yields the URL of an empty database on ``engine`` (sqlite or postgresql), removed
    afterwards."""
    if engine == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/bench.db"
        return
    name = f"fleetflame_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.engine.make_url(PG_ADMIN_URL)
    dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            drop = psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(psycopg.sql.Identifier(name)))


def cpu_seconds(pid: int | None = None) -> float:
    """Returns the CPU time a process (this one by default) has used, user and system."""
    if pid is None:
        usage = os.times()
        return usage.user + usage.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def memory_mb(pid: int | None = None) -> tuple[float, float]:
    """Returns a process's resident memory and its peak, in MB."""
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return (int(values["VmRSS"].split()[0]) / 1024, int(values["VmHWM"].split()[0]) / 1024)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class WebServer:
    """A real ``fleetflame web`` over a database, in a subprocess, and requests to it."""

    def __init__(self, url: str, *extra: str, index_dir: str | None = None) -> None:
        """``index_dir``: where it saves and loads its stack index; by default a directory of
        its own, so it starts as on a database it never served."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._own_dir = None if index_dir is not None else tempfile.TemporaryDirectory()
        index_dir = index_dir if self._own_dir is None else self._own_dir.name
        command = [sys.executable, "-m", "webui", "--database-url", url, "--port", str(self.port)]
        command += ["--index-dir", index_dir]
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [*command, *extra], stdout=subprocess.DEVNULL, stderr=self.log, cwd=ROOT
        )
        self.started = time.perf_counter()

    def warmed(self, timeout: float = 300) -> bool:
        """Waits until the server has warmed its stack index (it logs it); tells whether it
        has, rather than given up or timed out."""
        return self.logged("stack index warmed", timeout)

    def logged(self, line: str, timeout: float = 300) -> bool:
        """Waits until the server logs ``line``; tells whether it has, rather than given up
        warming or timed out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.log.seek(0)
            text = self.log.read().decode(errors="replace")
            if line in text:
                return True
            if "could not warm" in text or self.process.poll() is not None:
                return False
            time.sleep(0.1)
        return False

    def wait(self, timeout: float = 60) -> float:
        """Waits until it answers /healthz; returns the seconds since it was started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=5) as answer:
                    if answer.status == 200:
                        return time.perf_counter() - self.started
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"fleetflame web did not answer within {timeout} s")

    def get(self, path: str) -> tuple[float, float, dict]:
        """Requests ``path``; returns the milliseconds it took, the server's CPU milliseconds
        meanwhile, and the JSON answer."""
        cpu = cpu_seconds(self.process.pid)
        began = time.perf_counter()
        with urllib.request.urlopen(self.base + path, timeout=300) as answer:
            body = answer.read()
        elapsed = 1000 * (time.perf_counter() - began)
        return elapsed, 1000 * (cpu_seconds(self.process.pid) - cpu), json.loads(body)

    def memory_mb(self) -> tuple[float, float]:
        """The server's resident memory and its peak, in MB."""
        return memory_mb(self.process.pid)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()
        if self._own_dir is not None:
            self._own_dir.cleanup()

    def __enter__(self) -> WebServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def timed(fn: Callable[[], object]) -> float:
    """Returns the milliseconds ``fn`` took."""
    began = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - began)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def verdict(value: float, target: float, *, at_most: bool = True) -> str:
    """Says how a figure compares with its target: the ratio, and whether it is met."""
    met = value <= target if at_most else value >= target
    sign = "<=" if at_most else ">="
    return f"target {sign} {target:,g} ({value / target:.2f}x) {'ok' if met else 'MISSED'}"


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
