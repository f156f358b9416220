"""Sampler overhead, against an unprofiled baseline measured in the same run.

    python bench/bench_sampler.py [--rounds 5] [--seconds 3]

A CPU-bound workload with 50-frame-deep stacks runs in a fresh process per measurement:
unprofiled; under fleetflame at 100 Hz (the native engine, and the python engine); under the
20-line signal sampler of Nylas's 2016 post
(string formatting per sample, main thread only); under ``py-spy record`` at 100 Hz. The
configurations are interleaved round by round so drift on a shared machine hits them alike;
medians and ratios to the baseline are printed. Then the same with 50 threads of which one is
busy, the per-sample cost of a 50-frame stack, and the time to serve 20,000 distinct stacks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKLOAD = r"""
import json, os, signal, sys, threading, time
from collections import defaultdict
config, iterations, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def nylas_sampler(interval=0.01):
    # The design of Nylas's 2016 post: format every frame as a string at every sample,
    # main thread only (the frame the signal interrupted).
    counts = defaultdict(int)
    def sample(signum, frame):
        stack = []
        while frame is not None:
            stack.append("{}({})".format(frame.f_code.co_name, frame.f_globals.get("__name__")))
            frame = frame.f_back
        counts[";".join(reversed(stack))] += 1
        signal.setitimer(signal.ITIMER_PROF, interval, 0)
    signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, interval, 0)
    return counts

def deep(n, fn):
    if n == 0:
        return fn()
    return deep(n - 1, fn)

def work():
    x = 0
    for i in range(iterations):
        x += i * i % 7
    return x

stop = threading.Event()
idlers = [threading.Thread(target=stop.wait, daemon=True) for _ in range(threads - 1)]
for t in idlers:
    t.start()
info = {}
if config in ("native", "python"):
    import sampler
    s = sampler.start(port="none", interval=0.01, engine=config)
elif config == "nylas":
    nylas_sampler()
elif config == "py-spy":
    sys.stdout.write("ready\n"); sys.stdout.flush()
    sys.stdin.readline()  # py-spy is attached
cpu0, wall0 = time.process_time(), time.perf_counter()
deep(48, work)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
if config in ("native", "python"):
    info = s.info()
    sampler.stop()
elif config == "nylas":
    signal.setitimer(signal.ITIMER_PROF, 0, 0)
