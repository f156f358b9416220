"""The work the middleware test apps do, with planted slow paths (one definition for all)."""

import time


def work(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def planted_blocking_call():
    time.sleep(0.1)  # a blocking call: 100 ms of nothing, the worker (or the loop) held


def planted_slow_path(item_id):
    # 40 to 78 ms of CPU (4 samples or more at 100 Hz) in a shuffled order, so that the
    # slowest 1% is well defined: a tight cluster would sit on either side of its p99.
    end = time.thread_time() + 0.040 + 0.002 * (item_id // 50 * 7 % 20)
    while time.thread_time() < end:
        pass


def hold_the_worker():
    work(0.015)  # a huge record: the worker is busy 15 ms


def answer_item(plant, item_id):
    """An /items/ID request: the slow path, the blocking call, or half a millisecond of work."""
    if plant == "slow":
        planted_slow_path(item_id)
    elif plant == "block":
        planted_blocking_call()
    else:
        work(0.0005)


def answer_ad(plant):
    """An /ads/SLOT request: 15 ms holding the worker, or 0.3 ms of work."""
    if plant == "hold":
        hold_the_worker()
    else:
        work(0.0003)
