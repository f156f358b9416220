"""The demo's port plan on 127.0.0.1, and checks that ports are free or answering."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
SAMPLER_OFFSET = 21  # so the default plan puts the samplers on 8021-8040, the sampler's usual range
SAMPLER_PORTS = 20  # two versions of every pool side by side during the rolling deploy, plus room


@dataclass(frozen=True)
class PortPlan:
    """Every port the demo listens on, derived from one base port."""

    base: int

    @property
    def web_ui(self) -> int:
        return self.base

    @property
    def shop_sync(self) -> int:
        return self.base + 1

    @property
    def shop_gthread(self) -> int:
        return self.base + 2

    @property
    def collector_health(self) -> int:
        return self.base + 3

    @property
    def samplers(self) -> range:
        return range(self.base + SAMPLER_OFFSET, self.base + SAMPLER_OFFSET + SAMPLER_PORTS)

    @property
    def sampler_range(self) -> str:
        """The samplers' ports as a ``first-last`` range, the form FLEETFLAME_PORT takes."""
        return f"{self.samplers[0]}-{self.samplers[-1]}"

    def all_ports(self) -> list[int]:
        return [
            self.web_ui,
            self.shop_sync,
            self.shop_gthread,
            self.collector_health,
            *self.samplers,
        ]


def port_is_free(port: int, host: str = HOST) -> bool:
    """Tells whether a listening socket could bind ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # The servers we start set SO_REUSEADDR too, so TIME_WAIT leftovers do not count as busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def busy_ports(plan: PortPlan) -> list[int]:
    """Returns the ports of ``plan`` that something else already listens on."""
    return [port for port in plan.all_ports() if not port_is_free(port)]


def port_is_listening(port: int, host: str = HOST) -> bool:
    """Tells whether something accepts connections on ``host:port``.

    Unlike port_is_free() this ignores sockets that only use the port: the kernel picks
    source ports of outgoing connections from the same range, and one closed a moment ago
    keeps its port bound for a minute, though nothing of ours holds it.
    """
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def listening_ports(plan: PortPlan) -> list[int]:
    """Returns the ports of ``plan`` that something still accepts connections on."""
    return [port for port in plan.all_ports() if port_is_listening(port)]


def first_ephemeral_port() -> int:
    """The lowest port the kernel picks for outgoing connections (Linux: 32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def find_free_plan(attempts: int = 50, rng: random.Random | None = None) -> PortPlan:
    """Picks a base port whose whole plan is free, for tests and ``--base-port auto``: below
    the ports of outgoing connections where it can, since a probe of a port there that
    nothing listens on yet may be connected to itself (TCP's self-connect) and read its own
    request back, or take the port for a moment."""
    rng = rng or random.Random()
    span = SAMPLER_OFFSET + SAMPLER_PORTS
    top = first_ephemeral_port() - span
    if top <= 21_000:  # a system handing out low ports: any block will do
        top = 60_000
    for _ in range(attempts):
        plan = PortPlan(rng.randrange(20_000, top, 50))
        if not busy_ports(plan):
            return plan
    raise RuntimeError(f"found no free block of ports after {attempts} attempts")


def get_json(url: str, timeout: float = 2.0) -> Any | None:
    """Returns the JSON body at ``url``, or None when nothing answers there (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError, http.client.HTTPException):  # HTTPError is an OSError
        return None


def answers(url: str, timeout: float = 2.0) -> bool:
    """Tells whether ``url`` answers with a 2xx status."""
    with contextlib.suppress(OSError, http.client.HTTPException):
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    return False


def wait_until(predicate: Any, timeout: float, interval: float = 0.25) -> bool:
    """Polls ``predicate()`` until it is true or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
