"""Benchmark of the stall watcher's own cost (issue 16): the CPU its thread (`ff-stalls`) uses,
read from its own clock (/proc/self/task/TID/schedstat), in a fresh process per round.

Cases: an idle process; an asyncio loop turning 1,000 and 10,000 short callbacks a second
(every callback timed, so the watcher has calls to look at on each wake); a thread running
Python all the time (each wake finds the GIL held and waits for a switch interval). The
baseline, measured in the same process over the same seconds: a bare Python thread waking as
often as the watcher (`time.sleep(period)` in a loop), i.e. what waking alone costs on this
machine. The budget is issue 16's: stalls and middleware together under 0.5% of a CPU.

    python bench/bench_watcher.py                       # 3 rounds of 8 s a case
    python bench/bench_watcher.py --root /tmp/other     # another checkout (a before/after)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 0.005  # of a CPU, issue 16

WORKER = r"""
import asyncio, json, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
case, seconds = sys.argv[2], float(sys.argv[3])
import sampler

def clocks():
    found = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{task}/schedstat") as f:
                found[name] = int(f.read().split()[0])
        except OSError:
            pass
    return found

s = sampler.start(port="none")
period = s.stalls.period
stop = threading.Event()

def bare_wakes():
    import ctypes
    ctypes.CDLL(None).prctl(15, b"bare-wakes", 0, 0, 0)  # PR_SET_NAME
    while True:  # until the process ends: read after the case's own stop
        time.sleep(period)

threading.Thread(target=bare_wakes, daemon=True).start()

def busy():
    total = 0
    while not stop.is_set():
        total += sum(range(100))

async def callbacks(per_second):
    pause = 10 / per_second  # ten tasks
    async def one():
        while not stop.is_set():
            await asyncio.sleep(pause)
            sum(range(200))
    await asyncio.gather(*(one() for _ in range(10)))

time.sleep(0.5)
before, started = clocks(), time.monotonic()
if case == "idle":
    time.sleep(seconds)
elif case == "busy thread":
    threading.Thread(target=busy, daemon=True).start()
    time.sleep(seconds)
else:
    per_second = 1000 if case == "asyncio 1,000/s" else 10000
    loop = asyncio.new_event_loop()
    loop.call_later(seconds, stop.set)
    loop.run_until_complete(callbacks(per_second))
after, elapsed = clocks(), time.monotonic() - started
stop.set()
share = {name: (after[name] - before.get(name, 0)) / 1e9 / elapsed for name in ("ff-stalls", "bare-wakes")}
print(json.dumps({"engine": s.engine.name, "share": share}))
"""

CASES = ("idle", "asyncio 1,000/s", "asyncio 10,000/s", "busy thread")


def measure(root: Path, case: str, seconds: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(root), case, str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {case!r} worker failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 2, 3.0
    shares: dict[str, list[dict[str, float]]] = {case: [] for case in CASES}
    engine = "?"
    for _ in range(args.rounds):  # the cases interleaved, so a noisy minute hits them all
        for case in CASES:
            result = measure(args.root, case, args.seconds)
            engine = result["engine"]
            shares[case].append(result["share"])
    print(
        f"the stall watcher's thread, {args.root}, {engine} engine, medians of {args.rounds} "
        f"fresh processes of {args.seconds:.0f} s:"
    )
    print(f"  {'case':18s} {'watcher':>9s} {'bare wakes':>11s} {'ratio':>6s} {'of budget':>10s}")
    for case in CASES:
        watcher = statistics.median(r["ff-stalls"] for r in shares[case])
        bare = statistics.median(r["bare-wakes"] for r in shares[case])
        print(
            f"  {case:18s} {watcher:9.3%} {bare:11.3%} {watcher / bare:5.2f}x "
            f"{watcher / BUDGET:9.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
