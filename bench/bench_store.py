"""Benchmark of the store on SQLite and PostgreSQL: ingest rate, windows of the whole fleet
through a real ``fleetflame web``, and disk per instance-hour; at 1x and 10x the fleet.

The fleet is bench/benchfleet.py's (50 instances x 2,000 distinct stacks, 200 with samples
a minute). The database holds 30 days: the last ``--hours`` written minute by minute as the
collector does (one write a minute: every instance's rows and cursor updates, timed: the
ingest figures), with the rollup job every 5 minutes of that time; the days before written
an hour at a time, one pseudo-instance per service holding each stack its instances sampled
that hour (what the fleet tiers hold, at a fraction of the rows: windows of the whole fleet
read only those tiers there). Then ``fleetflame web`` serves it, and each window, fleet-wide
and new (never asked before), is asked ``--runs`` times through its HTTP API: the median,
the server's CPU time meanwhile, and the server's memory.

    python bench/bench_store.py                  # both engines, 1x and 10x
    python bench/bench_store.py --quick          # 10 instances, 2 hours + 6 days, 1x
    python bench/bench_store.py --engines sqlite --scales 1
"""

from __future__ import annotations

import argparse
import time

import sqlalchemy as sa
from benchfleet import (
    DAY,
    Fleet,
    WebServer,
    cpu_seconds,
    database,
    load_average,
    make_stacks,
    median,
    memory_mb,
    verdict,
)

from collector.store import Store

__all__ = ["make_stacks"]  # bench_poll.py builds its stacks with it

TARGET_INGEST = 100_000  # rows/s
TARGETS_MS = {"1 h": 100, "24 h": 150, "7 d": 300, "30 d": 500}
SPANS = {"1 h": 3600, "24 h": DAY, "7 d": 7 * DAY, "30 d": 30 * DAY}
ROLLUP_EVERY = 300  # seconds of fleet time, as the collector's default rollup_interval


def disk_bytes(store: Store) -> int:
    """Returns the bytes the database takes: the SQLite file's pages in use, or the sum of
    PostgreSQL's relations (tables, partitions, their indexes and TOAST)."""
    with store.engine.sa_engine.connect() as conn:
        if store.dialect == "sqlite":
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            pages, free, size = (
                conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("page_count", "freelist_count", "page_size")
            )
            return int((pages - free) * size)
        return int(
            conn.execute(
                sa.text(
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace"
                )
            ).scalar()
        )


def rows_by_tier(store: Store) -> dict[str, int]:
    with store.engine.sa_engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT width, count(*) FROM samples GROUP BY width")).all()
        fleet = conn.execute(sa.text("SELECT count(*) FROM fleet_samples")).scalar()
    return {**{f"w{w}": int(c) for w, c in rows}, "fleet": int(fleet or 0)}


def build(store: Store, fleet: Fleet, end: int, args: argparse.Namespace) -> dict:
    """Writes 30 days of the fleet ending at ``end``; returns the ingest figures."""
    minute_from = end - args.hours * 3600
    began = time.monotonic()
    for hour in range(end - args.days * DAY, minute_from, 3600):
        store.write(fleet.hour_by_service(hour))
        if hour % (6 * 3600) == 0:
            store.rollup(hour)
    store.rollup(minute_from)
    print(f"    {args.days - args.hours / 24:.0f} days an hour at a time in "
          f"{time.monotonic() - began:.0f} s", flush=True)  # fmt: skip
    before = disk_bytes(store)
    rates, cpu, sizes = [], [], []
    began = time.monotonic()
    for bucket in range(minute_from, end, 60):
        rows, cursors = fleet.minute(bucket)
        cpu_before, wall_before = cpu_seconds(), time.perf_counter()
        store.write(rows, cursors)
        seconds = time.perf_counter() - wall_before
        cpu.append(cpu_seconds() - cpu_before)
        rates.append(len(rows) / seconds)
        sizes.append(len(rows))
        if (bucket + 60) % ROLLUP_EVERY == 0:
            store.rollup(bucket + 60)
        if bucket % 3600 == 0 and time.monotonic() - began > 30:
            print(f"    {(bucket - minute_from) / 3600:.0f} of {args.hours} h minute by minute",
                  flush=True)  # fmt: skip
            began = time.monotonic()
    store.rollup(end)
    return {
        "rows_per_write": median(sizes),
        "ingest": median(rates),
        "cpu_per_write": median(cpu),
        "rss_mb": memory_mb()[0],
        "bytes_minute_part": disk_bytes(store) - before,
    }


