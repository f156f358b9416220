"""The workloads bench/accuracy.py runs: real third-party code with the sampler inside."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Load:
    """A load generator (accuracy_workloads/loadgen.py) for a server workload."""

    path: str
    concurrency: int
    keep_alive: bool = False


@dataclass(frozen=True)
class Workload:
    """A real process running third-party code with the sampler inside it."""

    name: str
    about: str
    # Arguments to the Python interpreter; {app_port}, {workloads} and {root} are filled in.
    command: tuple[str, ...]
    load: Load | None = None
    focus: tuple[str, ...] = ()
    ceilings: Mapping[str, float] = field(default_factory=dict)
    # How py-spy tells running threads: "default" (by their OS state; it counts waiting and
    # runnable threads too) or "gil" (the thread holding the GIL: exact for Python code, blind
    # to CPU spent without the GIL, such as system calls); "-nonblocking" reads without
    # stopping the process: py-spy's stops, with the sampler's timer signals arriving during
    # them (pause_when_traced is off here, so the engine keeps sampling), can leave py-spy
    # waiting forever for a thread's stop (benfred/py-spy#565) and the worker killed by
    # gunicorn's timeout; four busy gthread threads did so in most 24 s windows.
    pyspy_mode: str = "default"
    # A path on the app's port answering the workload's own CPU clocks (JSON for
    # accuracy_stats.truth_shares): the truth for some functions' total shares.
    truth_path: str | None = None


# The sampler starts in the worker from deploy/gunicorn.conf.py's post_fork hook, as documented.
GUNICORN = (
    "-m",
    "gunicorn",
    "--config",
    "{root}/deploy/gunicorn.conf.py",
    "--workers",
    "1",
    "--bind",
    "127.0.0.1:{app_port}",
    "--chdir",
    "{workloads}",
)
TRUTH_PATH = "/_accuracy/truth"  # bench/accuracy_workloads/flask_app.py
WAITING = ("nap", "wait_for_lock", "wait_in_select", "wait_on_socket")

WORKLOADS = (
    Workload(
        "black",
        "black (mypyc-compiled) reformats argparse.py; compiled code has no Python frames, so "
        "its time belongs to its Python caller format_once",
        ("{workloads}/black_format.py",),
        focus=("__main__:format_once",),
    ),
    Workload(
        "jinja2",
        "Jinja2 renders a 300-order HTML report (loops, filters, macros, autoescape)",
        ("{workloads}/jinja_render.py",),
        focus=("__main__:render_once",),
    ),
    Workload(
        "pyyaml",
        "PyYAML's pure-Python SafeLoader and SafeDumper round-trip a 150-service document",
        ("{workloads}/yaml_roundtrip.py",),
        focus=("__main__:load_document", "__main__:dump_document"),
    ),
    Workload(
        "sqlalchemy",
        "SQLAlchemy ORM on in-memory SQLite: inserts, selectin loads, a join, updates, deletes",
        ("{workloads}/sqlalchemy_orm.py",),
        focus=("__main__:insert_batch", "__main__:query_and_update"),
    ),
    Workload(
        "gunicorn-sync",
        "Flask under gunicorn, 1 sync worker; 2 clients, a new connection per request",
        (*GUNICORN, "--worker-class", "sync", "flask_app:app"),
        load=Load("/report", concurrency=2),
        focus=("flask.app:Flask.wsgi_app", "flask_app:report", "gunicorn.util:write"),
        # py-spy's stops lose some of the sampler's timer signals in this worker (2026-11-27,
        # no py-spy: 96.2 samples/s for 96.1 CPU-s/s; py-spy record: 78.7 for 87.8;
        # --nonblocking: 95.3 for 95.4), but --nonblocking tears py-spy's own stacks here (7
        # points of its samples without their root frames), so the default mode stays
        # (docs/sampler.md, "The engine's rate against the threads' CPU clocks").
        truth_path=TRUTH_PATH,
    ),
    Workload(
        "gunicorn-gthread",
        "Flask under gunicorn, 1 gthread worker with 4 threads; 4 keep-alive clients",
        (*GUNICORN, "--worker-class", "gthread", "--threads", "4", "flask_app:app"),
        load=Load("/report", concurrency=4, keep_alive=True),
        pyspy_mode="gil-nonblocking",
        truth_path=TRUTH_PATH,
        focus=(
            "flask.app:Flask.wsgi_app",
            "flask_app:report",
            "concurrent.futures.thread:_worker",
            "gunicorn.util:write",
        ),
    ),
    Workload(
        "asyncio",
        "asyncio streams HTTP server; the coroutine respond does the CPU work; 4 keep-alive clients",
        ("{workloads}/asyncio_server.py",),
        load=Load("/work", concurrency=4, keep_alive=True),
        focus=("__main__:respond", "__main__:checksum"),
        pyspy_mode="nonblocking",  # blocking, py-spy hung in both 24 s windows of a run
    ),
    Workload(
        "threads",
        "burn() uses a CPU; nap() sleeps, others wait on a lock, in select, on a silent socket",
        ("{workloads}/threads_mixed.py",),
        focus=("__main__:burn", *(f"__main__:{name}" for name in WAITING)),
        ceilings={f"__main__:{name}": 0.5 for name in WAITING},
        pyspy_mode="gil",
    ),
)
BY_NAME = {workload.name: workload for workload in WORKLOADS}
