"""Other threads' CPU clocks: read safely while threads come and go, and right after a fork."""

import json
import subprocess
import sys

import pytest
from samplerhelpers import env

# A thread that has ended, and whose stack glibc has since unmapped (twenty more threads ended
# after it, past glibc's 40 MB cache of stacks): time.pthread_getcpuclockid(its ident) reads the
# unmapped memory and the process dies of SIGSEGV (it did, under a thread-per-request server,
# when a thread ended between the engine listing the threads and reading their clocks). Every
# reader of another thread's clock must answer "no clock" instead.
STALE = """
import threading, time
from sampler._cpuclock import thread_cpu_time
from sampler._dump import _cpu
from sampler._stacks import StackTable
gate = threading.Event()
others = [threading.Thread(target=gate.wait) for _ in range(20)]
for other in others:
    other.start()
t = threading.Thread(target=lambda: None)
t.start()
ident = t.ident
t.join()
time.sleep(0.05)  # its stack is in glibc's cache, and the twenty ending below push it out
gate.set()
for other in others:
    other.join()
time.sleep(0.05)
table = StackTable(mode=MODE, interval=0.01, max_depth=64, max_stacks=100, lineno=False,
                   thread_frames=False)
print(thread_cpu_time(ident), _cpu(ident), table._thread_cpu(ident))
"""


@pytest.mark.parametrize("mode", ["cpu", "wall"])
@pytest.mark.parallel
def test_the_clock_of_a_thread_that_ended_reads_as_none_and_never_crashes(mode):
    code = STALE.replace("MODE", repr(mode))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["None", "None", "0.0"]


# In a forked child, threading (before Python 3.12) keeps the parent's kernel id for the thread
# that forked: its CPU must still be read from the child's own clock.
FORKED = """
import json, os, time, sampler
from sampler._cpuclock import thread_cpu_time
import threading
pid = os.fork()
if pid == 0:
    s = sampler.start(port="none", engine="python", driver="thread", mode="cpu")
    end = time.thread_time() + 0.5
    while time.thread_time() < end:
        pass
    folded = s.folded()
    mine = thread_cpu_time(threading.get_ident())
    print(json.dumps({"samples": sum(folded.values()), "cpu": mine, "own": time.thread_time()}))
    sampler.stop()
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_forked_childs_thread_is_read_on_its_own_clock():
    result = subprocess.run(
        [sys.executable, "-c", FORKED], capture_output=True, text=True, env=env(), timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    facts = json.loads(result.stdout)
    assert facts["cpu"] == pytest.approx(facts["own"], abs=0.01)
    assert facts["samples"] >= 25  # 0.5 s of CPU at 100 Hz, less what a busy machine delays


# Forked before the sampler is imported, as a gunicorn worker loads its app: the thread that
# forked still says its parent's kernel id (before Python 3.12), and /dump named the master's.
IMPORTED_AFTER_FORK = """
import json, os, threading, time, urllib.request
pid = os.fork()
if pid == 0:
    # Imported from another thread than the one that forked (a request thread, lazily).
    importer = threading.Thread(target=lambda: __import__("sampler"))
    importer.start()
    importer.join()
    import sampler
    s = sampler.start(port=0)
    dump = urllib.request.urlopen(s.url + "/dump", timeout=10).read().decode()
    main = next(line for line in dump.splitlines() if '"MainThread"' in line)
    end = time.thread_time() + 0.2
    while time.thread_time() < end:
        pass
    from sampler._cpuclock import thread_cpu_time
    mine = thread_cpu_time(threading.get_ident())
    print(json.dumps({"main": main, "pid": os.getpid(), "cpu": mine, "own": time.thread_time()}))
    sampler.stop()
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_child_that_imports_the_sampler_after_its_fork_reads_its_own_thread():
    result = subprocess.run(
        [sys.executable, "-c", IMPORTED_AFTER_FORK],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    facts = json.loads(result.stdout)
    assert f"(native {facts['pid']}," in facts["main"], facts  # the child's main thread: its pid
    assert facts["cpu"] == pytest.approx(facts["own"], abs=0.01)
