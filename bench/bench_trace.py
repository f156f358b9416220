"""Tracing's slowdown on real third-party code, against untraced runs in the same session.

    python bench/bench_trace.py [--rounds 5] [--quick] [--python PATH]

Two workloads of the accuracy harness (bench/accuracy_workloads): Jinja2 rendering an order
report, and PyYAML's pure-Python loader and dumper round-tripping a document of 15 services;
each at 1x and 10x its size (10x is ~7.6 million events with Jinja2, ~4.2 million with PyYAML,
over the default bound of 2.5 million; the runs here raise the bound so nothing is cut).
Every run is a fresh process that times its own loop, untraced or
inside ``sampler.trace()`` (so the trace holds exactly the loop); the rounds interleave the two
so that drift on a shared machine hits both alike. Printed: medians of the loop's wall time
untraced and traced, their ratio (the slowdown) and the tracer's own estimate of it, events
and events per second, the peak RSS of the process untraced and traced (the writing of the
file included) and the file's size and write time.

``--python`` runs the workloads under another interpreter (3.12+ traces with
``sys.monitoring``), with this environment's site-packages on its path: Jinja2 and PyYAML then
run their pure-Python code (their C speedups are built for this interpreter only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "bench" / "accuracy_workloads"

RUNNER = r"""
import json, os, sys, time
os.environ["ACCURACY_SECONDS"] = "0"  # the workload module's own loop ends at once
name, repeat, output = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if name == "jinja2":
    import jinja_render as workload
    once = workload.render_once
else:
    import yaml_roundtrip as workload
    yaml = workload.yaml
    text = yaml.dump(workload.make_document(15), Dumper=yaml.SafeDumper)
    def once():
        yaml.dump(yaml.load(text, Loader=yaml.SafeLoader), Dumper=yaml.SafeDumper)
once()  # compiled, imported and warm, traced or not
result = {}
if output == "-":
    started = time.perf_counter()
    for _ in range(repeat):
        once()
    result["seconds"] = time.perf_counter() - started
else:
    import sampler
    with sampler.trace(output, max_events=200_000_000) as trace:
        started = time.perf_counter()
        for _ in range(repeat):
            once()
        result["seconds"] = time.perf_counter() - started
    result["trace"] = trace.metadata
print(json.dumps(result))
"""

# name -> (repetitions of the workload's unit at 1x, what a unit is)
WORKLOAD_SIZES = {
    "jinja2": (5, "renders of a 300-order report"),
    "pyyaml": (1, "round trip of a 15-service document"),
}


def run_once(python: str, name: str, repeat: int, output: str, folder: str) -> dict:
    """Runs one workload process; returns its report with its peak RSS (MB) added."""
    paths = [str(ROOT), str(WORKLOADS)]
    if python != sys.executable:
        paths.append(sysconfig.get_paths()["purelib"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    with tempfile.TemporaryFile(dir=folder) as errors:
        process = subprocess.Popen(
            [python, "-c", RUNNER, name, str(repeat), output],
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        assert process.stdout is not None
        out = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            errors.seek(0)
            raise RuntimeError(f"{name} x{repeat} failed:\n{errors.read().decode()}")
    result = json.loads(out.splitlines()[-1])
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    return result


def measure(python: str, name: str, repeat: int, rounds: int, folder: str) -> dict:
    """Interleaves untraced and traced runs; returns the medians."""
    untraced, traced = [], []
    output = os.path.join(folder, "trace.json")
    for _ in range(rounds):
        untraced.append(run_once(python, name, repeat, "-", folder))
        traced.append(run_once(python, name, repeat, output, folder))
        os.unlink(output)

    def median(runs: list[dict], get) -> float:
        return statistics.median(get(r) for r in runs)

    base = median(untraced, lambda r: r["seconds"])
    slow = median(traced, lambda r: r["seconds"])
    events = median(traced, lambda r: r["trace"]["events"])
    return {
        "untraced_s": base,
        "traced_s": slow,
        "slowdown": slow / base,
        "estimated": median(traced, lambda r: r["trace"]["estimated_slowdown"] or 0.0),
        "events": events,
        "events_per_s": events / slow,
        "per_event_ns": median(traced, lambda r: r["trace"]["per_event_ns"]),
        "bytecode_factor": median(traced, lambda r: r["trace"]["bytecode_factor"]),
        "rss_untraced_mb": median(untraced, lambda r: r["peak_rss_mb"]),
        "rss_traced_mb": median(traced, lambda r: r["peak_rss_mb"]),
        "file_mb": median(traced, lambda r: r["trace"]["file_bytes"]) / 1e6,
        "write_s": median(traced, lambda r: r["trace"]["write_seconds"]),
        "backend": traced[0]["trace"]["backend"],
        "python": traced[0]["trace"]["python"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    header = (
        f"  {'workload':<8}{'size':>5}{'untraced s':>11}{'traced s':>10}{'slowdown':>10}"
        f"{'estimate':>10}{'events':>12}{'events/s':>11}{'RSS MB':>14}{'file MB':>9}{'write s':>9}"
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as folder:
        for name, (unit, _) in WORKLOAD_SIZES.items():
            for scale in (1, 10):
                result = measure(args.python, name, unit * scale, rounds, folder)
                if not results:
                    print(
                        f"Python {result['python']}, {result['backend']}; {rounds} interleaved "
                        "rounds, medians; the loop's own wall time; RSS untraced -> traced:"
                    )
                    print(header)
                results[f"{name} {scale}x"] = result
                rss = f"{result['rss_untraced_mb']:.0f} -> {result['rss_traced_mb']:.0f}"
                print(
                    f"  {name:<8}{scale:>4}x{result['untraced_s']:>11.3f}"
                    f"{result['traced_s']:>10.3f}{result['slowdown']:>9.1f}x"
                    f"{result['estimated']:>9.1f}x{result['events']:>12,.0f}"
                    f"{result['events_per_s']:>11,.0f}{rss:>14}{result['file_mb']:>9.0f}"
                    f"{result['write_s']:>9.1f}",
                    flush=True,
                )
        sizes = ", ".join(
            f"{name} 1x = {unit} {what}" for name, (unit, what) in WORKLOAD_SIZES.items()
        )
        print(f"  ({sizes})")
        first = next(iter(results.values()))
        print(
            f"  measured at each trace's start: {first['per_event_ns']:.0f} ns an event, Python "
            f"code {first['bytecode_factor']:.2f}x slower with the profile function set"
        )
    print(json.dumps({"trace": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
