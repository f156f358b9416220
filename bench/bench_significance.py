"""Benchmark of the compare view's statistics: /api/significance through a real
``fleetflame web``, against /api/diff (what the page asks first) on the same windows.

The fleet is bench/benchfleet.py's (instances x 2,000 distinct stacks, 200 with samples a
minute), written minute by minute for ``--hours`` hours with the collector's rollups every 5
minutes. A comparison is the last hour
against the hour before it, fleet-wide, for windows never asked before (each run moves both
sides back by one more minute); the server is started fresh for each scale and warmed on a
window that is never measured. Per case: the median over ``--runs`` of the wall time of the
whole request, the server's CPU time meanwhile, and its resident memory after the runs; the
ratio of /api/significance to /api/diff. At 1x (``--instances``) and 10x the instances.

    python bench/bench_significance.py                 # 10 and 100 instances, 3 runs
    python bench/bench_significance.py --quick         # 5 and 50 instances, 2 hours
"""

from __future__ import annotations

import argparse
import time

from benchfleet import Fleet, WebServer, database, load_average, median

from collector.store import Store

STACKS = 2000
ACTIVE = 200


def build(url: str, instances: int, hours: int, end: int) -> None:
    fleet = Fleet(instances, STACKS, ACTIVE)
    store = Store(url)
    store.migrate()
    began = time.monotonic()
    for bucket in range(end - hours * 3600, end, 60):
        store.write(*fleet.minute(bucket))
        if (bucket + 60) % 300 == 0:
            store.rollup(bucket + 60)  # as the collector does, every 5 minutes
    store.rollup(end)
    store.close()
    print(f"  {instances} instances x {hours} h written in {time.monotonic() - began:.0f} s",
          flush=True)  # fmt: skip


def windows(end: int, shift: int) -> str:
    b_to = end - 60 * shift
    return f"a_from={b_to - 7200}&a_to={b_to - 3600}&b_from={b_to - 3600}&b_to={b_to}"


def bench_scale(instances: int, args: argparse.Namespace) -> dict[str, float]:
    end = int(time.time()) // 60 * 60 - 600  # settled: ten minutes ago
    figures: dict[str, list[float]] = {}
    with database("sqlite") as url:
        build(url, instances, args.hours, end)
        with WebServer(url) as server:
            server.wait()
            server.warmed()
            server.get(f"/api/diff?{windows(end, args.runs + 1)}")  # warm-up: never measured
            for run in range(1, args.runs + 1):
                query = windows(end, run)
                for name in ("diff", "significance"):
                    ms, cpu, answer = server.get(f"/api/{name}?{query}")
                    figures.setdefault(f"{name}_ms", []).append(ms)
                    figures.setdefault(f"{name}_cpu", []).append(cpu)
                    if name == "significance":
                        figures.setdefault("replicates", []).append(answer["replicates"]["a"])
                        figures.setdefault("judged", []).append(answer.get("hypotheses", 0))
            rss, peak = server.memory_mb()
    out = {key: median(values) for key, values in figures.items()}
    out.update(rss=rss, peak=peak)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=10, help="the 1x fleet")
    parser.add_argument("--hours", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="5 and 50 instances, 2 hours")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.hours = 5, 2
    print(f"load average {load_average()}")
    rows = []
    for scale in (1, 10):
        instances = args.instances * scale
        print(f"{scale}x: {instances} instances", flush=True)
        rows.append((scale, instances, bench_scale(instances, args)))
    print("\nlast hour vs the hour before, fleet-wide, new windows; medians of "
          f"{args.runs} runs (SQLite)")  # fmt: skip
    print(f"{'scale':>5} {'inst':>5} {'repl/side':>9} {'judged':>7} {'diff ms':>8} "
          f"{'signif ms':>9} {'ratio':>6} {'diff cpu':>8} {'signif cpu':>10} {'rss MB':>7} "
          f"{'peak MB':>7}")  # fmt: skip
    for scale, instances, f in rows:
        print(f"{scale:>4}x {instances:>5} {f['replicates']:>9.0f} {f['judged']:>7.0f} "
              f"{f['diff_ms']:>8.0f} {f['significance_ms']:>9.0f} "
              f"{f['significance_ms'] / f['diff_ms']:>5.1f}x {f['diff_cpu']:>8.0f} "
              f"{f['significance_cpu']:>10.0f} {f['rss']:>7.0f} {f['peak']:>7.0f}")  # fmt: skip
    (_, _, one), (_, _, ten) = rows
    print(f"10x / 1x: significance {ten['significance_ms'] / one['significance_ms']:.1f}x wall, "
          f"{ten['significance_cpu'] / max(one['significance_cpu'], 1):.1f}x CPU; "
          f"diff {ten['diff_ms'] / one['diff_ms']:.1f}x wall")  # fmt: skip


if __name__ == "__main__":
    main()
