"""Benchmark of the store on SQLite and PostgreSQL: ingest rate, merged-profile query time, disk use.

A synthetic fleet: `--instances` workers in 5 services, each with `--stacks` distinct stacks
20-50 frames deep drawn from one shared call tree (so stacks share prefixes), of which
`--active` have samples in any one minute (Zipf-like popularity). One write per minute of
fleet data: every instance's rows plus its cursor updates, as the poller does. Prints the
median of `--runs` runs of every figure next to its target.

    python bench/bench_store.py                 # both engines, 24 h of a 50-instance fleet
    python bench/bench_store.py --quick         # a scaled-down run in about a minute
    python bench/bench_store.py --engines sqlite --hours 6
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa  # noqa: E402

from collector.query import Query  # noqa: E402
from collector.store import CursorUpdate, SampleRow, Store  # noqa: E402

PG_ADMIN_URL = os.environ.get(
    "FLEETFLAME_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
DAY = 86400
TARGET_INGEST = 50_000  # rows/s
TARGET_1H_MS = 200
TARGET_24H_MS = 500


def make_stacks(rng: random.Random, count: int) -> list[str]:
    """Returns `count` distinct stacks 20-50 frames deep grown from a shared call tree."""
    modules = [f"app.mod{i}" for i in range(40)] + ["json", "re", "socket", "ssl", "sqlalchemy.orm"]
    trunk = [f"{rng.choice(modules)}:f{i}" for i in range(60)]
    stacks: set[str] = set()
    while len(stacks) < count:
        shared = rng.randint(8, 18)  # common prefix: the server loop, the framework
        depth = rng.randint(20, 50)
        frames = trunk[:shared] + [
            f"{rng.choice(modules)}:fn{rng.randint(0, 300)}" for _ in range(depth - shared)
        ]
        stacks.add(";".join(frames))
    return sorted(stacks)


class Fleet:
    """The synthetic fleet: per instance its stacks and a popularity-weighted sampler."""

    def __init__(self, instances: int, stacks: int, active: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        pool = make_stacks(rng, stacks * 2)
        self.active = active
        self.instances = []
        for i in range(instances):
            own = rng.sample(pool, stacks)
            weights = [1 / (rank + 1) ** 0.8 for rank in range(stacks)]
            self.instances.append(
                {
                    "service": f"svc{i % 5}",
                    "host": f"host-{i // 2}",
                    "instance": uuid.UUID(int=rng.getrandbits(128)).hex[:16],
                    "labels": {"version": "1.4.2", "env": "prod"},
                    "stacks": own,
                    "weights": weights,
                    "cumulative": {},
                }
            )
        self.rng = rng

    def minute(self, bucket: int) -> tuple[list[SampleRow], list[CursorUpdate]]:
        """Returns one minute of fleet rows and the matching cursor updates."""
        rows: list[SampleRow] = []
        cursors: list[CursorUpdate] = []
        for inst in self.instances:
            picked = set(self.rng.choices(inst["stacks"], inst["weights"], k=self.active * 2))
            changed = {}
            for stack in list(picked)[: self.active]:
                count = self.rng.randint(1, 60)
                rows.append(
                    SampleRow(
                        bucket,
                        "cpu",
                        inst["service"],
                        inst["host"],
                        inst["instance"],
                        inst["labels"],
                        stack,
                        count,
                    )
                )
                key = (0, stack)
                inst["cumulative"][key] = inst["cumulative"].get(key, 0) + count
                changed[key] = inst["cumulative"][key]
            cursors.append(
                CursorUpdate(
                    f"{inst['host']}:8021", inst["instance"], not inst.get("seen"), changed, {0: {}}
                )
            )
            inst["seen"] = True
        return rows, cursors


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def disk_bytes(store: Store, path: Path | None) -> int:
    if store.dialect == "sqlite":
        assert path is not None
        with store.engine.sa_engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    with store.engine.sa_engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_database_size(current_database())")).scalar())


def sample_rows(store: Store) -> dict[int, int]:
    with store.engine.sa_engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT width, count(*) FROM samples GROUP BY width"))
        return {int(w): int(c) for w, c in rows}


def run_engine(engine: str, args: argparse.Namespace) -> dict[str, float]:
    """Runs every measurement on one engine; returns the figures."""
    tmp = tempfile.TemporaryDirectory()
    admin = None
    path: Path | None = None
    if engine == "sqlite":
        path = Path(tmp.name) / "bench.db"
        url = f"sqlite:///{path}"
    else:
        name = f"fleetflame_bench_{uuid.uuid4().hex[:10]}"
        admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    store = Store(url)
    try:
        store.migrate()
        return measure(store, path, args)
    finally:
        store.close()
        if admin is not None:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
        tmp.cleanup()


def measure(store: Store, path: Path | None, args: argparse.Namespace) -> dict[str, float]:
    fleet = Fleet(args.instances, args.stacks, args.active)
    end = 1_800_000_000 // DAY * DAY + 10 * 3600  # 10:00 UTC on some day
    start = end - args.hours * 3600
    ingest_rates = []
    rows_written = 0
    last_progress = time.monotonic()
    for bucket in range(start, end, 60):
        rows, cursors = fleet.minute(bucket)
        seconds = timed(lambda rows=rows, cursors=cursors: store.write(rows, cursors))
        ingest_rates.append(len(rows) / seconds)
        rows_written += len(rows)
        if bucket % 3600 == 0 and time.monotonic() - last_progress > 10:
            print(f"    {store.dialect}: {(bucket - start) / 3600:.0f} h written", flush=True)
            last_progress = time.monotonic()
        if bucket % 3600 == 0:
            store.rollup(bucket)  # the maintenance job runs while the collector writes
    rollup_seconds = timed(lambda: store.rollup(end + 180))
    fine_bytes = disk_bytes(store, path)
    rows_by_width = sample_rows(store)
    query = Query(store)
    hour = (end - 3600 + 120, end + 120)  # "the last hour", not aligned to anything
    day = (end - DAY, end)
    one_hour_ms = [1000 * timed(lambda: query.profile(*hour)) for _ in range(args.runs)]
    day_ms = [1000 * timed(lambda: query.profile(*day)) for _ in range(args.runs)]
    fine_hour_ms = []
    for _ in range(args.runs):  # the worst case: an hour read from minute rows only
        seg = (end - 3600, end)
        fine_hour_ms.append(1000 * timed(lambda seg=seg: fine_profile(query, *seg)))
    stored_rows = sum(rows_by_width.values())
    return {
        "rows_written": rows_written,
        "ingest_rows_per_s": statistics.median(ingest_rates),
        "rollup_s": rollup_seconds,
        "query_1h_ms": statistics.median(one_hour_ms),
        "query_1h_minute_rows_ms": statistics.median(fine_hour_ms),
        "query_24h_ms": statistics.median(day_ms),
        "bytes_per_row": fine_bytes / max(stored_rows, 1),
        "rows_60": rows_by_width.get(60, 0),
        "rows_600": rows_by_width.get(600, 0),
        "rows_3600": rows_by_width.get(3600, 0),
        "profile_stacks": len(query.profile(*day)),
    }


def fine_profile(query: Query, start: int, end: int) -> dict[str, int]:
    """Reads a window from minute rows only, as if no rollup had run."""
    import collector.query as q

    real_plan = q.plan
    q.plan = lambda s, e, states, max_width=None: real_plan(s, e, states[:1])  # type: ignore[assignment]
    try:
        return query.profile(start, end)
    finally:
        q.plan = real_plan


def projection(figures: dict[str, float], args: argparse.Namespace) -> tuple[float, float]:
    """Projects rows and bytes for 30 days of this fleet with the default rollups."""
    hours = args.hours
    per_minute = figures["rows_60"] / max(min(hours, 24) * 60, 1)
    per_10min = figures["rows_600"] / max(hours * 6, 1) if figures["rows_600"] else per_minute * 6
    per_hour = figures["rows_3600"] / max(hours, 1) if figures["rows_3600"] else per_10min * 6
    rows = per_minute * 1440 * 1 + per_10min * 144 * 7 + per_hour * 24 * 30
    return rows, rows * figures["bytes_per_row"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--instances", type=int, default=50)
    parser.add_argument("--stacks", type=int, default=2000, help="distinct stacks per instance")
    parser.add_argument("--active", type=int, default=200, help="stacks with samples per minute")
    parser.add_argument("--hours", type=int, default=24, help="hours of fleet data to write")
    parser.add_argument("--runs", type=int, default=5, help="runs of each query (median)")
    parser.add_argument("--quick", action="store_true", help="10 instances, 3 hours")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.hours, args.runs = 10, 3, 3
    print(
        f"fleet: {args.instances} instances x {args.stacks} stacks, {args.active} active per "
        f"minute, {args.hours} h of data, medians of {args.runs} runs"
    )
    for engine in args.engines.split(","):
        print(f"== {engine}", flush=True)
        f = run_engine(engine, args)
        rows30, bytes30 = projection(f, args)
        check = lambda ok: "ok" if ok else "MISSED"  # noqa: E731
        print(f"  rows written              {f['rows_written']:>12,.0f}")
        print(
            f"  ingest (median per write) {f['ingest_rows_per_s']:>12,.0f} rows/s   target >= "
            f"{TARGET_INGEST:,} ({f['ingest_rows_per_s'] / TARGET_INGEST:.2f}x) "
            f"{check(f['ingest_rows_per_s'] >= TARGET_INGEST)}"
        )
        print(
            f"  profile, last hour        {f['query_1h_ms']:>12.1f} ms       target <= "
            f"{TARGET_1H_MS} ({f['query_1h_ms'] / TARGET_1H_MS:.2f}x) "
            f"{check(f['query_1h_ms'] <= TARGET_1H_MS)}"
        )
        print(f"  profile, hour, minute rows{f['query_1h_minute_rows_ms']:>12.1f} ms (no rollup)")
        if args.hours >= 24:
            print(
                f"  profile, 24 hours         {f['query_24h_ms']:>12.1f} ms       target <= "
                f"{TARGET_24H_MS} ({f['query_24h_ms'] / TARGET_24H_MS:.2f}x) "
                f"{check(f['query_24h_ms'] <= TARGET_24H_MS)}"
            )
        else:
            print(f"  profile, {args.hours} hours (of 24) {f['query_24h_ms']:>9.1f} ms")
        print(f"  stacks in the 24 h profile {f['profile_stacks']:>11,.0f}")
        print(f"  final rollup run          {f['rollup_s']:>12.2f} s")
        print(
            f"  rows by tier (60/600/3600) {f['rows_60']:,.0f} / {f['rows_600']:,.0f} / "
            f"{f['rows_3600']:,.0f}"
        )
        print(f"  bytes on disk per row     {f['bytes_per_row']:>12.1f}")
        print(
            f"  30 days projected         {rows30:>12,.0f} rows, {bytes30 / 1e9:.2f} GB "
            f"(1 day of minute rows, 7 days of 10-minute rows, 30 days of hourly rows)"
        )


if __name__ == "__main__":
    main()
