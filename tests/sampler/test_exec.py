"""A sampled program that execs another, or forks a child to exec one, does not kill it.

The python engine's timer (setitimer) survives execve, and the program exec'd dies of the
first SIGPROF ("Profiling timer expired", status 155 or signal 27): exec'ing wrappers,
pexpect-style fork + exec, gunicorn's re-exec on USR2, subprocess with a preexec_fn.
"""

import subprocess
import sys

import pytest
from samplerhelpers import ENGINES, env, free_port

# The program exec'd spends CPU (the timer's ticks are CPU time) and says it lived.
BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('lived')"

START = "import os, subprocess, sys, sampler\nsampler.start(port='none', engine=sys.argv[1], interval=0.001)\n"

PROGRAMS = {
    "exec": "os.execv(sys.executable, [sys.executable, '-c', BUSY])",
    # gunicorn's USR2 and pexpect: a child forked, which execs.
    "fork then exec": (
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    t = __import__('time').process_time()\n"
        "    while __import__('time').process_time() - t < 0.05: pass  # sampled a while\n"
        "    os.execvpe(sys.executable, [sys.executable, '-c', BUSY], dict(os.environ))\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))"
    ),
    "preexec_fn": (
        "done = subprocess.run([sys.executable, '-c', BUSY], preexec_fn=os.setsid)\n"
        "sys.exit(done.returncode)"
    ),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_a_program_exec_d_lives(engine, program):
    code = f"BUSY = {BUSY!r}\n" + START + PROGRAMS[program]
    done = subprocess.run(
        [sys.executable, "-c", code, engine], capture_output=True, text=True, timeout=60, env=env()
    )
    assert (done.returncode, done.stdout) == (0, "lived\n"), done.stderr


def run_code(code, *args):
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, env=env()
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_a_failed_exec_leaves_the_sampler_as_it_was(engine):
    # Its counts, instance and timer go on, whichever thread exec'd (a restart lost the
    # counts; off the main thread it lost the signal driver for the life of the process).
    code = START + (
        "import signal, threading, time\n"
        "before = sampler.running()\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.2: pass\n"
        "counted = sum(before.folded().values())\n"
        "def fails():\n"
        "    try:\n"
        "        os.execv('/nonexistent/program', ['program'])\n"
        "    except OSError:\n"
        "        pass\n"
        "fails()\n"
        "thread = threading.Thread(target=fails)\n"
        "thread.start(); thread.join()\n"
        "after = sampler.running()\n"
        "ticking = before.engine.name == 'native' or signal.getitimer(signal.ITIMER_PROF)[1] > 0\n"
        "print(after is before, sum(after.folded().values()) >= counted > 0, ticking,\n"
        "      getattr(before.driver, 'name', '-'))"  # the native engine has no driver
    )
    done = run_code(code, engine)
    same, counted, ticking, driver = done.stdout.split()
    assert (same, counted) == ("True", "True"), done.stderr
    # The signal timer goes on, unless a loaded machine starved the main thread's handlers
    # and the watchdog moved the ticks to a thread (as it would without an exec).
    starved = "not running signal handlers in time" in done.stderr
    assert ticking == "True" or (driver == "thread" and starved), done.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_a_forked_child_execs_through_a_path_of_missing_entries(engine):
    # os.execvp tries each entry of PATH: a failed try must fail as exec fails (a restart
    # there raised the sampler's own error, on the parent's fixed port, and ended the search).
    code = START.replace("port='none'", f"port={free_port()}") + (
        "os.environ['PATH'] = '/nonexistent-dir:/usr/bin:/bin'\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.execvp('true', ['true'])\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))"
    )
    done = run_code(code, engine)
    assert done.stdout == "0\n", done.stderr


def test_an_exec_in_a_fork_hook_registered_before_the_sampler():
    # The hook runs before the sampler's own, with the sampler's lock still held from the
    # fork: the exec must take no lock (it hung).
    code = (
        "import os, sys\n"
        "os.register_at_fork(after_in_child=lambda: os.execv('/bin/true', ['true']))\n"
        "import sampler\n"
        "sampler.start(port='none', engine='python')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))"
    )
    done = run_code(code)
    assert done.stdout == "0\n", done.stderr


def test_an_exec_from_a_signal_handler_while_the_sampler_starts_and_stops():
    # A server re-exec'ing on a signal, landing while start() or stop() sets the timer.
    code = (
        "import os, random, signal, sys, time\n"
        f"BUSY = {BUSY!r}\n"
        "def trial(delay):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        import sampler\n"
        "        signal.signal(signal.SIGUSR1,\n"
        "                      lambda *a: os.execv(sys.executable, [sys.executable, '-c', BUSY]))\n"
        "        while True:\n"
        "            sampler.start(port='none', engine='python', interval=0.001, stalls=False)\n"
        "            sampler.stop()\n"
        "    time.sleep(delay)\n"
        "    os.kill(pid, signal.SIGUSR1)\n"
        "    _, status = os.waitpid(pid, 0)\n"
        "    return os.waitstatus_to_exitcode(status)\n"
        "random.seed(1)\n"
        "print([trial(random.uniform(0.05, 0.15)) for _ in range(8)])"
    )
    done = run_code(code)
    assert done.stdout.splitlines() == ["lived"] * 8 + [str([0] * 8)], done.stderr
