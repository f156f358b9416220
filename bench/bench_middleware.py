"""What stalls and the request middleware cost, on top of the sampler, measured in one run.

    python bench/bench_middleware.py [--rounds 5] [--seconds 6] [--rates 100,1000] [--quick]
                                     [--in-process]

The same app served three ways, each with the sampler at 100 Hz (the native engine where it is
built): the sampler alone (``FLEETFLAME_STALLS=0``); with stall watching (the default: every
request or event-loop callback timed, a watcher thread); and with stalls and the middleware
(``sampler.middleware``: per route latency sketches, the slowest requests' stacks). Two servers:
Flask under gunicorn (one sync worker) and FastAPI under uvicorn (an asyncio event loop, where
every callback is timed). A load generator in its own process sends each, in turn, ``rate``
requests a second (open loop, a new connection each, with X-Request-Start as a proxy sets it)
for ``seconds``; the worker's CPU over that time (all its threads, /proc/PID/task/*/schedstat)
is divided by the requests it answered. The order rotates round by round so drift on a shared
machine hits all alike; medians, each configuration's extra CPU per request over the sampler
alone and what it comes to at that rate in percent of one CPU, and the idle cost (no requests,
``seconds`` long), are printed, with the workers' RSS.

Then the same in process, without HTTP: microseconds a request on its thread (the app called
directly, with and without the middleware, interleaved), microseconds per request of the
recorder's thread, and the memory of 200 routes that each saw 10,000 requests.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from pathlib import Path

import appservers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sampler._requests import PERIOD as RECORDER_PERIOD  # noqa: E402

APPS = {
    "flask": r"""
import os, time
import flask
import sampler
import sampler.middleware

sampler.start_from_env()
app = flask.Flask(__name__)


@app.route("/items/<int:item_id>")
def item(item_id):
    end = time.perf_counter() + 0.0002  # a little work, as a real handler has
    while time.perf_counter() < end:
        pass
    return {"item": item_id, "pid": os.getpid()}


if os.environ.get("BENCH_MIDDLEWARE") == "1":
    app.wsgi_app = sampler.middleware.WSGIMiddleware(app.wsgi_app)
""",
    "fastapi": r"""
import os, time
from fastapi import FastAPI
import sampler
import sampler.middleware

sampler.start_from_env()
app = FastAPI()


@app.get("/items/{item_id}")
async def item(item_id: int):
    end = time.perf_counter() + 0.0002
    while time.perf_counter() < end:
        pass
    return {"item": item_id, "pid": os.getpid()}


if os.environ.get("BENCH_MIDDLEWARE") == "1":
    app.add_middleware(sampler.middleware.ASGIMiddleware)
""",
}
# The sampler's threads that stalls and requests add (named for the OS by the sampler).
OWN_THREADS = ("ff-stalls", "ff-requests")
# configuration -> (stalls, middleware)
CONFIGS = {"sampler": (False, False), "+stalls": (True, False), "+stalls+middleware": (True, True)}
SERVERS = {
    "flask": appservers.gunicorn("benchapp_flask:app", backlog=2048),
    "fastapi": appservers.uvicorn("benchapp_fastapi:app"),
}

LOAD = r"""
import http.client, json, sys, threading, time
port, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
total = int(rate * seconds)
lock = threading.Lock()
indexes = iter(range(total))
done = [0, 0]
start = time.monotonic() + 0.05

def worker():
    while True:
        with lock:
            index = next(indexes, None)
        if index is None:
            return
        delay = start + index / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request(
                "GET", f"/items/{index}", headers={"X-Request-Start": f"t={time.time():.6f}"}
            )
            connection.getresponse().read()
            connection.close()
            ok = 1
        except OSError:
            ok = 0
        with lock:
            done[0 if ok else 1] += 1

