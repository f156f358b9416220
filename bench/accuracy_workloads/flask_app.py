"""A Flask app for gunicorn: each request builds a price report and renders it with Jinja2.

gunicorn imports this module in its worker; deploy/gunicorn.conf.py's ``post_fork`` hook has
started the sampler there from ``FLEETFLAME_*`` already.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time

import _common
from flask import Flask, render_template_string, request

app = Flask(__name__)

PAGE = """
<h1>Report {{ seed }}</h1>
<ul>{% for item in items %}
  <li>{{ item.name|title }}: {{ "%.2f"|format(item.price) }} ({{ item.tags|join(", ") }})</li>
{%- endfor %}</ul>
<pre>{{ summary }}</pre>
"""


def build_items(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    items = [
        {
            "name": f"item {i} of {seed}",
            "price": rng.random() * 100,
            "tags": sorted(rng.sample(["red", "blue", "green", "big", "small", "new"], 3)),
        }
        for i in range(count)
    ]
    items.sort(key=lambda item: (item["price"], item["name"]))
    return items


def summarize(items: list[dict]) -> str:
    by_tag: dict[str, float] = {}
    for item in items:
        for tag in item["tags"]:
            by_tag[tag] = by_tag.get(tag, 0.0) + item["price"]
    return json.dumps(by_tag, indent=2, sort_keys=True)


@app.get("/report")
def report() -> str:
    started = time.thread_time()  # timed in its own body: a decorator would add a frame
    try:
        seed = int(request.args.get("seed", "1"))
        items = build_items(seed, 400)
        return render_template_string(PAGE, seed=seed, items=items, summary=summarize(items))
    finally:
        meter.add("flask_app:report", time.thread_time() - started)


TRUTH_PATH = "/_accuracy/truth"  # bench/accuracy_suite.py


class CpuMeter:
    """Sums the CPU time each request spends in Flask.wsgi_app (and in report and gunicorn's
    socket writes), by its thread's CPU clock: the ground truth for their shares of the
    worker's CPU. ``GET /_accuracy/truth`` answers the clocks so far (the harness reads them
    around its window), and ``extra`` of the module map has wsgi_app's share over the worker's
    whole life."""

    def __init__(self, wsgi_app):  # noqa: ANN001 - any WSGI callable
        self.wsgi_app = wsgi_app
        self.seconds = 0.0
        self.by_function: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):  # noqa: ANN001 - the WSGI signature
        if environ.get("PATH_INFO") == TRUTH_PATH:
            body = json.dumps(self.clocks()).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        started = time.thread_time()
        try:
            return self.wsgi_app(environ, start_response)
        finally:
            used = time.thread_time() - started
            with self._lock:
                self.seconds += used

    def add(self, function: str, seconds: float) -> None:
        """Adds CPU seconds spent in ``function`` (``module:qualname``)."""
        with self._lock:
            self.by_function[function] = self.by_function.get(function, 0.0) + seconds

    def clocks(self) -> dict:
        """The CPU seconds of the functions timed, of the process, and of the sampler's own threads (which
        neither profiler counts), each so far."""
        with self._lock:
            functions = {"flask.app:Flask.wsgi_app": self.seconds, **self.by_function}
        return {
            "functions_cpu_seconds": functions,
            "process_cpu_seconds": time.process_time(),
            "sampler_cpu_seconds": _sampler_cpu_seconds(),
        }


def _sampler_cpu_seconds() -> float:
    # From /proc rather than pthread_getcpuclockid, which is undefined for a thread that ended
    # since threading.enumerate() listed it; the clock ticks are 10 ms, fine over a window.
    ticks = os.sysconf("SC_CLK_TCK")
    used = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("fleetflame-") and thread.native_id is not None:
            try:
                with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                    stat = f.read()
            except FileNotFoundError:
                continue  # it ended meanwhile
            fields = stat[stat.rindex(")") + 2 :].split()
            used += (int(fields[11]) + int(fields[12])) / ticks
    return used


def _time_socket_writes(meter: CpuMeter) -> None:
    """Times gunicorn's writes of each answer (``gunicorn.util.write``, a leaf: its time is in
    ``socket.sendall``) by the thread's CPU clock: py-spy's default mode counts a worker that
    the client's wake-up pushed off its core there as running, this says how much it ran."""
    from gunicorn import util

    write = util.write

    def timed_write(sock, data, chunked=False):  # noqa: ANN001, ANN202 - gunicorn's signature
        started = time.thread_time()
        try:
            return write(sock, data, chunked)
        finally:
            meter.add("gunicorn.util:write", time.thread_time() - started)

    util.write = timed_write


meter = app.wsgi_app = CpuMeter(app.wsgi_app)
_time_socket_writes(meter)
_common.add_extra(
    lambda: {"wsgi_app_cpu_percent_of_process": round(100 * meter.seconds / time.process_time(), 1)}
)
_common.record_modules_at_exit()
_common.write_module_map()