def read_windows(url: str, end: int, args: argparse.Namespace) -> dict[str, dict]:
    """Asks a real fleetflame web for each window, ``runs`` times, each time a new one."""
    out: dict[str, dict] = {}
    with WebServer(url) as server:
        server.wait()
        # A running server: its stack index warmed, it has answered before (pools open).
        server.warmed()
        server.get(f"/api/flamegraph?from={end - 2 * 3600}&to={end - 3600}")
        for name, span in SPANS.items():
            if span > args.days * DAY:
                continue
            times, cpu = [], []
            for run in range(args.runs):
                to = end - 60 * run - 17 * (run + 1)  # unaligned, and new each time
                ms, cpu_ms, body = server.get(f"/api/flamegraph?from={to - span}&to={to}")
                times.append(ms)
                cpu.append(cpu_ms)
            out[name] = {"ms": median(times), "cpu_ms": median(cpu), "total": body["total"]}
        out["memory"] = dict(zip(("rss", "peak"), server.memory_mb(), strict=True))
    return out


def run(engine: str, scale: int, args: argparse.Namespace) -> dict:
    instances = args.instances * scale
    hours = args.hours if scale == 1 else min(args.hours, args.hours_10x)
    run_args = argparse.Namespace(**{**vars(args), "hours": hours})
    fleet = Fleet(instances, args.stacks, args.active)
    end = int(time.time()) // 60 * 60
    with database(engine) as url:
        store = Store(url)
        store.migrate()
        try:
            figures = build(store, fleet, end, run_args)
            figures["disk"] = disk_bytes(store)
            figures["tiers"] = rows_by_tier(store)
        finally:
            store.close()
        figures["reads"] = read_windows(url, end, run_args)
    figures["instance_hour"] = figures["bytes_minute_part"] / (instances * hours)
    figures["instances"], figures["hours"] = instances, hours
    return figures


def report(engine: str, scale: int, f: dict) -> None:
    print(f"== {engine}, {scale}x: {f['instances']} instances, the last {f['hours']} h minute "
          f"by minute; load average {load_average()}")  # fmt: skip
    print(f"  ingest, a write of {f['rows_per_write']:,.0f} rows + cursors  "
          f"{f['ingest']:>9,.0f} rows/s  {verdict(f['ingest'], TARGET_INGEST, at_most=False)}; "
          f"{1000 * f['cpu_per_write']:.0f} ms CPU a write, collector RSS {f['rss_mb']:.0f} MB")  # fmt: skip
    for name, r in f["reads"].items():
        if name == "memory":
            continue
        print(f"  GET /api/flamegraph, whole fleet, {name:<5} {r['ms']:>7.0f} ms  "
              f"{verdict(r['ms'], TARGETS_MS[name])}; server CPU {r['cpu_ms']:.0f} ms")  # fmt: skip
    memory = f["reads"]["memory"]
    print(f"  web server memory: {memory['rss']:.0f} MB resident, peak {memory['peak']:.0f} MB")
    print(f"  disk: {f['instance_hour'] / 1024:,.1f} KiB per instance-hour of minute data "
          f"(with its fleet rows and rollups); {f['disk'] / 1e9:.2f} GB in all")  # fmt: skip
    print("  rows by tier: " + ", ".join(f"{k} {v:,}" for k, v in sorted(f["tiers"].items())))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--scales", default="1,10", help="fleet sizes, times --instances")
    parser.add_argument("--instances", type=int, default=50)
    parser.add_argument("--stacks", type=int, default=2000, help="distinct stacks per instance")
    parser.add_argument("--active", type=int, default=200, help="stacks with samples per minute")
    parser.add_argument("--days", type=int, default=30, help="days of data in all")
    parser.add_argument("--hours", type=int, default=25, help="last hours written by minute")
    parser.add_argument("--hours-10x", type=int, default=2, help="the same at 10x the fleet")
    parser.add_argument("--runs", type=int, default=3, help="runs of each window (median)")
    parser.add_argument("--quick", action="store_true", help="10 instances, 2 h + 6 days, 1x")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.hours, args.days, args.scales = 10, 2, 7, "1"
    print(f"fleet: {args.instances} instances x {args.stacks} stacks, {args.active} active a "
          f"minute; {args.days} days of data; medians of {args.runs}")  # fmt: skip
    for scale in map(int, args.scales.split(",")):
        for engine in args.engines.split(","):
            report(engine, scale, run(engine, scale, args))


if __name__ == "__main__":
    main()
