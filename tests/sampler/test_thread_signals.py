"""The sampler's threads leave the process's signals to the host's threads: a signal sent to the
process goes to any thread that does not block it, and a host whose handler must interrupt its
own thread's wait (uWSGI's worker in epoll_wait, on SIGTERM) hung when one landed on ours."""

import os
import signal
import threading
import urllib.request

import pytest
from samplerhelpers import ENGINES

import sampler
import sampler.middleware
from sampler._requests import recorder

# Reads the threads' signal masks only.
pytestmark = pytest.mark.parallel

HOST_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD)
KEPT = (signal.SIGSEGV, signal.SIGBUS, signal.SIGPROF)


def masks():
    """Each thread of this process: its OS name -> the signals it blocks."""
    found = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{task}/status") as f:
                line = next(line for line in f if line.startswith("SigBlk:"))
        except (OSError, StopIteration):
            continue  # ended meanwhile
        bits = int(line.split()[1], 16)
        found[f"{name}/{task}"] = {n for n in range(1, 65) if bits & (1 << (n - 1))}
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_every_thread_of_the_samplers_blocks_the_hosts_signals_and_no_other(engine):
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    s = sampler.start(port=0, engine=engine, driver="thread" if engine == "python" else "auto")
    try:
        with urllib.request.urlopen(s.url + "/", timeout=10) as answer:
            answer.read()  # the endpoint's workers have started

        def app(environ, start_response):
            start_response("200 OK", [])
            return [b""]

        body = sampler.middleware.WSGIMiddleware(app)({"PATH_INFO": "/a"}, lambda *a: None)
        body.close()  # the recorder's thread starts
        recorder.process()
        threads = masks()
    finally:
        sampler.stop()
        recorder.reset()
    ours = {name: blocked for name, blocked in threads.items() if name.startswith("ff-")}
    # drain or sampler, stalls, endpoint and its workers, requests
    assert len(ours) >= 4, sorted(threads)
    for name, blocked in ours.items():
        assert set(HOST_SIGNALS) <= blocked, name
        assert not set(KEPT) & blocked, name
    # The host's own threads keep their masks.
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    mine = threading.get_native_id()
    assert not set(HOST_SIGNALS) & next(b for n, b in threads.items() if n.endswith(f"/{mine}"))
