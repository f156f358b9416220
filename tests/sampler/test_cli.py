"""``python -m sampler run``: any program, sampled, with the profile written at exit."""

import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from samplerhelpers import ENGINES, WORKLOADS, env, exits, run_sampled, share

from sampler.profile import parse_folded


def test_script_gets_its_arguments_and_its_exit_status_is_kept(tmp_path):
    out, svg = tmp_path / "out.folded", tmp_path / "out.svg"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sampler",
            "run",
            "-o",
            str(out),
            "--svg",
            str(svg),
            *exits(3),
        ],
        env=env(),
        timeout=60,
    )
    assert result.returncode == 3
    counts = parse_folded(out.read_text())
    assert sum(c for s, c in counts.items() if s.endswith(":busy_for_a_while")) >= 20
    root = ET.fromstring(svg.read_text())
    names = {g.get("data-n") for g in root.iter("{http://www.w3.org/2000/svg}g")}
    assert "__main__:busy_for_a_while" in names


@pytest.mark.parallel
def test_module_mode(tmp_path):
    out = tmp_path / "out.folded"
    subprocess.run(
        [sys.executable, "-m", "sampler", "run", "-o", str(out), "-m", "busymod"],
        env=env(PYTHONPATH=f"{WORKLOADS}:{env()['PYTHONPATH']}"),
        timeout=60,
        check=True,
    )
    assert any(s.endswith("__main__:module_work") for s in parse_folded(out.read_text()))


@pytest.mark.parallel
def test_fleetflame_command_dispatches_run(tmp_path):
    out = tmp_path / "out.folded"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sampler.cli",
            "run",
            "-o",
            str(out),
            *exits(0),
        ],
        env=env(),
        timeout=60,
        check=True,
    )
    assert parse_folded(out.read_text())


@pytest.mark.parallel
def test_bad_option_is_a_clear_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sampler", "run", "--mode", "gpu", str(WORKLOADS / "exits.py")],
        env=env(),
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "mode" in result.stderr and "cpu" in result.stderr


def sampler_command(args, cwd):
    """``python -m sampler ARGS`` run in ``cwd``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "sampler", *args],
        env=env(),
        cwd=cwd,
        timeout=60,
        capture_output=True,
        text=True,
    )


@pytest.mark.parallel
@pytest.mark.parametrize(
    "args, said",
    [
        (["run", "--port", "0", "missing.py"], "no such file: 'missing.py'"),
        (["bogus"], "no such file: 'bogus'"),  # `run` may be left out: a mistyped command
        (["run", "-m", "no_such_module.inner"], "no module named 'no_such_module'"),
        (["run", "-m", ".relative"], "cannot find module '.relative'"),
        (["run", "--port", "0", "-m", "no_such_module"], "no module named 'no_such_module'"),
    ],
)
def test_a_program_that_is_not_there_is_a_clear_error_before_sampling(tmp_path, args, said):
    result = sampler_command(args, tmp_path)
    assert result.returncode == 2, result
    assert said in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "sampling" not in result.stderr  # it said nothing of an endpoint it never served


@pytest.mark.parallel
@pytest.mark.parametrize(
    "args, said",
    [
        (["run", "-o", "no/such/dir/out.folded"], "no such directory"),
        (["run", "--svg", "no/such/dir/out.svg"], "no such directory"),
        (["run", "-o", "."], ". is a directory"),
        (["trace", "-o", "no/such/dir/run.json"], "no such directory"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_program_runs(tmp_path, args, said):
    # Refused at the end, the whole run's profile was lost to a traceback.
    program = tmp_path / "program.py"
    program.write_text("open('ran', 'w').close()\n")
    result = sampler_command([*args, str(program)], tmp_path)
    assert result.returncode == 2, result
    assert said in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "ran").exists()


FORKS = """
import os, sys, time


def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def parent_work():
    burn(0.5)


def child_work():
    burn(0.2)
    time.sleep(1.5)  # ends after the parent: its exit wrote the file over the parent's


if os.fork() == 0:
    child_work()
    sys.exit(0)
