"""fleetflame attach against real processes with the real py-spy."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
from pollhelpers import ROOT, collector_settings, stored, wait_until

from attach import Attacher, convert_raw, find_process, permission_help, serve
from attach.pyspy import is_python, main_files_of
from collector.service import Collector
from sampler.profile import parse_folded, validate_document

PY_SPY = (
    str(ROOT / ".venv" / "bin" / "py-spy")
    if (ROOT / ".venv/bin/py-spy").exists()
    else (shutil.which("py-spy") or "py-spy")
)

TARGET = r"""
import sys
class Billing:
    def total(self):
        return sum(i * i for i in range(20000))
def legacy_main():
    print("ready", flush=True)
    while True:
        Billing().total()
legacy_main()
"""


@pytest.fixture
def target_process(tmp_path):
    # A marker of its own: another test's target, on the other xdist worker, must not match.
    script = tmp_path / "legacy_billing.py"
    script.write_text(TARGET)
    proc = subprocess.Popen(
        [sys.executable, str(script), f"legacy-billing-marker-{uuid.uuid4().hex}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    proc.marker = proc.args[-1]
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait(10)
    proc.stdout.close()


def test_frames_of_the_main_file_are_the_main_modules():
    raw = "<module> (app.py);main (app.py);helper (pkg/app.py) 3\n"
    assert convert_raw(raw, frozenset({"app.py"})) == {
        "__main__:<module>;__main__:main;pkg.app:helper": 3
    }


def test_convert_raw_frames_to_wire_names():
    raw = (
        "<module> (app.py);main (app.py);Billing.total (billing/core.py) 7\n"
        "<module> (app.py);x (pkg/__init__.py);f;g (a b.py:12) 2\nnot a line\n"
    )
    assert convert_raw(raw) == {
        "app:<module>;app:main;billing.core:Billing.total": 7,
        "app:<module>;pkg:x;f;a b:g": 2,
    }


def test_main_files_are_named_as_py_spy_names_them(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    sleeper = "import time\ntime.sleep(60)\n"
    (tmp_path / "pkg" / "tool.py").write_text(sleeper)
    (tmp_path / "script.py").write_text(sleeper)
    (tmp_path / "ns").mkdir()  # a namespace package: no __init__.py
    (tmp_path / "ns" / "tool.py").write_text(sleeper)
    cases = {
        ("script.py", "arg"): {"script.py"},
        ("-X", "dev", "-W", "ignore", "-B", str(tmp_path / "script.py")): {"script.py"},
        ("pkg/tool.py",): {"pkg/tool.py"},
        ("-Wignore", "-um", "pkg.tool", "-x"): {"pkg/tool.py"},
        ("-m", "pkg.tool"): {"pkg/tool.py"},
        ("-m", "ns.tool"): {"tool.py"},  # py-spy names it below the last __init__.py
        ("-c", sleeper, "script.py"): set(),
    }
    processes = {args: subprocess.Popen([sys.executable, *args], cwd=tmp_path) for args in cases}
    try:
        for args, names in cases.items():
            found = main_files_of(processes[args].pid)
            # Seen once in a full run: {} for -m ns.tool (said: had it ended, its command line)
            assert found == names, (args, processes[args].poll(), cmdline(processes[args].pid))
    finally:
        for process in processes.values():
            process.kill()
            process.wait()
    assert main_files_of(2**22 + 1) == frozenset()  # no such process


def test_attach_serves_the_sampler_endpoints_and_the_collector_stores_it(
    target_process, sqlite_url
):
    attacher = Attacher(
        pid=target_process.pid,
        window=1,
        rate=200,
        service="billing",
        labels={"team": "legacy"},
        py_spy=PY_SPY,
    )
    server = serve(attacher, "127.0.0.1", 0, None)
    address = f"127.0.0.1:{server.port}"
    runner = threading.Thread(target=attacher.run, daemon=True)
    runner.start()
    try:
        wait_until(lambda: attacher.windows >= 2, timeout=60, what="two py-spy windows")
        assert attacher.error is None
        doc = requests.get(f"http://{address}/profile.json", timeout=10).json()
        profile = validate_document(doc)
        assert profile.labels["service"] == "billing" and profile.labels["team"] == "legacy"
        assert profile.instance_id and doc["instance"]["pid"] == target_process.pid
        stacks = requests.get(f"http://{address}/stacks", timeout=10).text
        counts = parse_folded(stacks)
        # The script's frames are __main__'s, as the sampler names them (py-spy: its file).
        assert all(s.startswith("__main__:<module>;__main__:legacy_main") for s in counts), counts
        assert any(s.endswith("__main__:legacy_main;__main__:Billing.total") for s in counts)
        # Whole stacks, each from the module's frame: py-spy --nonblocking tore a few percent
        # (rootless, or frames of two stacks), and attach used it.
        torn = {s: n for s, n in counts.items() if not s.split(";")[0].endswith("<module>")}
        assert not torn, torn
        # The collector treats it like any worker.
        c = Collector(collector_settings(sqlite_url, [address]))
        c.migrate()
        try:
            report = c.poll_cycle()
        finally:
            c.stop()
        assert report.ok == 1 and report.samples > 0
        held = stored(sqlite_url, profile.instance_id)
        assert sum(held.values()) == report.samples
    finally:
        attacher.stop()
        runner.join(30)
        server.stop()


def test_match_finds_the_oldest_matching_process(target_process):
    assert find_process(target_process.marker) == target_process.pid
    assert find_process(r"no-process-has-this-\d{40}") is None


def test_permission_denied_says_what_is_needed(target_process, tmp_path):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to run py-spy as an unprivileged user")
    # The real py-spy, as user nobody, against a root process: the kernel refuses ptrace.
    wrapper = tmp_path / "py-spy-as-nobody"
    wrapper.write_text(
        f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups "{PY_SPY}" "$@"\n'
    )
    wrapper.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "attach",
            "--pid",
            str(target_process.pid),
            "--port",
            "0",
            "--window",
            "1",
            "--py-spy",
            str(wrapper),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 3, result.stderr
    assert "permission denied" in result.stderr
    assert "CAP_SYS_PTRACE" in result.stderr and "ptrace_scope" in result.stderr
    assert "SYS_PTRACE" in permission_help(1)


@pytest.mark.alone
def test_pid_that_exits_ends_attach_with_a_clear_message(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "attach",
                "--pid",
                str(proc.pid),
                "--port",
                "0",
                "--window",
                "1",
                "--py-spy",
                PY_SPY,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        proc.wait(10)
    assert result.returncode == 4, result.stderr
    assert f"process {proc.pid} is gone" in result.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "127.evil.example"])
def test_serving_beyond_loopback_without_a_token_is_refused(host, capsys):
    from attach.cli import main

    assert main(["--pid", str(os.getpid()), "--host", host, "--py-spy", PY_SPY]) == 2
    assert "beyond localhost needs --token" in capsys.readouterr().err


@pytest.mark.parametrize("labels", ["team", "=web", "zone=a,,region"])
def test_labels_that_are_not_key_value_pairs_are_refused(labels, capsys):
    # They were dropped in silence; the sampler's FLEETFLAME_LABELS refuses them.
    from attach.cli import main

    assert main(["--pid", str(os.getpid()), "--labels", labels, "--py-spy", PY_SPY]) == 2
    assert "--labels: expected key=value pairs" in capsys.readouterr().err


@pytest.mark.alone
def test_the_agent_is_served_by_the_samplers_http_server():
    import time

    attacher = Attacher(pid=os.getpid(), service="me", py_spy=PY_SPY)
    with attacher._lock:
        attacher._counts = {"app:main;app:work": 7}
    server = serve(attacher, "127.0.0.1", 0, None)
    try:
        url = f"http://127.0.0.1:{server.port}"
        doc = validate_document(requests.get(url + "/profile.json", timeout=10).json())
        assert doc.stacks == {(0, "app:main;app:work"): 7} and doc.labels["service"] == "me"
        assert requests.get(url + "/dump", timeout=10).status_code == 404
        # A read of the next second is parked in the server: /info answers meanwhile.
        started = time.monotonic()
        with requests.Session() as session:
            window = threading.Thread(
                target=lambda: session.get(url + "/stacks?seconds=1", timeout=10)
            )
            window.start()
            assert requests.get(url + "/info", timeout=10).json()["driver"] == "py-spy"
            assert time.monotonic() - started < 0.9
            window.join(10)
    finally:
        server.stop()


@pytest.mark.parametrize(
    "args, said",
    [
        (["--rate", "0"], "argument --rate: must be 1 or more, got 0"),
        (["--rate", "fast"], "argument --rate: expected a whole number, got 'fast'"),
        (["--window", "nan"], "argument --window: must be a positive number of seconds"),
        (["--match", "worker("], "argument --match: not a regular expression: missing )"),
    ],
)
def test_a_rate_window_or_match_that_cannot_work_is_a_usage_error(args, said):
    # --rate 0 was a ZeroDivisionError, a --match that is no regex an re.error, both tracebacks.
    target = [] if args[0] == "--match" else ["--pid", str(os.getpid())]
    result = subprocess.run(
        [sys.executable, "-m", "attach", *target, "--port", "0", *args, "--py-spy", PY_SPY],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2, result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.fixture
def wrapped_worker():
    """A shell wrapper whose command line names the worker (older), and the Python worker."""
    marker = f"worker-{uuid.uuid4().hex}.py"
    wrapper = subprocess.Popen(["bash", "-c", "sleep 60; true", marker], start_new_session=True)
    time.sleep(0.1)  # started a clock tick later: the wrapper is the oldest match
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    yield marker, wrapper.pid, worker.pid
    os.killpg(wrapper.pid, signal.SIGKILL)  # its sleep too
    worker.kill()
    for process in (wrapper, worker):
        process.wait(10)


def test_match_skips_processes_that_are_not_python_and_says_so(wrapped_worker, caplog):
    marker, wrapper, worker = wrapped_worker
    told: set[int] = set()
    with caplog.at_level("WARNING", logger="attach"):
        assert find_process(re.escape(marker), told=told) == worker
        assert find_process(re.escape(marker), told=told) == worker
    skipped = [r for r in caplog.records if "not Python" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].fields["pids"] == str(wrapper)  # said once
    assert is_python(worker) and is_python(wrapper) is False


def test_attach_by_match_profiles_the_python_process_not_its_wrapper(wrapped_worker):
    # The oldest match, the wrapper, was taken: py-spy failed on it and attach exited 1.
    marker, _, worker = wrapped_worker
    agent = subprocess.Popen(
        [sys.executable, "-m", "attach", "--match", re.escape(marker), "--port", "0"]
        + ["--window", "1", "--py-spy", PY_SPY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        url = f"http://127.0.0.1:{agent.stdout.readline().strip()}/info"

        def one_window():
            assert agent.poll() is None, "attach exited"
            info = requests.get(url, timeout=10).json()
            return info if info["windows"] >= 1 else None

        info = wait_until(one_window, timeout=30, what="a py-spy window")
        assert info["instance"]["pid"] == worker
    finally:
        agent.terminate()
        _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr


def test_an_interpreter_built_into_an_executable_of_another_name_is_python(tmp_path):
    # Debian's python3.11 is one static executable: copied under another name (as apps that
    # carry their interpreter are), it maps no libpython, and --match skipped it for ever.
    static = Path("/usr/bin/python3.11")
    if not static.exists():
        pytest.skip("no static interpreter here to copy")
    app = tmp_path / "appserver"
    shutil.copy(static, app)
    process = subprocess.Popen([str(app), "-c", "import time; time.sleep(30)"])
    try:
        wait_until(lambda: os.readlink(f"/proc/{process.pid}/exe") == str(app), what="exec")
        assert is_python(process.pid) is True
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            wait_until(lambda: "sleep" in os.readlink(f"/proc/{sleeper.pid}/exe"), what="exec")
            assert is_python(sleeper.pid) is False
        finally:
            sleeper.kill()
            sleeper.wait()
    finally:
        process.kill()
        process.wait()


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError as exc:
        return exc
