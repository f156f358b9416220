"""Benchmark of the statistics of a comparison (collector.stats): how small a change a
comparison of 1, 10 and 50 instances x 1 hour at 100 Hz can detect, whether it keeps its
promises, and how long it takes.

Synthetic fleets of known truth (bench/synthfleet.py): 150 functions with Zipf self shares,
an instance's minute at 100 Hz one replicate of 6,000 samples, so an hour of one instance is
60 replicates. How much replicates vary beyond sample counting is an assumption, shown at two
levels: a concentration of 2,000 (shares vary ~4x the binomial variance) and 200 (~31x).

1. The minimal detectable change (80% power, at the FDR over the functions judged) of
   functions with ~1%, ~5% and ~22% self share, each side 1, 10 and 50 instances x 60
   minutes: medians over --seeds fleets, and the ratios between sizes (sqrt(10) = 3.16 and
   sqrt(5) = 2.24 were replicates independent and the noise all between minutes).
2. The promise: a change of the reported size planted in the ~5% function at 10 instances
   is found in about 80% of --runs fleets, and A/A comparisons report any change in about 5%.
3. Instances that differ for good (each instance's shares drawn around the truth, its minutes
   around its own): A/A comparisons of 10 instances a side, with (instance, minute) replicates
   and with one replicate per instance (its minutes merged).
4. Time: compare_replicates of 50 instances x 60 minutes a side (20 A/A splits included), and
   ``fleetflame compare`` on 10 instances x 60 minutes of folded files a side (wall time of the
   command, files read and parsed): medians of --repeat runs.

    python bench/bench_compare.py            # about a minute
    python bench/bench_compare.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from synthfleet import (  # noqa: E402
    Truth,
    draw,
    leaf_with_share,
    profiles,
    with_change,
    zipf_truth,
)

from collector.stats import Options, Replicates, compare_replicates  # noqa: E402
from sampler.profile import format_folded  # noqa: E402

MINUTES = 60  # an hour of one-minute replicates
SAMPLES = 6000  # a minute at 100 Hz
ROOT = Path(__file__).resolve().parent.parent


def mde_of(truth: Truth, leaf: int, instances: int, concentration: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    a = draw(rng, truth, instances, MINUTES, samples=SAMPLES, concentration=concentration)
    b = draw(rng, truth, instances, MINUTES, samples=SAMPLES, concentration=concentration)
    comparison = compare_replicates(a, b, Options(splits=0))
    name = truth.leaves[leaf]
    return next(f.mde for f in comparison.findings if (f.function, f.kind) == (name, "self"))


def detection(
    truth: Truth, leaf: int, change: float, instances: int, runs: int, **fleet: float
) -> float:
    """The share of ``runs`` comparisons finding the leaf's change (any change at all for an
    A/A comparison, ``change`` 0)."""
    changed = with_change(truth, leaf, change) if change else truth
    found = 0
    for seed in range(runs):
        rng = np.random.default_rng(10_000 + seed)
        a = draw(rng, truth, instances, MINUTES, samples=SAMPLES, **fleet)
        b = draw(rng, changed, instances, MINUTES, samples=SAMPLES, **fleet)
        comparison = compare_replicates(a, b, Options(splits=0))
        if change:
            name = truth.leaves[leaf]
            found += any(f.significant and f.function == name for f in comparison.findings)
        else:
            found += any(f.significant for f in comparison.findings)
    return found / runs


def per_instance(replicates: Replicates, instances: int) -> Replicates:
    """Each instance's minutes merged into one replicate."""
    leaves = replicates.self_counts.reshape(instances, MINUTES, -1).sum(axis=1)
    return Replicates.from_arrays(
        replicates.functions,
        leaves,
        replicates.total_counts.reshape(instances, MINUTES, -1).sum(axis=1),
        replicates.samples.reshape(instances, MINUTES).sum(axis=1),
    )


def instance_effects(truth: Truth, instances: int, runs: int) -> tuple[float, float]:
    """A/A rates with instances differing for good: (instance, minute) replicates, and one
    replicate per instance."""
    by_minute = by_instance = 0
    for seed in range(runs):
        rng = np.random.default_rng(20_000 + seed)
        fleet = dict(samples=SAMPLES, concentration=2000.0, instance_concentration=20_000.0)
        a = draw(rng, truth, instances, MINUTES, **fleet)
        b = draw(rng, truth, instances, MINUTES, **fleet)
        options = Options(splits=0)
        by_minute += any(f.significant for f in compare_replicates(a, b, options).findings)
        merged = compare_replicates(per_instance(a, instances), per_instance(b, instances))
        by_instance += any(f.significant for f in merged.findings)
    return by_minute / runs, by_instance / runs