parent_work()
sys.exit("parent done")
"""


def test_a_forked_child_leaves_the_files_to_the_parent_and_exit_messages_are_said(tmp_path):
    program, out = tmp_path / "forks.py", tmp_path / "out.folded"
    program.write_text(FORKS)
    run = subprocess.run(
        [sys.executable, "-m", "sampler", "run", "-o", str(out), str(program)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and "parent done" in run.stderr  # as python says sys.exit("...")
    time.sleep(2.5)  # the child is gone too
    counts = parse_folded(out.read_text())
    assert any(":parent_work" in stack for stack in counts)
    assert not any(":child_work" in stack for stack in counts)


@pytest.mark.parallel
def test_a_run_that_keeps_nothing_says_so(tmp_path):
    program = tmp_path / "program.py"
    program.write_text("pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "sampler", "run", str(program)],
        env=env(),
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result
    assert "no --output, --svg or --port: this run keeps nothing" in result.stderr


@pytest.mark.parallel
def test_a_port_taken_is_a_clear_error(tmp_path):
    import socket

    program = tmp_path / "program.py"
    program.write_text("pass\n")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "sampler", "run", "--port", str(port), str(program)],
            env=env(),
            timeout=60,
            capture_output=True,
            text=True,
        )
    assert result.returncode == 2, result
    assert f"port {port}" in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.skipif(
    shutil.which("py-spy") is None
    and not (__import__("pathlib").Path(sys.executable).parent / "py-spy").exists(),
    reason="py-spy missing",
)
def test_agrees_with_py_spy_on_the_same_workload(tmp_path):
    """py-spy's raw output is folded stacks too: both parse the same way and find the same split."""
    py_spy = shutil.which("py-spy") or str(
        __import__("pathlib").Path(sys.executable).parent / "py-spy"
    )
    raw = tmp_path / "py-spy.folded"
    subprocess.run(
        [
            py_spy,
            "record",
            "--format",
            "raw",
            "--rate",
            "100",
            "--output",
            str(raw),
            "--",
            sys.executable,
            str(WORKLOADS / "split.py"),
            "--kind",
            "cpu",
            "--seconds",
            "6",
        ],
        env=env(),
        timeout=120,
        check=True,
        capture_output=True,
    )
    theirs = parse_folded(raw.read_text())

    def py_spy_share(name):
        # py-spy names frames "function (file.py:line)"
        relevant = {s: c for s, c in theirs.items() if "hot_a (" in s or "hot_b (" in s}
        return (
            100 * sum(c for s, c in relevant.items() if f"{name} (" in s) / sum(relevant.values())
        )

    ours = run_sampled(tmp_path, "split.py", "--kind", "cpu", "--seconds", "6")
    assert share(ours, "hot_a", ("hot_a", "hot_b")) == pytest.approx(py_spy_share("hot_a"), abs=8)


@pytest.mark.parametrize("engine", ENGINES)
def test_stacks_start_at_the_program_and_switches_need_no_value(tmp_path, engine):
    # --lineno alone turns line numbers on (it needed a value); the launcher's frames (runpy's
    # and the sampler's own __main__) are left out, so no second __main__:<module> sits above
    # the program's.
    out = tmp_path / "out.folded"
    subprocess.run(
        [sys.executable, "-m", "sampler", "run", "--engine", engine, "--lineno", "-o", str(out)]
        + exits(0),
        env=env(),
        timeout=60,
        check=True,
    )
    counts = parse_folded(out.read_text())
    busy = {s: c for s, c in counts.items() if ":busy_for_a_while:" in s}
    assert sum(busy.values()) >= 20
    for stack in busy:
        assert stack.startswith("__main__:<module>:"), stack
        assert "runpy:" not in stack