threads = [threading.Thread(target=worker) for _ in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"sent": done[0], "failed": done[1], "seconds": time.monotonic() - start}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server of one bench app in one configuration, its worker sampling at 100 Hz."""

    def __init__(self, folder: Path, kind: str, config: str) -> None:
        stalls, middleware = CONFIGS[config]
        self.port = free_port()
        self.sampler_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
        env.update(
            PYTHONPATH=os.pathsep.join([str(ROOT), str(folder)]),
            FLEETFLAME_PORT=str(self.sampler_port),
            FLEETFLAME_INTERVAL="0.01",
            FLEETFLAME_STALLS="1" if stalls else "0",
            BENCH_MIDDLEWARE="1" if middleware else "0",
        )
        command = [a.replace("{port}", str(self.port)) for a in SERVERS[kind]]
        self.process = subprocess.Popen(
            command,
            cwd=folder,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.sampler_port}/info", timeout=2
                ) as answer:
                    info = json.loads(answer.read())
                self.worker = int(info["instance"]["pid"])
                self.engine = str(info["engine"])
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("the bench server did not start") from None
                time.sleep(0.2)

    def cpu_ns(self) -> int:
        """The worker's CPU so far, all its threads, in nanoseconds."""
        return sum(self.threads_ns().values())

    def threads_ns(self) -> dict[str, int]:
        """The worker's CPU so far per thread name (the sampler's are named ff-*), in ns."""
        found: dict[str, int] = {}
        for task in os.listdir(f"/proc/{self.worker}/task"):
            try:
                folder = Path(f"/proc/{self.worker}/task/{task}")
                name = (folder / "comm").read_text().strip()
                spent = int((folder / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
            found[name] = found.get(name, 0) + spent
        return found

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.worker}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        appservers.stop(self.process)


def measure(server: Server, rate: float, seconds: float) -> tuple[float, int, float]:
    """Loads ``server`` at ``rate`` for ``seconds``; returns the worker's CPU us per request,
    the requests answered, and the sampler's stall and request threads' CPU in % of a CPU."""
    before, started = server.threads_ns(), time.monotonic()
    run = subprocess.run(
        [sys.executable, "-c", LOAD, str(server.port), str(rate), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
    )
    time.sleep(RECORDER_PERIOD + 0.3)  # the last answers' close and the recorder's batch
    after, elapsed = server.threads_ns(), time.monotonic() - started
    spent = sum(after.values()) - sum(before.values())
    own = sum(after.get(n, 0) - before.get(n, 0) for n in OWN_THREADS) / 1e9 / elapsed * 100
    result = json.loads(run.stdout)
    return spent / 1e3 / max(result["sent"], 1), int(result["sent"]), own


def idle(server: Server, seconds: float) -> float:
    """The worker's CPU with no requests, in percent of one CPU."""
    before = server.cpu_ns()
    time.sleep(seconds)
    return (server.cpu_ns() - before) / 1e9 / seconds * 100


def over_http(rounds: int, seconds: float, rates: list[float]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        for kind, source in APPS.items():
            (Path(folder) / f"benchapp_{kind}.py").write_text(source)
        for kind in APPS:
            servers = {config: Server(Path(folder), kind, config) for config in CONFIGS}
            try:
                compare_configs(kind, servers, rounds, seconds, rates)
            finally:
                for server in servers.values():
                    server.stop()


def compare_configs(
    kind: str, servers: dict[str, Server], rounds: int, seconds: float, rates: list[float]
) -> None:
    names = list(servers)
    engine = servers["sampler"].engine
    print(f"{kind} ({SERVERS[kind][0].split('/')[-1]}, 1 worker), sampler at 100 Hz ({engine}):")
    for server in servers.values():  # warm up: imports, first requests
        measure(server, 100, 1.0)
    idles: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            idles[name].append(idle(servers[name], min(seconds, 3.0)))
    base_idle = statistics.median(idles["sampler"])
    print(
        "  idle: "
        + ", ".join(
            f"{name} {statistics.median(idles[name]):.3f}%"
            + ("" if name == "sampler" else f" ({statistics.median(idles[name]) - base_idle:+.3f})")
            for name in names
        )
        + " of a CPU"
    )
    for rate in rates:
        per_request: dict[str, list[float]] = {name: [] for name in names}
        sent: dict[str, list[int]] = {name: [] for name in names}
        own: dict[str, list[float]] = {name: [] for name in names}
        for index in range(rounds):
            for name in names[index % len(names) :] + names[: index % len(names)]:
                us, count, threads = measure(servers[name], rate, seconds)
                per_request[name].append(us)
                sent[name].append(count)
                own[name].append(threads)
        base = statistics.median(per_request["sampler"])
        achieved = statistics.median(sent["sampler"]) / seconds
        print(f"  {rate:6.0f} req/s asked ({achieved:.0f} achieved): worker CPU a request")
        for name in names:
            value = statistics.median(per_request[name])
            runs = ", ".join(f"{x:.0f}" for x in per_request[name])
            extra = ""
            if name != "sampler":
                difference = value - base
                extra = (
                    f"  ratio {value / base:.3f}, {difference:+.1f} us = "
                    f"{difference * achieved / 1e4:+.3f}% of a CPU; its threads "
                    f"{statistics.median(own[name]):.3f}%"
                )
            print(f"    {name:20s} {value:6.0f} us{extra}   (runs: {runs})")
    print(
        "  worker RSS: "
        + ", ".join(f"{name} {server.rss_mb():.1f} MB" for name, server in servers.items())
    )


def in_process(rounds: int) -> None:
    sys.path.insert(0, str(ROOT))
    import tracemalloc

    import flask
    from werkzeug.test import EnvironBuilder

    import sampler
    import sampler.middleware
    from sampler._requests import Recorder, recorder
    from sampler.middleware._wsgi import PythonWSGIMiddleware

    def flask_app(middleware: object) -> object:
        app = flask.Flask("bench")

        @app.route("/items/<int:item_id>")
        def item(item_id: int) -> dict:
            return {"item": item_id}

        if middleware is not None:
            app.wsgi_app = middleware(app.wsgi_app)  # type: ignore[method-assign,operator]
        return app

    # WSGIMiddleware is the C path where the native extension is built; the Python path is
    # its fallback (and what the extension-less install runs).
    app, wrapped = flask_app(None), flask_app(sampler.middleware.WSGIMiddleware)
    wrapped_python = flask_app(PythonWSGIMiddleware)
    path = "C" if sampler.middleware.WSGIMiddleware is not PythonWSGIMiddleware else "Python"
    header = f"t={time.time():.6f}"
    environ = EnvironBuilder(path="/items/1", headers={"X-Request-Start": header}).get_environ()

    def start_response(status: str, headers: list, exc_info: object = None) -> None:
        return None

    def call(target: object, count: int) -> float:
        started = time.thread_time_ns()
        for _ in range(count):
            body = target(dict(environ), start_response)  # type: ignore[operator]
            for _ in body:
                pass
            close = getattr(body, "close", None)
            if close is not None:
                close()
        return (time.thread_time_ns() - started) / 1e3 / count

    s = sampler.start(port="none", interval=0.01)
    try:
        count = 10_000
        plain, with_, with_python, recorder_us, recorder_later_us = [], [], [], [], []
        for _ in range(rounds):
            recorder.reset()
            plain.append(call(app, count))
            with_.append(call(wrapped, count))
            with_python.append(call(wrapped_python, count))
            # What the recorder's thread does with them (timed here, on this thread): a route's
            # first batch (nothing kept before), then a later one.
            recorder.stop()  # its thread gone: the batch waits for the timed call below
            for timings in (recorder_us, recorder_later_us):
                recorder.pending.extend(
                    (
                        "/items/<int:item_id>",
                        time.monotonic() - 0.001 * (i % 100),
                        0.001 * (i % 100),
                        environ["HTTP_X_REQUEST_START"],
                        time.time(),
                        1,
                        False,
                        "200 OK",
                        "/items/1",
                    )
                    for i in range(count)
                )
                started = time.thread_time_ns()
                recorder.process()
                timings.append((time.thread_time_ns() - started) / 1e3 / count)
        recorder.reset()
    finally:
        sampler.stop()
    p, w, wp, r, later = (
        statistics.median(x) for x in (plain, with_, with_python, recorder_us, recorder_later_us)
    )
    print(
        f"in process, a Flask app called directly ({s.engine.name} engine, {rounds} rounds of "
        f"{count:,} requests, medians):"
    )
    print(
        f"  on the request's thread: {p:.2f} us a call without, {w:.2f} us with ({path} path): "
        f"+{w - p:.2f} us; the Python path {wp:.2f} us: +{wp - p:.2f} us"
    )
    print(
        f"  on the recorder's thread: {r:.2f} us a request in a route's first batch, {later:.2f} "
        "us in a later one (sketches, p99, slow requests' stacks)"
    )

    # A timed call (an event-loop callback's Handle._run, a request), as the stall watcher
    # wraps it: the extension's TimedCall where it is built, and the Python wrapper.
    from sampler._stall_timing import python_timed, timed

    class Handle:
        def _run(self) -> None:
            return None

    bare_run = Handle._run
    s = sampler.start(port="none", interval=0.01)
    # The Python wrapper keeps its running calls in a dict: a watcher's parts with one.
    python_table = types.SimpleNamespace(_running={}, _limits=s.stalls._limits, finished=print)
    try:
        wrappers = {
            "bare": bare_run,
            "timed": timed(bare_run, "event-loop", s.stalls, lambda args: ""),
            "timed (Python)": python_timed(bare_run, "event-loop", python_table, lambda args: ""),
        }
        handle = Handle()
        took: dict[str, list[float]] = {name: [] for name in wrappers}
        for _ in range(rounds):
            for name, method in wrappers.items():
                Handle._run = method  # type: ignore[method-assign]
                started = time.thread_time_ns()
                for _ in range(100_000):
                    handle._run()
                took[name].append((time.thread_time_ns() - started) / 1e3 / 100_000)
    finally:
        sampler.stop()
    b, t, tp = (statistics.median(took[name]) for name in wrappers)
    kind = "C" if type(wrappers["timed"]).__name__ == "TimedCall" else "Python"
    print(
        f"  a call timed for stalls: {b:.3f} us bare, {t:.3f} us timed ({kind}): +{t - b:.3f} us "
        f"a call; the Python wrapper {tp:.3f} us: +{tp - b:.3f} us"
    )

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    many = Recorder()
    for route in range(200):
        name = f"/route/{route}/<id>"
        many.pending.extend(
            (name, 0.0, 0.0005 * (1.01 ** (i % 700)), "t=1", 1.0, 1, False, 200, name)
            for i in range(10_000)
        )
        many.process()
    after = tracemalloc.take_snapshot()
    size = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    tracemalloc.stop()
    print(f"  memory: 200 routes x 10,000 requests (latencies over 700 bins): {size / 1e6:.1f} MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rates", default="100,1000", help="requests a second: 1x and 10x")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 s")
    parser.add_argument("--in-process", action="store_true", help="only the part without HTTP")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 2, 2.0
    if not args.in_process:
        over_http(args.rounds, args.seconds, [float(r) for r in args.rates.split(",")])
    in_process(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