def timings(truth: Truth, repeat: int, instances: int, cli_instances: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    a = draw(rng, truth, instances, MINUTES, samples=SAMPLES)
    b = draw(rng, truth, instances, MINUTES, samples=SAMPLES)
    arrays = []
    for _ in range(repeat):
        began = time.perf_counter()
        compare_replicates(a, b)
        arrays.append(time.perf_counter() - began)
    with tempfile.TemporaryDirectory() as folder:
        for side in ("a", "b"):
            (Path(folder) / side).mkdir()
            drawn = draw(rng, truth, cli_instances, MINUTES, samples=SAMPLES)
            for i, counts in enumerate(profiles(truth, drawn)):
                (Path(folder) / side / f"{i:05d}.folded").write_text(format_folded(counts))
        command = [sys.executable, "-m", "sampler.cli", "compare", "a", "--vs", "b", "--json"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cli = []
        for _ in range(repeat):
            began = time.perf_counter()
            subprocess.run(command, cwd=folder, check=False, capture_output=True, env=env)
            cli.append(time.perf_counter() - began)
    return {"arrays": statistics.median(arrays), "cli": statistics.median(cli)}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer fleets: a few seconds")
    parser.add_argument("--seeds", type=int, default=5, help="fleets per MDE (median)")
    parser.add_argument("--runs", type=int, default=200, help="fleets per rate")
    parser.add_argument("--repeat", type=int, default=5, help="runs per timing (median)")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.runs, args.repeat = 1, 20, 1
    truth = zipf_truth()
    leaves = {share: leaf_with_share(truth, share) for share in (1.0, 5.0, 22.0)}
    sizes = (1, 10, 50)
    print(
        f"{len(truth.leaves)} functions; a replicate is an instance's minute, {SAMPLES:,} samples"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n1. minimal detectable change, points (80% power), medians of", args.seeds, "fleets")
    five = {}
    for concentration in (2000.0, 200.0):
        dispersion = 1 + (SAMPLES - 1) / (concentration + 1)
        print(f"  concentration {concentration:g} (shares vary ~{dispersion:.0f}x the binomial):")
        for share, leaf in leaves.items():
            mdes = [
                statistics.median(mde_of(truth, leaf, n, concentration, s) for s in range(args.seeds))
                for n in sizes
            ]  # fmt: skip
            if share == 5.0 and concentration == 2000.0:
                five = dict(zip(sizes, mdes, strict=True))
            cells = "  ".join(f"{n:>2} inst {m:6.3f}" for n, m in zip(sizes, mdes, strict=True))
            print(
                f"    {100 * truth.shares[leaf]:5.2f}% share: {cells}   ratios "
                f"1->10 {mdes[0] / mdes[1]:.2f}, 10->50 {mdes[1] / mdes[2]:.2f}"
            )
    print(f"\n2. promises, {args.runs} fleets of 10 instances x {MINUTES} minutes a side")
    power = detection(truth, leaves[5.0], five[10], 10, args.runs)
    print(f"  a change of the MDE ({five[10]:.3f} points) in the ~5% function found: {power:.0%} (80% promised)")  # fmt: skip
    aa = detection(truth, leaves[5.0], 0.0, 10, args.runs)
    print(f"  A/A comparisons reporting any change: {aa:.1%} (FDR 5%)")
    print(f"\n3. instances that differ for good, A/A, {args.runs} fleets of 10 instances a side")
    by_minute, by_instance = instance_effects(truth, 10, args.runs)
    print(f"  (instance, minute) replicates: {by_minute:.1%} report a change (FDR 5%)")
    print(f"  one replicate per instance:    {by_instance:.1%}")
    print("\n4. time, medians of", args.repeat, "runs")
    cli_instances = 2 if args.quick else 10
    took = timings(truth, args.repeat, 10 if args.quick else 50, cli_instances)
    print(f"  compare_replicates, {10 if args.quick else 50} x {MINUTES} replicates a side: {1000 * took['arrays']:.0f} ms")  # fmt: skip
    print(f"  fleetflame compare, {cli_instances * MINUTES} files a side: {took['cli']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