@pytest.mark.parallel
@pytest.mark.parametrize(
    "program",
    [
        "import os\nos.chdir('sub')\n",
        # Its working directory deleted under it: the write at exit failed with a traceback.
        "import os, tempfile\nd = tempfile.mkdtemp()\nos.chdir(d)\nos.rmdir(d)\n",
    ],
    ids=["chdir", "cwd-deleted"],
)
def test_relative_outputs_land_where_the_run_started_though_the_program_moved(tmp_path, program):
    (tmp_path / "sub").mkdir()
    (tmp_path / "program.py").write_text(program)
    result = sampler_command(
        ["run", "-o", "out.folded", "--svg", "out.svg", "program.py"], tmp_path
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert (tmp_path / "out.folded").is_file() and (tmp_path / "out.svg").is_file()
    assert not list((tmp_path / "sub").iterdir())


@pytest.mark.parallel
def test_an_output_that_cannot_be_written_at_exit_is_said_and_the_exit_status_kept(tmp_path):
    # The program removes the directory of --output: the status became 1, with a traceback.
    (tmp_path / "gone").mkdir()
    (tmp_path / "program.py").write_text("import os, sys\nos.rmdir('gone')\nsys.exit(7)\n")
    result = sampler_command(
        ["run", "-o", "gone/out.folded", "--svg", "out.svg", "program.py"], tmp_path
    )
    assert result.returncode == 7, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert f"could not write {tmp_path / 'gone' / 'out.folded'}: " in result.stderr
    assert (tmp_path / "out.svg").is_file()  # the other output is written all the same


LATE_WORKER = """
import sys, threading, time


def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def late_work():
    time.sleep(0.1)  # the main module has ended by now
    burn(0.4)


threading.Thread(target=late_work).start()
{end}
"""

# Engines that sample a thread while the main thread waits for it: the python engine's signal
# driver needs the main thread to run its handlers (it moves to its thread driver, late).
WAITING_ENGINES = [
    pytest.param(["--engine", "native"], marks=ENGINES[0].marks, id="native"),
    pytest.param(["--driver", "thread"], id="python-thread"),
]


@pytest.mark.parametrize("engine", WAITING_ENGINES)
@pytest.mark.parametrize(
    "end, status",
    [
        ("", 0),
        ("sys.exit(3)", 3),
        ("raise ValueError('main failed')", 1),
        ("raise KeyboardInterrupt", -2),
    ],
    ids=["returns", "sys.exit", "raises", "KeyboardInterrupt"],
)
def test_threads_that_outlive_the_main_module_are_sampled_until_they_end(
    tmp_path, engine, end, status
):
    # Sampling stopped when the main module ended, before the interpreter waited for its
    # non-daemon threads: their work after that was lost (a sample or two of ~40).
    program, out = tmp_path / "program.py", tmp_path / "out.folded"
    program.write_text(LATE_WORKER.format(end=end))
    result = sampler_command(["run", *engine, "-o", str(out), str(program)], tmp_path)
    assert result.returncode == status, result.stderr
    late = sum(c for s, c in parse_folded(out.read_text()).items() if s.endswith(":burn"))
    assert late >= 25, out.read_text()
    if status in (1, -2):  # told once, from the program's frame, as Python tells it
        assert result.stderr.count("Traceback") == 1, result.stderr
        assert f'"{program}", line 17, in <module>' in result.stderr, result.stderr
        assert "runpy" not in result.stderr and "sampler" not in result.stderr, result.stderr


def _as_from_a_terminal():
    """A child's signals as a shell started from a terminal gives them: none blocked, SIGINT's
    default action (whatever the test's process inherited)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_state(pid):
    """The process's blocked, ignored and caught signals, as /proc shows them."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return str(exc)
    return [line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt"))]


@pytest.mark.parallel
@pytest.mark.parametrize(
    "task",
    ["sum, range(10)", "time.sleep, 2"],
    ids=["executor idle", "Ctrl-C in threading's atexit join of the executor"],
)
def test_ctrl_c_while_waiting_for_the_programs_threads_ends_the_run_with_its_profile(
    tmp_path, task
):
    # The second: the Ctrl-C ended threading's wait before it marked itself done, and the
    # interpreter's exit waited again, for the thread sleeping 60 s (a hang).
    program, out = tmp_path / "program.py", tmp_path / "out.folded"
    program.write_text(
        "import threading, time\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        f"ThreadPoolExecutor().submit({task})  # never shut down\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "print('main done', flush=True)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "sampler", "run", "-o", str(out), str(program)],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )
    try:
        assert run.stdout.readline() == "main done\n"
        time.sleep(0.5)
        assert run.poll() is None  # waiting for the thread, as Python waits
        signals = _signal_state(run.pid)
        run.send_signal(signal.SIGINT)
        try:
            _, stderr = run.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end on SIGINT; its signals then: {signals}")
    finally:
        run.kill()
        run.wait()
        run.stdout.close()  # a failure above left them open, to be collected in another test
        run.stderr.close()
    assert run.returncode == -signal.SIGINT and "Traceback" not in stderr, stderr
    assert out.is_file()


@pytest.mark.parametrize("engine", ENGINES)
def test_the_samplers_own_start_and_stop_are_not_in_the_profile(tmp_path, engine):
    # In wall mode the main thread's waits in start() and stop() (a thread started, another
    # joined) are sampled in most runs: they were in the file as the program's stacks, below
    # the launcher's frames (hidden only once start() had returned) or rooted in stop().
    out = tmp_path / "out.folded"
    (tmp_path / "program.py").write_text("pass\n")
    options = ["--engine", engine, "--mode", "wall", "--interval", "0.0005"]
    result = sampler_command(["run", *options, "-o", str(out), "program.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    stacks = parse_folded(out.read_text())
    assert not [s for s in stacks if "sampler._process:" in s or "__main__:run" in s], stacks


def test_the_launchers_start_and_stop_stacks_are_told_from_the_programs():
    from sampler.__main__ import _program_counts

    counts = {
        "sampler._process:start;sampler._core:Sampler.start": 1,
        "sampler._process:stop:80;sampler._core:Sampler.stop:201": 2,  # --lineno
        "[thread:MainThread];sampler._process:stop": 3,  # --thread-frames
        "sampler._process:start_from_env": 4,
        "__main__:<module>;sampler._process:start": 5,  # the program's own call
        "[thread:MainThread];__main__:<module>": 6,
    }
    assert _program_counts(counts) == {s: n for s, n in counts.items() if n >= 4}


SHORT_MODULE = """
import sys
sys.setswitchinterval(10)  # the drain thread waits for the GIL until the module has ended
{imports}
import time

end = time.process_time() + 0.1
while time.process_time() < end:
    pass
"""


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("imports", ["", "import multiprocessing"])
def test_a_short_scripts_module_code_is_named_main(tmp_path, engine, imports):
    # The native engine drained a short script's module code after runpy had taken the script
    # out of sys.modules (as here, where the drain cannot run before; or by chance): it was
    # named "short.py:<module>", or "__mp_main__:<module>" once multiprocessing was imported,
    # where the python engine says __main__.
    (tmp_path / "short.py").write_text(SHORT_MODULE.format(imports=imports))
    result = sampler_command(["run", "--engine", engine, "-o", "out.folded", "short.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    stacks = parse_folded((tmp_path / "out.folded").read_text())
    assert sum(stacks.values()) >= 5 and all(s.startswith("__main__:<module>") for s in stacks), (
        stacks
    )
