"""Ground truth: a workload split 70/30 between two functions must come out within a few points."""

import json
import threading
import time

import pytest
from samplerhelpers import ENGINES, run_sampled, share

# Percentage points. CPU timers fire on the kernel's scheduler tick (4 ms here), so 8 s of CPU
# give ~800 samples: a standard deviation of ~1.6 points, and 6 points is over 3 of them.
TOLERANCE = 6.0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("where", ["main", "thread"])
def test_cpu_mode_finds_the_cpu_split(tmp_path, where, engine):
    truth = tmp_path / "truth.json"
    counts = run_sampled(
        tmp_path,
        "split.py",
        "--kind",
        "cpu",
        "--where",
        where,
        "--seconds",
        "8",
        "--truth",
        str(truth),
        options=("--engine", engine),
    )
    expected = json.loads(truth.read_text())["hot_a"]
    assert 60 < expected < 80
    assert share(counts, "hot_a", ("hot_a", "hot_b")) == pytest.approx(expected, abs=TOLERANCE)
    # An idle thread uses no CPU while it waits, so it must not take the work's samples: 8 s
    # of waiting are 800 intervals. It runs a moment when it wakes at the end, and a timer's
    # first expiry falls anywhere in its first interval (a thread living less than one is
    # sampled with the right probability), so one sample there, a fraction of a percent of
    # runs, is the truth, not a bias.
    assert sum(c for stack, c in counts.items() if ":idle" in stack) <= 1
    # 8 s of CPU at 100 Hz is 800 samples; with the python engine, the thread case loses the
    # ~1 s before the auto driver notices the main thread is not running handlers, and counts
    # it as dropped. The native engine's timers are on each thread's own clock.
    work = sum(c for s, c in counts.items() if ":work" in s)
    assert (640 if where == "thread" and engine == "python" else 760) <= work <= 830


@pytest.mark.parametrize("engine", ENGINES)
def test_wall_mode_finds_the_sleep_split_and_idle_threads(tmp_path, engine):
    options = ("--engine", engine) + (("--driver", "thread") if engine == "python" else ())
    # A tick the host delays charges the whole gap to where it finds the thread: one stall of
    # 300 ms is 60 samples in one place. 8 s (1,600 samples) keeps one stall within tolerance;
    # at 4 s a fresh-clone CI run on a busy machine missed by 6.8 points.
    truth = tmp_path / "truth.json"

    def sampled_run() -> tuple[dict[str, int], float, float]:
        counts = run_sampled(
            tmp_path,
            "split.py",
            "--kind",
            "sleep",
            "--where",
            "thread",
            "--seconds",
            "8",
            "--truth",
            str(truth),
            options=("--mode", "wall", "--interval", "0.005", *options),
        )
        expected = json.loads(truth.read_text())["hot_a"]
        return counts, share(counts, "hot_a", ("hot_a", "hot_b")), expected

    counts, found, expected = sampled_run()
    if abs(found - expected) > TOLERANCE:
        # Even at 8 s, a few stalls of the host in one run can miss by a point or two more
        # (CI measured 75.4 against 69.1 once, the python engine): a second run, judged
        # together with the first, tells that from a bias, which misses in both.
        counts, found_again, expected_again = sampled_run()
        found, expected = (found + found_again) / 2, (expected + expected_again) / 2
    assert found == pytest.approx(expected, abs=TOLERANCE)
    # Wall time counts waiting: the idle thread is there for the whole run, marked waiting
    # (and on what: an Event, a lock).
    idle = sum(c for s, c in counts.items() if s.endswith(":idle") or ":idle;" in s)
    assert idle >= 1400  # 8 s at 200 Hz
    asleep = sum(c for s, c in counts.items() if ":idle;" in s and s.endswith(";[waiting];[lock]"))
    assert asleep >= 0.95 * idle, {s: c for s, c in counts.items() if ":idle" in s}


def burn_then_block(spent, done):
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        sum(i * i for i in range(2000))
    spent.append(time.thread_time())
    done.wait()


def test_a_reader_sees_the_cpu_used_after_the_last_tick():
    # An idle process gets no CPU-timer ticks: the CPU a thread used after the last one is
    # only read by a reader catching up. Two reads later, the counts match the thread's clock.
    import sampler

    s = sampler.start(port="none", interval=0.01, mode="cpu", engine="python", driver="signal")
    spent, done = [], threading.Event()
    worker = threading.Thread(target=burn_then_block, args=(spent, done))
    try:
        worker.start()
        while not spent:
            time.sleep(0.01)
        time.sleep(0.05)

        def burnt_seconds():
            counts = s._snapshot()
            names = {key: s.table.folded(key) for key in counts}
            return sum(c for k, c in counts.items() if "burn_then_block" in names[k]) * 0.01

        burnt_seconds()
        time.sleep(0.05)
        # Counts are whole samples, within one of the exact weight (StackTable.add).
        assert abs(burnt_seconds() - spent[0]) < 0.012
    finally:
        done.set()
        worker.join()
        sampler.stop()


@pytest.mark.parametrize("engine", ENGINES)
def test_counts_stay_still_after_stop(engine):
    import sampler

    s = sampler.start(port="none", interval=0.01, mode="cpu", engine=engine)
    spin_for(0.1)
    sampler.stop()
    stopped = s.folded()
    spin_for(0.1)  # a reader after stop must not take a tick of its own
    time.sleep(0.05)
    assert s.folded() == stopped


def spin_for(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(i * i for i in range(1000))
