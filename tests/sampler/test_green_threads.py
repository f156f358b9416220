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
