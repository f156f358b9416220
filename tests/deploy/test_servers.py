"""The fork hooks under real servers: gunicorn (sync and gthread) and uWSGI (postfork, lazy-apps),
and the Flask and Django snippets, each worker serving its own sampler port."""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BIN = Path(sys.executable).parent

APP = """
import hashlib
import time


def application(environ, start_response):
    # 20 ms of CPU per request, whatever the machine's speed, so every worker has samples.
    # A request shorter than the GIL switch interval (5 ms) may be charged entirely to the
    # write that ends it by the thread driver (docs/sampler.md, Limits).
    digest = b"x"
    began = time.thread_time()
    while time.thread_time() - began < 0.02:
        digest = hashlib.sha256(digest).digest()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [digest.hex().encode()]
"""


def _free_ports(count: int) -> list[int]:
    """Returns the first port of `count` consecutive free ports on 127.0.0.1, below the kernel's
    ports for outgoing connections (see mwhelpers.free_range)."""
    for _ in range(100):
        first = random.randrange(20_000, 32_000)
        socks = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return list(range(first, first + count))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no block of free ports")


def _get(url: str, timeout: float = 5.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (OSError, http.client.HTTPException):  # HTTPException: see mwhelpers.sampler_urls
        return None


def _wait(predicate, timeout: float = 60.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    return predicate()


def _samplers(ports: list[int]) -> dict[int, dict]:
    """Returns /info of every port of the range that answers, by port."""
    found = {}
    for port in ports:
        body = _get(f"http://127.0.0.1:{port}/info", timeout=2)
        if body:
            found[port] = json.loads(body)
    return found


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _start(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETFLAME_", "UWSGI_"))}
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv,
            env={**base, **env},
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        proc.wait(timeout=10)


def _start_gunicorn(
    tmp_path: Path, http_port: int, workers: int, options: list[str], env: dict[str, str]
) -> tuple[subprocess.Popen, Path]:
    """Starts gunicorn with deploy/gunicorn.conf.py serving APP from `tmp_path`; returns the
    master and its log."""
    (tmp_path / "tinyapp.py").write_text(APP)
    log = tmp_path / "gunicorn.log"
    argv = [
        str(BIN / "gunicorn"),
        "-c",
        str(DEPLOY / "gunicorn.conf.py"),
        "--workers",
        str(workers),
        *options,
        "--bind",
        f"127.0.0.1:{http_port}",
        "--chdir",
        str(tmp_path),
        "tinyapp:application",
    ]
    return _start(argv, env, tmp_path, log), log


def _sampler_env(sampler_ports: list[int], service: str) -> dict[str, str]:
    """The environment that starts a sampler in each worker, as _check_fleet expects it."""
    return {
        "FLEETFLAME_PORT": f"{sampler_ports[0]}-{sampler_ports[-1]}",
        "FLEETFLAME_SERVICE": service,
        "FLEETFLAME_LABELS": "version=9.9",
    }


def _check_fleet(
    proc: subprocess.Popen,
    http_port: int,
    sampler_ports: list[int],
    workers: int,
    log: Path,
    service: str,
) -> dict[int, dict]:
    assert _wait(lambda: _get(f"http://127.0.0.1:{http_port}/"), 60), log.read_text()[-3000:]
    found = _wait(lambda: len(_samplers(sampler_ports)) >= workers and _samplers(sampler_ports))
    assert found and len(found) == workers, (found, log.read_text()[-3000:])
    for _ in range(6 * workers):
        _get(f"http://127.0.0.1:{http_port}/")
    pids = {info["instance"]["pid"] for info in found.values()}
    assert len(pids) == workers  # one port per worker process
    assert proc.pid not in pids  # the master does not sample
    for info in found.values():
        assert _ppid(info["instance"]["pid"]) == proc.pid  # preforked by the master
        assert info["labels"]["service"] == service
        assert info["labels"]["version"] == "9.9"
    return found


@pytest.mark.parametrize("worker_class", ["sync", "gthread"])
def test_gunicorn_post_fork_gives_every_worker_its_own_sampler(tmp_path, worker_class) -> None:
    http_port, *sampler_ports = _free_ports(6)
    threads = "2" if worker_class == "gthread" else "1"  # gunicorn turns sync into gthread
    proc, log = _start_gunicorn(
        tmp_path,
        http_port,
        3,
        ["--worker-class", worker_class, "--threads", threads],
        _sampler_env(sampler_ports, "tiny"),
    )
    try:
        found = _check_fleet(proc, http_port, sampler_ports, 3, log, "tiny")
        # The native engine gives each thread its own CPU timer (the hook used to name the
        # python engine's thread driver for threaded workers, which chose the python engine).
        # Without it, threaded workers sample from a thread: a signal would wait for the idle
        # main thread.
        from sampler._engine_native import unavailable

        for info in found.values():
            assert (info["engine"] == "native") == (unavailable() is None), info
            if info["engine"] == "native":
                assert info["driver"] == "thread-cpu-timers"
            else:
                assert info["driver"] == ("thread" if worker_class == "gthread" else "signal")
        # A worker serves its own stacks; the request handler's frames are in them.
        assert _wait(
            lambda: any(
                b"tinyapp:application" in (_get(f"http://127.0.0.1:{p}/stacks") or b"")
                for p in found
            )
        )
    finally:
        _stop(proc)
    assert _samplers(sampler_ports) == {}  # ports released with the workers


def test_gunicorn_without_the_environment_starts_no_sampler(tmp_path) -> None:
    http_port, *sampler_ports = _free_ports(4)
    proc, log = _start_gunicorn(tmp_path, http_port, 2, [], {})
    try:
        assert _wait(lambda: _get(f"http://127.0.0.1:{http_port}/"), 60), log.read_text()
        default_range = list(range(8021, 8037))
        before = set(_samplers(default_range))
        time.sleep(1)
        assert set(_samplers(sampler_ports)) == set()
        # Nothing new on the default range either (another program may use it already).
        assert set(_samplers(default_range)) <= before
        assert "fleetflame sampler in worker" not in log.read_text()
    finally:
        _stop(proc)


UWSGI = shutil.which("uwsgi", path=str(BIN))


@pytest.mark.skipif(UWSGI is None, reason="uWSGI is not installed (pip install uWSGI)")
@pytest.mark.parametrize("variant", ["postfork", "lazy-apps"])
def test_uwsgi_gives_every_worker_its_own_sampler(tmp_path, variant) -> None:
    http_port, *sampler_ports = _free_ports(5)
    log = tmp_path / "uwsgi.log"
    if variant == "postfork":
        (tmp_path / "tinyapp.py").write_text(APP)
        ini, module = DEPLOY / "uwsgi" / "uwsgi.ini", "tinyapp:application"
    else:
        # The Flask snippet starts the sampler at import, in each lazily loading worker.
        shutil.copy(DEPLOY / "snippets" / "flask_app.py", tmp_path / "tinyapp.py")
        ini, module = DEPLOY / "uwsgi" / "uwsgi-lazy-apps.ini", "tinyapp:app"
    proc = _start(
        [
            UWSGI,
            "--ini",
            str(ini),
            "--processes",
            "2",
            "--http-socket",
            f"127.0.0.1:{http_port}",
            "--pythonpath",
            str(tmp_path),
            "--pythonpath",
            str(REPO),
            "--module",
            module,
        ],
        _sampler_env(sampler_ports, "tiny-uwsgi"),
        tmp_path,
        log,
    )
    try:
        if variant == "postfork":
            _check_fleet(proc, http_port, sampler_ports, 2, log, "tiny-uwsgi")
        else:
            assert _wait(lambda: _get(f"http://127.0.0.1:{http_port}/hello/x"), 60), log.read_text()
            _check_lazy(proc, sampler_ports, log)
    finally:
        _stop(proc)
    assert _samplers(sampler_ports) == {}


def _check_lazy(proc: subprocess.Popen, sampler_ports: list[int], log: Path) -> None:
    found = _wait(lambda: len(_samplers(sampler_ports)) >= 2 and _samplers(sampler_ports))
    assert found and len(found) == 2, (found, log.read_text()[-3000:])
    for info in found.values():
        assert _ppid(info["instance"]["pid"]) == proc.pid
        assert info["labels"]["service"] == "tiny-uwsgi"


SNIPPET_CHECK = """
import json, sys, time
import sampler

{setup}

def busy():
    deadline = time.process_time() + 0.5
    while time.process_time() < deadline:
        sum(i * i for i in range(1000))
    return json.dumps(sampler.current_labels())

{request}
running = sampler.running()
doc = running.profile() if running else None
label_sets = doc["label_sets"] if doc else []
labelled = sum(c for i, stack, c in (doc["stacks"] if doc else []) if label_sets[i].get("route") == ROUTE)
print(json.dumps({{"running": running is not None, "labels": labels, "labelled": labelled}}))
"""

FLASK_SETUP = """
import flask_app
flask_app.app.add_url_rule("/busy/<int:n>", "busy", lambda n: busy())
flask_app.label_routes(flask_app.app)
ROUTE = "/busy/<int:n>"
"""
FLASK_REQUEST = """
labels = json.loads(flask_app.app.test_client().get("/busy/3").get_data(as_text=True))
"""

DJANGO_SETUP = """
import os
from django.conf import settings
from django.http import HttpResponse
from django.urls import path

settings.configure(
    DEBUG=False, ALLOWED_HOSTS=["testserver"], ROOT_URLCONF=__name__, SECRET_KEY="x" * 50,
    MIDDLEWARE=["mysite.wsgi.FleetflameRouteMiddleware"],
)
urlpatterns = [path("users/<int:id>/", lambda request, id: HttpResponse(busy()))]
ROUTE = "users/<int:id>/"
from mysite import wsgi
"""
DJANGO_REQUEST = """
from io import BytesIO
environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/users/7/", "SERVER_NAME": "testserver",
           "SERVER_PORT": "80", "wsgi.input": BytesIO(), "wsgi.url_scheme": "http",
           "wsgi.errors": sys.stderr}
body = b"".join(wsgi.application(environ, lambda status, headers: None))
labels = json.loads(body)
"""


def _run_snippet(tmp_path: Path, framework: str, env: dict[str, str]) -> dict:
    if framework == "flask":
        shutil.copy(DEPLOY / "snippets" / "flask_app.py", tmp_path / "flask_app.py")
        code = SNIPPET_CHECK.format(setup=FLASK_SETUP, request=FLASK_REQUEST)
    else:
        (tmp_path / "mysite").mkdir()
        (tmp_path / "mysite" / "__init__.py").write_text("")
        shutil.copy(DEPLOY / "snippets" / "django_wsgi.py", tmp_path / "mysite" / "wsgi.py")
        code = SNIPPET_CHECK.format(setup=DJANGO_SETUP, request=DJANGO_REQUEST)
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env={**base, "PYTHONPATH": f"{tmp_path}:{REPO}", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("framework", ["flask", "django"])
def test_snippets_start_from_the_environment_and_label_routes(tmp_path, framework) -> None:
    route = "/busy/<int:n>" if framework == "flask" else "users/<int:id>/"
    result = _run_snippet(tmp_path, framework, {"FLEETFLAME_PORT": "0"})
    assert result["running"] is True
    assert result["labels"] == {"route": route}
    assert result["labelled"] > 10  # half a second of CPU under the route label, at 100 Hz


@pytest.mark.parametrize("framework", ["flask", "django"])
def test_snippets_do_nothing_without_the_environment(tmp_path, framework) -> None:
    result = _run_snippet(tmp_path, framework, {})
    assert result["running"] is False
    assert result["labelled"] == 0
