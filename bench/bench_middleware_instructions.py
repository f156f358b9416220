"""Instructions a request the request middleware costs, counted by valgrind.

    python bench/bench_middleware_instructions.py [--requests 2000]

The clock on a shared 2-core machine swings by more than the middleware costs; instructions
do not. A Flask request (WSGI) and a FastAPI request (ASGI, the app awaited in an event loop)
are called in process (no HTTP), the sampler started but not ticking (an hour's interval) and
stalls off (the watcher's cost is bench/bench_watcher.py's), under ``valgrind
--tool=callgrind``, the main thread's instructions counted apart from the sampler's threads
(theirs follow the clock, which valgrind slows); each count is a run of ``--requests``
requests less a run of none, divided by the requests, the objects of the warm-up frozen out
of the collector's way. Per framework three apps: bare, the middleware (its C parts where the
native extension is built) and its Python fallback. The request's thread only: the recorder's
thread is kept off and its queue emptied every 500 requests, as the thread would take it.
Then the recorder's own work: batches of 500 finished requests (1,000 requests a second, its
0.5 s period), counted less building them. Printed beside the bare request, as ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

REQUESTS = r"""
import gc, sys
sys.path.insert(0, sys.argv[3])
import flask
from werkzeug.test import EnvironBuilder
import sampler, sampler.middleware
from sampler._requests import recorder
from sampler.middleware._wsgi import PythonWSGIMiddleware

kind, count = sys.argv[1], int(sys.argv[2])
app = flask.Flask("bench")


@app.route("/items/<int:item_id>")
def item(item_id):
    return {"item": item_id}


if kind == "c":
    app.wsgi_app = sampler.middleware.WSGIMiddleware(app.wsgi_app)
elif kind == "python":
    app.wsgi_app = PythonWSGIMiddleware(app.wsgi_app)
environ = EnvironBuilder(path="/items/1", headers={"X-Request-Start": "t=1.0"}).get_environ()


def start_response(status, headers, exc_info=None):
    return None


def run(n):
    for i in range(n):
        if i % 500 == 0:
            recorder.pending.clear()  # as the recorder's thread takes them, twice a second
        body = app.wsgi_app(dict(environ), start_response)
        for _ in body:
            pass
        body.close()


sampler.start(port="none", interval=3600.0, stalls=False)
run(200)  # warm: first-call work is not a request's
recorder.stop()
recorder._awake = True  # its thread kept off: the request's thread alone is counted
gc.collect()
gc.freeze()  # the collections a run triggers then cost what its own objects cost
run(count)
recorder.pending.clear()
sampler.stop()
"""

ASGI_REQUESTS = r"""
import asyncio, gc, sys
sys.path.insert(0, sys.argv[3])
from fastapi import FastAPI
import sampler, sampler.middleware
from sampler._requests import recorder
from sampler.middleware._asgi import PythonASGIMiddleware

kind, count = sys.argv[1], int(sys.argv[2])
app = FastAPI()


@app.get("/items/{item_id}")
async def item(item_id: int):
    return {"item": item_id}


if kind == "c":
    app = sampler.middleware.ASGIMiddleware(app)
elif kind == "python":
    app = PythonASGIMiddleware(app)
headers = [(b"host", b"api"), (b"user-agent", b"bench"), (b"accept", b"*/*"),
           (b"accept-encoding", b"gzip"), (b"x-forwarded-for", b"10.0.0.1"),
           (b"x-request-start", b"t=1.0")]
scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
         "scheme": "http", "path": "/items/1", "raw_path": b"/items/1", "query_string": b"",
         "root_path": "", "headers": headers, "server": ("api", 80), "client": ("10.0.0.1", 1)}


async def receive():
    return {"type": "http.request", "body": b"", "more_body": False}


async def send(message):
    return None


async def run(n):
    for i in range(n):
        if i % 500 == 0:
            recorder.pending.clear()  # as the recorder's thread takes them, twice a second
        await app(dict(scope), receive, send)


