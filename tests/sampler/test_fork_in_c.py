"""A process forked in C, as uWSGI forks its workers: without Python's fork hooks (lazy apps:
the sampler starts in the child), or with only the child's (py-call-osafterfork)."""

import subprocess
import sys

import pytest
from samplerhelpers import ENGINES, env

pytestmark = pytest.mark.parallel  # counts of a 0.5 s spin, far from the bounds asked

# fork() through ctypes.PyDLL keeps the GIL held, as uWSGI's master holds it.
PRELUDE = """
import ctypes, os, sys, time
import sampler

def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

def fork_in_c():
    return ctypes.PyDLL(None).fork()

def in_child_forked_in_c(check):
    # Exits with 0 if check() held in a child forked in C, else 1 (the parent's sampler
    # stopped after).
    pid = fork_in_c()
    if pid == 0:
        os._exit(0 if check() else 1)
    _, status = os.waitpid(pid, 0)
    sampler.stop()
    sys.exit(os.waitstatus_to_exitcode(status))

def sampled_here(**settings):
    s = sampler.start(port="none", **settings)
    spin(0.5)
    total = s.table.total
    sampler.stop()
    return total >= 20
"""


def run(code):
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + code],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_a_sampler_started_in_a_child_forked_in_c_samples(engine):
    # The thread state kept the parent's thread id, and the native engine's timers all failed.
    done = run(f"in_child_forked_in_c(lambda: sampled_here(engine={engine!r}))")
    assert done.returncode == 0, done.stderr


def test_a_child_forked_in_c_stops_the_parents_sampler_at_once():
    # Its threads are the parent's: stop() joined each for 5 s (35 s at a uWSGI worker's exit).
    done = run("""
def stops_at_once():
    started = time.monotonic()
    sampler.stop()
    return time.monotonic() - started < 2
sampler.start(port=0)
in_child_forked_in_c(stops_at_once)
""")
    assert done.returncode == 0, done.stderr


def test_the_childs_fork_hook_alone_releases_nothing_it_did_not_take():
    # uWSGI's py-call-osafterfork calls PyOS_AfterFork_Child without PyOS_BeforeFork: the
    # hook released locks never taken ("cannot release un-acquired lock" at each worker).
    done = run("""
def restarted_by_the_hook():
    ctypes.pythonapi.PyOS_AfterFork_Child()
    s = sampler._process.running()
    spin(0.5)
    ok = s is not None and s.instance["pid"] == os.getpid() and s.table.total >= 20
    sampler.stop()
    return ok
sampler.start(port="none")
in_child_forked_in_c(restarted_by_the_hook)
""")
    assert done.returncode == 0, done.stderr
    assert "RuntimeError" not in done.stderr, done.stderr


def test_a_child_forked_in_c_refuses_to_start_over_the_parents_sampler_and_says_why():
    # uWSGI's @postfork start() in a worker of a master running the sampler, without
    # py-call-osafterfork: start() gave the parent's dead sampler; starting threads there
    # anew hung on a lock a parent's thread held at the fork (seen with the python engine).
    done = run("""
def refused_and_stopped():
    try:
        sampler.start(port="none")
        refused = False
    except sampler.SamplerError as exc:
        refused = "py-call-osafterfork" in str(exc)
    started = time.monotonic()
    sampler.stop()
    return refused and time.monotonic() - started < 2
sampler.start(port="none")
in_child_forked_in_c(refused_and_stopped)
""")
    assert done.returncode == 0, done.stderr


def test_the_thread_driver_samples_in_a_child_forked_in_c_after_the_import():
    # The main thread kept its parent's kernel id: its CPU clock named no thread (0 samples).
    done = run('in_child_forked_in_c(lambda: sampled_here(engine="python", driver="thread"))')
    assert done.returncode == 0, done.stderr


def test_a_child_that_does_not_follow_the_fork_lets_the_parents_port_go():
    # follow_fork=False: the child kept the parent's listening socket, which then accepted
    # connections nobody answered once the parent stopped.
    done = run("""
import socket
s = sampler.start(port=0, follow_fork=False)
port = int(s.url.rsplit(":", 1)[1])
pid = os.fork()
if pid == 0:
    time.sleep(1.0)
    os._exit(0)
sampler.stop()
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    refused = False
except OSError:
    refused = True
os.waitpid(pid, 0)
sys.exit(0 if refused else 1)
""")
    assert done.returncode == 0, done.stderr
