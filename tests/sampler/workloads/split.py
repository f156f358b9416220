"""A workload whose time split is known: about 70% in hot_a, 30% in hot_b (CPU or sleeping).

Durations are random around 7 ms and 3 ms, so the work has no period a sampler could alias
with; the workload measures the split it really made and writes it to --truth.
"""

import argparse
import json
import random
import threading
import time

spent = {"hot_a": 0.0, "hot_b": 0.0}


def burn(seconds):
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(200):
            x += i
    return x


def hot_a(kind, seconds):
    burn(seconds) if kind == "cpu" else time.sleep(seconds)


def hot_b(kind, seconds):
    burn(seconds) if kind == "cpu" else time.sleep(seconds)


def work(kind, seconds):
    clock = time.thread_time if kind == "cpu" else time.monotonic
    end = clock() + seconds
    while clock() < end:
        for func, mean in ((hot_a, 0.007), (hot_b, 0.003)):
            started = clock()
            func(kind, random.uniform(0.5, 1.5) * mean)
            spent[func.__name__] += clock() - started


def idle(stop):
    stop.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["cpu", "sleep"], default="cpu")
    parser.add_argument("--where", choices=["main", "thread"], default="main")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--truth", help="write the real split here, as JSON percentages")
    options = parser.parse_args()
    stop = threading.Event()
    idler = threading.Thread(target=idle, args=(stop,), name="idler")
    idler.start()
    if options.where == "main":
        work(options.kind, options.seconds)
    else:
        worker = threading.Thread(target=work, args=(options.kind, options.seconds), name="worker")
        worker.start()
        worker.join()
    stop.set()
    idler.join()
    if options.truth:
        total = sum(spent.values())
        with open(options.truth, "w") as f:
            json.dump({name: 100 * value / total for name, value in spent.items()}, f)


if __name__ == "__main__":
    main()
