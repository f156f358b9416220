"""The sampler's own work when the host makes and frees code all the time, against none.

    python bench/bench_churn.py [--rounds 3] [--seconds 12] [--root PATH]

Threads render a Jinja2 template, compiled once or compiled again for every render (as
``render_template_string`` does: new code objects and functions each time, freed a moment
later), in a fresh process per measurement (its last two thirds measured, after a warm-up in
which the sampler's logs of freed objects fill as a long-running host's do): unprofiled, and
under fleetflame at 100 Hz (the native engine, its default 1% overhead budget). Printed per case, medians of the rounds
(interleaved so drift on a shared machine hits both alike): renders per CPU-second under the
sampler against unprofiled, the sampler's own work as its overhead budget counts it (percent of
one CPU), its ticks a second against the process's CPU clock (100 a CPU-second at 100 Hz: the
rest is what the budget took, by stretching the interval), and the interval as the run ended.
1 thread and 4 threads are the 1x and the 4x load. ``--root`` runs another checkout's sampler
(a before/after in one run of this file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKLOAD = r"""
import json, os, sys, threading, time
import jinja2

profiled, per_call, threads, seconds = sys.argv[1] == "1", sys.argv[2] == "1", int(sys.argv[3]), float(sys.argv[4])
PAGE = "{% for i in items %}<li>{{ i|title }} {{ loop.index }}</li>{% endfor %}" * 5
ITEMS = ["a b", "c d"] * 20
ONCE = jinja2.Environment().from_string(PAGE)
stop = threading.Event()
renders = [0] * threads

def work(slot):
    env = jinja2.Environment()
    while not stop.is_set():
        template = env.from_string(PAGE) if per_call else ONCE
        template.render(items=ITEMS)
        renders[slot] += 1

s = None
if profiled:
    import sampler
    s = sampler.start(port="none", mode="cpu", interval=0.01)
workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
for w in workers:
    w.start()
# A warm-up: the drain's logs of freed objects fill over the first seconds (a steady state
# is what a long-running host has); then the measured window.
time.sleep(seconds / 3)
cpu0, renders0 = time.process_time(), sum(renders)
windows0 = len(s.budget.history) if s is not None else 0
time.sleep(seconds * 2 / 3)
cpu, done = time.process_time() - cpu0, sum(renders) - renders0
out = {"renders": done, "cpu": cpu}
if s is not None:
    windows = list(s.budget.history)[windows0:]
    wall = sum(w[0] for w in windows)
    out.update(
        overhead_percent=100 * sum(w[1] for w in windows) / wall,
        ticks_per_cpu=sum(w[2] for w in windows) / wall * (seconds * 2 / 3) / cpu,
        effective_interval=s.effective_interval,
    )
stop.set()
for w in workers:
    w.join()
if s is not None:
    sampler.stop()
print(json.dumps(out))
"""


def run_once(root: Path, profiled: bool, per_call: bool, threads: int, seconds: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    env.update(PYTHONPATH=str(root), FLEETFLAME_ENGINE="native", FLEETFLAME_STALLS="0")
    args = ["1" if profiled else "0", "1" if per_call else "0", str(threads), str(seconds)]
    result = subprocess.run(
        [sys.executable, "-c", WORKLOAD, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,  # -c puts the working directory first on the path
        timeout=120 + seconds,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=12.0, help="a third of it warm-up")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure")
    args = parser.parse_args()
    cases = [(per_call, threads) for per_call in (False, True) for threads in (1, 4)]
    runs: dict[tuple[bool, int, bool], list[dict]] = {}
    for _ in range(args.rounds):
        for per_call, threads in cases:
            for profiled in (False, True):
                result = run_once(args.root, profiled, per_call, threads, args.seconds)
                runs.setdefault((per_call, threads, profiled), []).append(result)

    def median(case: tuple[bool, int, bool], key: str) -> float:
        if key == "rate":
            return statistics.median(r["renders"] / r["cpu"] for r in runs[case])
        return statistics.median(r[key] for r in runs[case])

    print(
        f"the sampler under code churn, {args.root}, native engine at 100 Hz, medians of"
        f" {args.rounds} fresh processes of {args.seconds:g} s:"
    )
    print(
        f"  {'template':<18} {'threads':>7}  {'renders/CPU-s vs none':>21}  {'own work':>8}"
        f"  {'ticks a CPU-s':>13}  {'interval':>8}"
    )
    for per_call, threads in cases:
        on, off = (per_call, threads, True), (per_call, threads, False)
        ratio = median(on, "rate") / median(off, "rate")
        print(
            f"  {'compiled per render' if per_call else 'compiled once':<18} {threads:>7}"
            f"  {ratio:>20.3f}x  {median(on, 'overhead_percent'):>7.3f}%"
            f"  {median(on, 'ticks_per_cpu'):>13.1f}  {1000 * median(on, 'effective_interval'):>6.1f}ms"
        )


if __name__ == "__main__":
    main()