sampler.start(port="none", interval=3600.0, stalls=False)
loop = asyncio.new_event_loop()
loop.run_until_complete(run(200))  # warm: first-call work is not a request's
recorder.stop()
recorder._awake = True  # its thread kept off: the request's thread alone is counted
gc.collect()
gc.freeze()
loop.run_until_complete(run(count))
recorder.pending.clear()
sampler.stop()
"""

RECORDER = r"""
import sys, time
sys.path.insert(0, sys.argv[3])
import sampler
from sampler._requests import recorder

mode, batches = sys.argv[1], int(sys.argv[2])
sampler.start(port="none", interval=3600.0, stalls=False)
recorder.stop()
now = time.monotonic()
for _ in range(batches):
    recorder.pending.extend(
        (
            "/items/<int:item_id>",
            now - 0.001 * (i % 100),
            0.0005 + 0.00001 * (i % 97),
            f"t={time.time() - 0.002:.6f}",
            time.time(),
            1,
            False,
            "200 OK",
            "/items/1",
        )
        for i in range(500)
    )
    if mode == "count":
        recorder.process()
    else:
        recorder.pending.clear()
sampler.stop()
"""


def instructions(script: str, *args: str) -> int:
    """Instructions valgrind counts on the main thread of one run of ``script`` with ``args``
    (the sampler's own threads wake by the clock, which valgrind slows: counted apart)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-c",
                script,
                *args,
                str(ROOT),
            ],
            capture_output=True,
            text=True,
            # One hash seed for every run: string hashing otherwise moves dict look-ups' costs.
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        main_thread = Path(f"{out}-01")
        if run.returncode != 0 or not main_thread.exists():
            raise SystemExit(f"valgrind failed:\n{run.stderr[-2000:]}")
        for line in main_thread.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit(f"no instruction count in {main_thread}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=20, help="recorder batches of 500")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    frameworks = {"Flask": REQUESTS, "FastAPI": ASGI_REQUESTS}
    jobs = {
        (framework, kind, count): (script, kind, str(count))
        for framework, script in frameworks.items()
        for kind in ("bare", "c", "python")
        for count in (args.requests, 0)
    }
    jobs.update(
        {("recorder", mode, 0): (RECORDER, mode, str(args.batches)) for mode in ("count", "build")}
    )
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores: two valgrinds at a time
        counted = dict(
            zip(jobs, pool.map(lambda job: instructions(*job), jobs.values()), strict=True)
        )
    recorder = (counted[("recorder", "count", 0)] - counted[("recorder", "build", 0)]) / (
        500 * args.batches
    )
    names = {
        "Flask": ("WSGIMiddleware", "PythonWSGIMiddleware"),
        "FastAPI": ("ASGIMiddleware", "PythonASGIMiddleware"),
    }
    print(f"{args.requests:,} requests less none, in process (callgrind, the main thread):")
    for framework in frameworks:
        per = {
            kind: (counted[(framework, kind, args.requests)] - counted[(framework, kind, 0)])
            / args.requests
            for kind in ("bare", "c", "python")
        }
        bare = per["bare"]
        print(f"  a {framework} request, bare        {bare:>9,.0f} instructions")
        for kind, name in zip(("c", "python"), names[framework], strict=True):
            extra = per[kind] - bare
            print(
                f"    {name:<26} {per[kind]:>9,.0f}   +{extra:,.0f} on the request's thread "
                f"({extra / bare:.3f}x a bare request)"
            )
        together = per["c"] - bare + recorder
        print(
            f"    together, {names[framework][0]:<16} {together:>9,.0f} a request with the "
            f"recorder's ({together / bare:.3f}x a bare request)"
        )
    print(f"  the recorder's thread          {recorder:>9,.0f} a request, in batches of 500")


if __name__ == "__main__":
    main()
