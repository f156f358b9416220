"""Runs every benchmark, one after the other, and prints their figures (`make bench`).

    python bench/run.py            # full size: tens of minutes on a 2-core machine
    python bench/run.py --quick    # scaled down, a few minutes
    python bench/run.py sampler poll   # only these

Each benchmark prints its own baseline measured in the same run and its ratios; see the
docstring of each bench/bench_*.py for what it measures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (script, arguments for a full run, arguments for a quick run)
BENCHMARKS = {
    "sampler": ("bench_sampler.py", [], ["--rounds", "3", "--seconds", "2"]),
    "ticks": ("bench_ticks.py", [], ["--iterations", "150000"]),
    "poll": ("bench_poll.py", [], ["--targets", "100", "--cycles", "3"]),
    "store": ("bench_store.py", [], ["--quick"]),
    "web": ("bench_web.py", [], ["--quick"]),
    "accuracy": ("accuracy.py", [], ["--quick"]),
    "compare": ("bench_compare.py", [], ["--quick"]),
    "significance": ("bench_significance.py", [], ["--quick"]),
    "worst": ("bench_worst.py", [], ["--targets", "20", "--cycles", "2"]),
    "trace": ("bench_trace.py", [], ["--quick"]),
    "middleware": ("bench_middleware.py", [], ["--quick"]),
    "middleware-instructions": ("bench_middleware_instructions.py", [], ["--requests", "500"]),
    "watcher": ("bench_watcher.py", [], ["--quick"]),
    "churn": ("bench_churn.py", [], ["--rounds", "1", "--seconds", "6"]),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"some of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="scaled-down runs")
    args = parser.parse_args()
    unknown = set(args.names) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmark {', '.join(sorted(unknown))}")
    failed = []
    for name in args.names or BENCHMARKS:
        script, full, quick = BENCHMARKS[name]
        command = [sys.executable, str(HERE / script), *(quick if args.quick else full)]
        print(f"\n== {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        if subprocess.call(command) != 0:
            failed.append(name)
        print(f"== {name}: {time.monotonic() - started:.0f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
