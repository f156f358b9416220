"""A program of known call structure, for the trace tests (tests/sampler/test_trace.py).

- ``traced.py``: main(), the whole structure, once;
- ``traced.py late OUTPUT``: early(), then waits for OUTPUT to appear, then late();
- ``traced.py context OUTPUT [BACKEND]``: main() under ``sampler.trace(OUTPUT)``, in-process;
- ``traced.py fork``: early() in a forked child that exits through atexit, then late().
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

PLANTED = 0.05  # seconds planted_sleep() sleeps


def leaf(n):
    return sum(range(n))


def planted_sleep():
    time.sleep(PLANTED)


def middle():
    leaf(10)
    planted_sleep()
    return leaf(100)


def raiser():
    raise ValueError("planted")


def unwinder():
    raiser()  # the exception passes through this frame on its way out


def catcher():
    try:
        unwinder()
    except ValueError:
        pass


def numbers():
    yield 1
    yield 2
    yield 3


def consume():
    return sum(numbers())


def worker():
    middle()


async def napper():
    leaf(5)
    await asyncio.sleep(0.02)
    leaf(5)


async def gathered():
    await asyncio.gather(napper(), napper())


def main():
    thread = threading.Thread(target=worker, name="planted-worker")
    thread.start()
    middle()
    catcher()
    consume()
    asyncio.run(gathered())
    thread.join()


def early():
    leaf(10)


def late():
    leaf(10)


def run_late(output):
    early()
    deadline = time.monotonic() + 30
    while not os.path.exists(output) and time.monotonic() < deadline:
        time.sleep(0.01)
    late()
    print(json.dumps({"written_while_running": os.path.exists(output)}))


def run_fork():
    pid = os.fork()
    if pid == 0:
        early()
        sys.exit(0)  # through atexit, unlike multiprocessing's children
    os.waitpid(pid, 0)
    late()


def run_context(output, backend=None):
    import sampler
    from sampler._trace import Trace

    def own_profile(frame, event, arg):
        return None

    go = threading.Event()

    def started_before():
        go.wait()
        middle()

    before = threading.Thread(target=started_before, name="started-before")
    before.start()
    sys.setprofile(own_profile)
    threading.setprofile(own_profile)
    tracer = Trace(output, backend=backend) if backend else sampler.trace(output)
    with tracer as trace:
        go.set()
        main()
        before.join()
    print(
        json.dumps(
            {
                "profile_restored": sys.getprofile() is own_profile,
                "threading_profile_restored": threading.getprofile() is own_profile,
                "calls": trace.metadata["calls"],
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["late"]:
        run_late(sys.argv[2])
    elif sys.argv[1:2] == ["fork"]:
        run_fork()
    elif sys.argv[1:2] == ["context"]:
        run_context(*sys.argv[2:4])
    else:
        main()
        print("main done")
