"""Real servers for the middleware tests, a load generator, and reading /requests.json."""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import appservers  # bench/, on the path by conftest.py
import pytest

from sampler._engine_native import unavailable

# Both engines; the native one is skipped, with the reason, where it is not built.
ENGINES = [
    pytest.param(
        "native", marks=pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
    ),
    "python",
]
HERE = Path(__file__).resolve().parent
APPS = HERE / "apps"
ROOT = HERE.parents[1]


def env(**extra: str) -> dict[str, str]:
    """A child's environment: the repo importable, FLEETFLAME_* cleared, then ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(APPS), base.get("PYTHONPATH", "")])
    base.update(extra)
    return base


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_range(count: int) -> int:
    """The first of ``count`` consecutive free ports (checked now; a race is unlikely), below
    the kernel's ports for outgoing connections (32768 up, by default): probed there before
    anything listens, a port may be connected to itself (TCP's self-connect)."""
    for _ in range(200):
        base = random.randrange(20_000, 32_000)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free port range")


class Server:
    """A server process (gunicorn, uvicorn) whose workers run the sampler on a port range."""

    def __init__(
        self, command: list[str], workers: int, engine: str = "auto", **settings: str
    ) -> None:
        self.port = free_port()
        self.sampler_base = free_range(workers + 4)
        self.workers = workers
        command = [arg.replace("{port}", str(self.port)) for arg in command]
        self.process = subprocess.Popen(
            command,
            cwd=APPS,
            env=env(
                FLEETFLAME_PORT=f"{self.sampler_base}-{self.sampler_base + workers + 3}",
                FLEETFLAME_ENGINE=engine,
                **settings,
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            self._wait()
        except BaseException:
            self.stop()
            raise

    def _wait(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.process.stderr.read().decode()[-3000:]}")
            if len(self.sampler_urls()) == self.workers:
                try:  # a connection only: a request would be counted
                    socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
                except OSError:
                    pass
                else:
                    return
            time.sleep(0.2)
        raise TimeoutError("the server did not answer")

    def sampler_urls(self) -> list[str]:
        """The sampler endpoints of this server's processes (others may use the range too)."""
        ours = {self.process.pid, *_children(self.process.pid)}
        urls = []
        for port in range(self.sampler_base, self.sampler_base + self.workers + 4):
            url = f"http://127.0.0.1:{port}"
            try:
                with urllib.request.urlopen(url + "/info", timeout=2) as answer:
                    if json.loads(answer.read())["instance"]["pid"] in ours:
                        urls.append(url)
            # Not listening yet. A port in the ephemeral range may then even be connected to
            # itself (TCP's self-connect) and read back the request: not an HTTP answer.
            except (OSError, http.client.HTTPException):
                continue
        return urls

    def requests_documents(self, expected: int) -> list[dict]:
        """Every worker's /requests.json, once they count ``expected`` requests in all (a
        server closes an answer's body, which ends its timing, just after sending it)."""
        deadline = time.monotonic() + 10
        while True:
            documents = []
            for url in self.sampler_urls():
                with urllib.request.urlopen(url + "/requests.json", timeout=30) as answer:
                    documents.append(json.loads(answer.read()))
            if counted(documents) >= expected or time.monotonic() > deadline:
                return documents
            time.sleep(0.1)

    def stalls_documents(self) -> list[dict]:
        """Every worker's /stalls.json."""
        documents = []
        for url in self.sampler_urls():
            with urllib.request.urlopen(url + "/stalls.json", timeout=30) as answer:
                documents.append(json.loads(answer.read()))
        return documents

    def stop(self) -> None:
        appservers.stop(self.process)
        self.process.stderr.close()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def gunicorn(app: str, worker_class: str = "sync", workers: int = 1, threads: int = 1, **kw):
    command = appservers.gunicorn(
        app, workers=workers, worker_class=worker_class, threads=threads, backlog=512
    )
    return Server(command, workers, **kw)


def uvicorn(app: str, **kw) -> Server:
    return Server(appservers.uvicorn(app), 1, **kw)


@dataclass
class Sent:
    """One request as the load generator saw it."""

    index: int
    path: str
    plant: str
    started: float  # the client's monotonic clock
    latency: float  # from just before connecting to the last byte of the answer
    status: int


def request_start(index: int, now: float) -> str:
    """An X-Request-Start value, as a proxy sets it: seconds, ms or us since the epoch."""
    form = index % 3
    if form == 0:
        return f"t={now:.3f}"  # nginx's ${msec}
    if form == 1:
        return f"t={int(now * 1e3)}"  # Heroku: ms
    return f"t={int(now * 1e6)}"  # New Relic's t=us


def load(
    port: int,
    plan: list[tuple[str, str]],
    concurrency: int,
    every: float = 0.0,
    header: bool = False,
) -> list[Sent]:
    """Sends the planned (path, plant) requests from ``concurrency`` threads, one new
    connection each: closed-loop (each thread sends its next as soon as it has an answer), or
    with ``every`` open-loop (request i is sent at start + i * every, whatever the answers).
    With ``header`` each carries X-Request-Start, set when it is sent, as a proxy would."""
    results: list[Sent] = []
    lock = threading.Lock()
    next_index = iter(range(len(plan)))
    start = time.monotonic() + 0.05

    def worker() -> None:
        while True:
            with lock:
                index = next(next_index, None)
            if index is None:
                return
            if every:
                delay = start + index * every - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            path, plant = plan[index]
            headers = {"Connection": "close"}
            if plant:
                headers["X-Plant"] = plant
            began = time.monotonic()
            if header:
                headers["X-Request-Start"] = request_start(index, time.time())
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                response.read()
                status = response.status
            finally:
                connection.close()
            latency = time.monotonic() - began
            with lock:
                results.append(Sent(index, path, plant, began, latency, status))

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.sort(key=lambda sent: sent.index)
    return results


def exact_quantile(values: list[float], q: float) -> float:
    """The value of rank q * (n - 1), as the sketch defines it."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def merged_route(documents: list[dict], route: str):
    """A route's sketches (latency, queue, total) merged over workers, and its parts."""
    from sampler._sketch import Sketch

    merged = {"latency": Sketch(), "queue": Sketch(), "total": Sketch()}
    parts = []
    for document in documents:
        part = document["routes"].get(route)
        if part is not None:
            for name, sketch in merged.items():
                sketch.merge(Sketch.from_document(part[name]))
            parts.append(part)
    return merged, parts


def has_frame(stacks: dict[str, float], name: str) -> float:
    """The weight of the stacks with a frame ending in ``:name``."""
    return sum(w for s, w in stacks.items() if any(f.endswith(":" + name) for f in s.split(";")))


def counted(documents: list[dict]) -> int:
    """The requests counted in all."""
    return sum(route["count"] for d in documents for route in d["routes"].values())