stop.set()
print(json.dumps({"cpu": cpu, "wall": wall, "info": info}))
"""


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def run_once(config: str, iterations: int, threads: int) -> dict:
    """Runs the workload once under ``config``; returns its CPU and wall seconds."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-c", WORKLOAD, config, str(iterations), str(threads)]
    if config != "py-spy":
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.splitlines()[-1])
    target = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert target.stdout.readline().strip() == "ready"
    spy = subprocess.Popen(
        [
            py_spy(),
            "record",
            "--rate",
            "100",
            "--format",
            "raw",
            "--output",
            os.devnull,
            "--pid",
            str(target.pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # let py-spy attach
    target.stdin.write("go\n")
    target.stdin.flush()
    result = json.loads(target.stdout.readlines()[-1])
    target.wait()
    spy.send_signal(signal.SIGINT)
    _, _, usage = os.wait4(spy.pid, 0)
    result["profiler_cpu"] = usage.ru_utime + usage.ru_stime
    return result


def calibrate(seconds: float) -> int:
    """Returns the iteration count that takes about ``seconds`` of CPU here."""
    probe = 2_000_000
    cpu = run_once("baseline", probe, 1)["cpu"]
    return int(probe * seconds / cpu)


def overhead_table(configs: list[str], iterations: int, threads: int, rounds: int) -> dict:
    results: dict[str, list[dict]] = {c: [] for c in configs}
    for _ in range(rounds):
        for config in configs:
            results[config].append(run_once(config, iterations, threads))
    base_cpu = statistics.median(r["cpu"] for r in results["baseline"])
    base_wall = statistics.median(r["wall"] for r in results["baseline"])
    print(f"\n{threads} thread(s), 1 busy, 50-frame stacks, {rounds} interleaved rounds, medians:")
    print(f"  {'config':<12}{'CPU s':>8}{'CPU ratio':>11}{'wall ratio':>12}{'self-measured':>15}")
    summary = {}
    for config, runs in results.items():
        cpu = statistics.median(r["cpu"] for r in runs)
        wall = statistics.median(r["wall"] for r in runs)
        extra = ""
        if config in ("native", "python"):
            self_percent = statistics.median(r["info"]["overhead_percent"] for r in runs)
            extra = f"{self_percent:.3f}% CPU"
            summary[config + " self_percent"] = self_percent
            summary[config + " ticks_per_second"] = statistics.median(
                r["info"]["ticks_per_second"] for r in runs
            )
        if config == "py-spy":
            extra = f"py-spy itself {statistics.median(r['profiler_cpu'] for r in runs):.2f} s CPU"
        print(f"  {config:<12}{cpu:>8.3f}{cpu / base_cpu:>11.4f}{wall / base_wall:>12.4f}  {extra}")
        summary[config] = cpu / base_cpu
    return summary


def per_sample_cost() -> float:
    """Microseconds for one tick that walks a whole 50-frame stack (no reuse), median of 5."""
    import threading

    from sampler._settings import resolve
    from sampler._stacks import StackTable

    # The default bounds: a stack of 50 frames is walked whole (max_depth 128).
    table = StackTable.from_settings(resolve({}, environ={}), mode="wall", interval=1e-9)
    ident = threading.get_ident()

    def measure() -> float:
        frame = sys._getframe()
        times = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(2000):
                table._threads.clear()  # forget the last walk: every tick walks all 50 frames
                table.sample({ident: frame}, set())
            times.append((time.perf_counter() - started) / 2000 * 1e6)
        return statistics.median(times)

    def deep(n: int) -> float:
        return measure() if n == 0 else deep(n - 1)

    return deep(48)


def serving_cost() -> dict[str, float]:
    """Milliseconds to build /profile.json and /stacks with 20,000 distinct stacks in process,
    and to serve them over HTTP (the body is megabytes: transfer counts), medians of 5."""
    import random
    import urllib.request

    import sampler

    s = sampler.start(port=0, engine="python", driver="thread", interval=10.0)  # idle
    try:
        rng = random.Random(1)
        names = [s.table.intern(f"pkg.module{i % 40}:function_{i}") for i in range(3000)]
        with s._lock:
            for _i in range(20_000):
                stack = tuple(rng.choice(names) for _ in range(rng.randint(20, 40)))
                s.table.counts[(0, stack)] = rng.randint(1, 1000)
        figures = {}
        for path, build in (("/profile.json", s.profile_json), ("/stacks", s.folded_text)):
            built, served = [], []
            for _ in range(5):
                started = time.perf_counter()
                body = build()
                built.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                with urllib.request.urlopen(s.url + path, timeout=30) as response:
                    response.read()
                served.append((time.perf_counter() - started) * 1000)
            figures[path + " built"] = statistics.median(built)
            figures[path + " served"] = statistics.median(served)
            figures[path + " MB"] = len(body) / 1e6
        return figures
    finally:
        sampler.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds per run")
    options = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    iterations = calibrate(options.seconds)
    configs = ["baseline", "native", "python", "nylas"] + (["py-spy"] if py_spy() else [])
    one = overhead_table(configs, iterations, 1, options.rounds)
    fifty = overhead_table(["baseline", "native", "python"], iterations, 50, options.rounds)
    cost = per_sample_cost()
    serving = serving_cost()
    print("\nAt 100 Hz (bench_ticks.py counts the instructions per tick):")
    for engine in ("native", "python"):
        for label, table in (("1 busy thread", one), ("50 threads, 1 busy", fifty)):
            print(
                f"  {engine:<7} {label + ':':<20} self-measured "
                f"{table[engine + ' self_percent']:.3f}% CPU, A/B CPU ratio "
                f"{100 * (table[engine] - 1):+.2f}%, {table[engine + ' ticks_per_second']:.0f} "
                "ticks/s"
            )
    print(f"  python engine, per sample, 50 frames walked (hot): {cost:.1f} us")
    for path in ("/profile.json", "/stacks"):
        print(
            f"  serving 20,000 stacks, {path}: built in {serving[path + ' built']:.1f} ms "
            f"(target <= 50 ms), over HTTP {serving[path + ' served']:.1f} ms "
            f"({serving[path + ' MB']:.1f} MB)"
        )
    if "nylas" in one:
        print(f"  Nylas design: CPU ratio {one['nylas']:.4f}")


if __name__ == "__main__":
    main()
