"""Under gevent's or eventlet's monkey patching a thread is a greenlet on the host's OS thread:
the sampler refuses to start there, and never blocks signals or renames a thread for one
(gevent is not among the project's dependencies: its patch is stood in for by a thread start
of another module, which is what the sampler looks at)."""

import signal
import threading

import pytest

import sampler
from sampler import SamplerError
from sampler._osthread import green_threads, own_thread

pytestmark = pytest.mark.parallel  # nothing timed


def start_new_thread(function, args, kwargs=None):
    return threading._thread_start(function, args, kwargs or {})  # type: ignore[attr-defined]


start_new_thread.__module__ = "gevent.thread"


@pytest.fixture
def patched(monkeypatch):
    monkeypatch.setattr(threading, "_thread_start", threading._start_new_thread, raising=False)
    monkeypatch.setattr(threading, "_start_new_thread", start_new_thread)


def test_green_threads_are_told_by_the_module_that_starts_threads(patched):
    assert green_threads() == "gevent.thread"


def test_threads_of_the_os_are_not_green():
    assert green_threads() is None


def test_a_debuggers_wrapper_of_the_thread_start_is_not_green(monkeypatch):
    # pydevd (VS Code, PyCharm) wraps it too: the sampler refused to start under a debugger.
    def wrapped(function, args, kwargs=None):
        return start_new_thread(function, args, kwargs)

    wrapped.__module__ = "_pydev_bundle.pydev_monkey"
    monkeypatch.setattr(threading, "_start_new_thread", wrapped)
    assert green_threads() is None


def test_python_3_13s_thread_start_is_looked_at_too(monkeypatch):
    # 3.13 starts threads by _start_joinable_thread, which gevent patches there.
    monkeypatch.setattr(threading, "_start_joinable_thread", start_new_thread, raising=False)
    assert green_threads() == "gevent.thread"


def test_the_sampler_refuses_to_start_on_green_threads_and_says_what_to_do(patched):
    # Started after gevent's patch_all(), the stall watcher's wait held the only OS thread and
    # start() never returned.
    with pytest.raises(SamplerError, match="before monkey patching"):
        sampler.start(port="none")
    assert sampler._process.running() is None


def test_own_thread_leaves_the_hosts_os_thread_alone_on_green_threads(patched):
    # A greenlet "thread" of ours blocked SIGTERM for the whole gunicorn gevent worker.
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    own_thread()
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    assert signal.SIGTERM not in before


def test_the_python_engine_started_before_patching_samples_the_main_greenlet():
    # gevent's patch makes threading's get_ident the greenlet's id and keys threading's table
    # by it: the python engine read no CPU clock for the main thread (3 samples in 6 s).
    import subprocess
    import sys

    from samplerhelpers import env

    program = """
import _thread, threading, time
import sampler
s = sampler.start(port="none", engine="python", mode="cpu")
main = threading.main_thread()
real, fake = main.ident, 12345
# As gevent's patch does: the main thread's get_ident is its greenlet's, the table re-keyed.
os_ident = _thread.get_ident
threading.get_ident = lambda: fake if os_ident() == real else os_ident()
del threading._active[real]
threading._active[fake] = main
main._ident = fake
end = time.thread_time() + 1.0
while time.thread_time() < end:
    pass
print(s.table.total)
threading._active[real] = main
del threading._active[fake]
main._ident = real
threading.get_ident = os_ident
sampler.stop()
"""
    done = subprocess.run(
        [sys.executable, "-c", program], env=env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 30, done.stdout


def test_a_slow_requests_stacks_on_green_threads_are_its_routes_not_its_os_threads(
    monkeypatch,
):
    # Greenlets serve requests in turns on one OS thread: its samples in a request's time are
    # any greenlet's. Two samples of that thread in a slow request's time, each of a route.
    from sampler import _labels
    from sampler._request_routes import Route, SlowRequest
    from sampler._requests import Recorder

    mine, other = (_labels._intern((("route", name),)) for name in ("/mine", "/other"))
    ident = threading.get_ident()
    samples = [(1.2, ident, (mine, (1,)), 1.0), (1.4, ident, (other, (2,)), 1.0)]

    class Table:
        def folded(self, key):
            return f"stack of {key[0]}"

    def stacks_of_a_slow_request():
        recorder = Recorder()
        monkeypatch.setattr(recorder, "_samples_since", lambda oldest: (samples, Table()))
        request = ("/mine", 1.0, 1.0, None, 0.0, ident, False, 200, "/mine")
        slow = SlowRequest(0.0, 1.0, None)
        recorder._add_stacks([(Route(), slow, request, True, True)])
        return slow.stacks

    assert stacks_of_a_slow_request() == {f"stack of {mine}": 1.0, f"stack of {other}": 1.0}
    monkeypatch.setattr(threading, "_thread_start", threading._start_new_thread, raising=False)
    monkeypatch.setattr(threading, "_start_new_thread", start_new_thread)
    assert stacks_of_a_slow_request() == {f"stack of {mine}": 1.0}


def test_the_os_main_thread_is_named_when_threading_knows_only_greenlets(monkeypatch):
    # Under gevent's patch threading's table is keyed by greenlets: a slow request or stall
    # told by the OS main thread's ident was named by that number.
    import _thread

    from sampler import _cpuclock
    from sampler._stalls import Stall

    ident = _thread.get_ident()  # the OS thread's, whatever patched threading
    others = {key: thread for key, thread in threading._active.items() if key != ident}
    monkeypatch.setattr(threading, "_active", others)
    assert _cpuclock.thread_name(ident) == "MainThread"
    assert _cpuclock.thread_name(None) == "?" and _cpuclock.thread_name(12345) == "12345"
    assert Stall("request", ident, 0.0, 0.1).thread == "MainThread"
