"""A sampled program that execs another, or forks a child to exec one, does not kill it.

The python engine's timer (setitimer) survives execve, and the program exec'd dies of the
first SIGPROF ("Profiling timer expired", status 155 or signal 27): exec'ing wrappers,
pexpect-style fork + exec, gunicorn's re-exec on USR2, subprocess with a preexec_fn.
"""

import subprocess
import sys

import pytest
from samplerhelpers import ENGINES, env

# The program exec'd spends CPU (the timer's ticks are CPU time) and says it lived.
BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('lived')"

START = "import os, subprocess, sys, sampler\nsampler.start(port=None, engine=sys.argv[1], interval=0.001)\n"

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


@pytest.mark.parametrize("engine", ENGINES)
def test_a_failed_exec_leaves_the_sampler_running_as_it_was(engine):
    code = START + (
        "before = sampler.running()\n"
        "try:\n"
        "    os.execv('/nonexistent/program', ['program'])\n"
        "except OSError:\n"
        "    pass\n"
        "after = sampler.running()\n"
        "print(after is not None and after is not before, after.settings['interval'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, engine], capture_output=True, text=True, timeout=60, env=env()
    )
    assert done.stdout == "True 0.001\n", done.stderr
