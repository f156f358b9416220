"""Instructions a request the request middleware costs, counted by valgrind.

    python bench/bench_middleware_instructions.py [--requests 2000]

The clock on a shared 2-core machine swings by more than the middleware costs; instructions
do not. A Flask request is called in process (no HTTP), the sampler started but not ticking
(an hour's interval), under ``valgrind --tool=cachegrind``; each count is a run of
``--requests`` requests less a run of none, divided by the requests. Three apps: bare, with
``WSGIMiddleware`` (the C path where the native extension is built) and with
``PythonWSGIMiddleware`` (the fallback). The request's thread only: the recorder's thread is
kept off and its queue emptied every 200 requests, as the thread would take it. Then the
recorder's own work: batches of 200 finished requests (1,000 requests a second, its 0.2 s
period), counted less building them. Printed beside the bare request, as ratios.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

REQUESTS = r"""
import sys
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
        if i % 200 == 0:
            recorder.pending.clear()  # as the recorder's thread takes them, 5 times a second
        body = app.wsgi_app(dict(environ), start_response)
        for _ in body:
            pass
        body.close()


sampler.start(port="none", interval=3600.0)
run(200)  # warm: first-call work is not a request's
recorder.stop()
recorder._awake = True  # its thread kept off: the request's thread alone is counted
run(count)
recorder.pending.clear()
sampler.stop()
"""

RECORDER = r"""
import sys, time
sys.path.insert(0, sys.argv[3])
import sampler
from sampler._requests import recorder

mode, batches = sys.argv[1], int(sys.argv[2])
sampler.start(port="none", interval=3600.0)
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
        for i in range(200)
    )
    if mode == "count":
        recorder.process()
    else:
        recorder.pending.clear()
sampler.stop()
"""


def instructions(script: str, *args: str) -> int:
    """Instructions valgrind counts for one run of ``script`` with ``args``."""
    run = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            "-c",
            script,
            *args,
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        check=True,
        # One hash seed for every run: string hashing otherwise moves dict look-ups' costs.
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", run.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{run.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=50, help="recorder batches of 200")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    jobs = {
        (kind, count): (REQUESTS, kind, str(count))
        for kind in ("bare", "c", "python")
        for count in (args.requests, 0)
    }
    jobs.update(
        {(mode, "recorder"): (RECORDER, mode, str(args.batches)) for mode in ("count", "build")}
    )
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores: two valgrinds at a time
        counted = dict(
            zip(jobs, pool.map(lambda job: instructions(*job), jobs.values()), strict=True)
        )
    per = {
        kind: (counted[(kind, args.requests)] - counted[(kind, 0)]) / args.requests
        for kind in ("bare", "c", "python")
    }
    recorder = (counted[("count", "recorder")] - counted[("build", "recorder")]) / (
        200 * args.batches
    )
    bare = per["bare"]
    print(f"a Flask request in process, {args.requests:,} requests less none (cachegrind):")
    print(f"  bare                         {bare:>9,.0f} instructions")
    for kind, name in (("c", "WSGIMiddleware"), ("python", "PythonWSGIMiddleware")):
        extra = per[kind] - bare
        print(
            f"  {name:<28} {per[kind]:>9,.0f}   +{extra:,.0f} on the request's thread "
            f"({extra / bare:.3f}x a bare request)"
        )
    print(
        f"  the recorder's thread        {recorder:>9,.0f} a request, in batches of 200 "
        f"({recorder / bare:.3f}x a bare request)"
    )
    print(
        f"  together, WSGIMiddleware     {per['c'] - bare + recorder:>9,.0f} a request "
        f"({(per['c'] - bare + recorder) / bare:.3f}x a bare request)"
    )


if __name__ == "__main__":
    main()
