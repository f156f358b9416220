"""Samples under labels: a tagged block in a thread, a tagged function, and asyncio tasks."""

import asyncio
import json
import sys
import threading
import time
import urllib.request

import sampler


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def upload():
    with sampler.tag(route="/upload"):
        spin(0.4)
        # A pause between the two: a late tick (a loaded host can starve the sampling thread)
        # would otherwise charge CPU of one label set to the other; this test is about labels.
        time.sleep(0.15)
        with sampler.tag(phase="store"):
            spin(0.4)


@sampler.tagged(route="/download")
def download():
    spin(0.4)


def then_linger(work):
    """Runs ``work``, then, with the python engine, keeps the thread alive, blocked, until
    three more ticks have come.

    A thread's CPU after the last tick before it exits is never seen (its clock is gone), and
    the thread driver's ticks can be late by 100 ms or more while two threads spin for the GIL;
    a late tick charges the CPU before it to where it finds the thread, and moves it back only
    if the thread is then blocked there (see docs/sampler.md). So the thread lingers asleep,
    waking rarely enough to count as blocked. This test is about labels.
    """

    if s.engine.name == "native":
        return work  # it counts a thread's CPU up to its end, and ticks only on CPU spent

    def run():
        work()
        seen = s.ticks
        deadline = time.monotonic() + 10
        while s.ticks < seen + 3 and time.monotonic() < deadline:
            time.sleep(0.1)

    return run


async def task(name):
    # Two tasks interleave on one thread: each keeps its own labels.
    with sampler.tag(task=name):
        for _ in range(8):
            spin(0.03)
            await asyncio.sleep(0)


@sampler.tagged(job="tagged-coroutine")
async def tagged_coroutine():
    for _ in range(8):
        spin(0.03)
        await asyncio.sleep(0)


async def main_async():
    await asyncio.gather(task("a"), task("b"), tagged_coroutine())


engine = sys.argv[1] if len(sys.argv) > 1 else "python"
s = sampler.start(port=0, engine=engine, driver="thread" if engine == "python" else "auto")
threads = [threading.Thread(target=then_linger(work)) for work in (upload, download)]
for t in threads:
    t.start()
for t in threads:
    t.join()
asyncio.run(main_async())
spin(0.2)  # untagged
with urllib.request.urlopen(s.url + "/profile.json", timeout=10) as r:
    sys.stdout.write(r.read().decode())
sampler.stop()
print(json.dumps({"after_stop": sampler.current_labels()}), file=sys.stderr)
