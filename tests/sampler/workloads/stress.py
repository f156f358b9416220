"""Hostile conditions for the native engine: each scenario runs with sampling at 1 kHz and must
end with exit status 0 and samples counted (a crash, a hang or lost sampling fails the test).

    python stress.py SCENARIO [SECONDS]
"""

import asyncio
import gc
import os
import sys
import threading
import time

import sampler


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def busy_until(end):
    # Busy by the wall clock: threads sharing two loaded cores all end on time.
    while time.monotonic() < end:
        pass


def allocation_and_gc(seconds):
    # Cycles and collections all the time, on several threads: signals land in the allocator
    # and in the collector.
    def churn():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            nodes = [{"next": None, "data": list(range(50))} for _ in range(200)]
            for a, b in zip(nodes, nodes[1:], strict=False):
                a["next"], b["prev"] = b, a
            del nodes
            gc.collect(0)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for t in threads:
        t.start()
    churn()
    for t in threads:
        t.join()


def threads_come_and_go(seconds):
    # Thousands of short threads: signals land while threads start and end, and in threads
    # whose Python state is already gone.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        batch = [threading.Thread(target=spin, args=(0.0005,)) for _ in range(20)]
        for t in batch:
            t.start()
        for t in batch:
            t.join()


def code_is_freed(seconds):
    # New code objects and functions every iteration, freed right after running: the drain
    # must never name a freed one, and must never touch one freed before it reads the record.
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        namespace = {}
        exec(
            f"def generated_{i % 50}(n):\n"
            f"    def inner(k):\n        return sum(x * x for x in range(k))\n"
            f"    return inner(n) + (lambda: {i})()\n",
            namespace,
        )
        namespace[f"generated_{i % 50}"](300)
        del namespace


def deep_and_generators(seconds):
    # Frames pushed and popped at every instruction: recursion to near the limit, generators
    # and coroutines resumed and finished.
    def recurse(n):
        return 0 if n == 0 else 1 + recurse(n - 1)

    def numbers(n):
        yield from range(n)

    async def step(n):
        await asyncio.sleep(0)
        return sum(numbers(n))

    async def many():
        await asyncio.gather(*(step(200) for _ in range(50)))

    end = time.monotonic() + seconds
    limit = sys.getrecursionlimit() - 50
    while time.monotonic() < end:
        recurse(limit)
        asyncio.run(many())


def fork_often(seconds):
    # The engine restarts in every child; children fork as the parent is being signalled.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pid = os.fork()
        if pid == 0:
            spin(0.02)
            ok = sampler.running() is not None and sampler.running().engine.name == "native"
            os._exit(0 if ok else 3)
        spin(0.01)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"a child ended with {os.waitstatus_to_exitcode(status)}")


def fork_without_follow(seconds):
    # follow_fork=False: the child stops the sampler it inherited, whose locks and timers the
    # parent's threads (here the wall thread) may have held at the fork.
    end = time.monotonic() + seconds
    workers = [threading.Thread(target=busy_until, args=(end,)) for _ in range(8)]
    for t in workers:
        t.start()
    while time.monotonic() < end:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if sampler.running() is None else 3)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"a child ended with {os.waitstatus_to_exitcode(status)}")
    for t in workers:
        t.join()


def subinterpreters(seconds):
    import _xxsubinterpreters as interpreters

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        interp = interpreters.create()
        interpreters.run_string(
            interp,
            "import time\nend = time.thread_time() + 0.02\nwhile time.thread_time() < end: pass",
        )
        interpreters.destroy(interp)


def exit_while_sampling(seconds):
    # The interpreter shuts down with busy daemon threads and the sampler still running.
    for _ in range(3):
        threading.Thread(target=busy_until, args=(time.monotonic() + 60,), daemon=True).start()
    busy_until(time.monotonic() + seconds)
    print("samples", sum(sampler.running().folded().values()), flush=True)
    sys.exit(0)


SCENARIOS = {
    f.__name__: f
    for f in (
        allocation_and_gc,
        threads_come_and_go,
        code_is_freed,
        deep_and_generators,
        fork_often,
        fork_without_follow,
        subinterpreters,
        exit_while_sampling,
    )
}

if __name__ == "__main__":
    scenario = SCENARIOS[sys.argv[1]]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    mode = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    follow = sys.argv[1] != "fork_without_follow"
    s = sampler.start(port="none", engine="native", interval=0.001, mode=mode, follow_fork=follow)
    scenario(seconds)
    info = s.info()
    sampler.stop()
    print("samples", info["total_samples"], "faults", info["native"]["faults"], flush=True)
    if info["engine"] != "native" or info["total_samples"] == 0:
        sys.exit(
            f"engine {info['engine']} ({info['engine_reason']}), {info['total_samples']} samples"
        )
