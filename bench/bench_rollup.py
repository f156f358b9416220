"""Benchmark of the rollup job catching up a backlog, on SQLite and PostgreSQL.

A rollup commits a chunk of time at a time. Run every 5 minutes it finds a few buckets; after
a collector was down, or on a database from before a tier, it finds days. This writes minute
rows the job has not seen (bench/benchfleet.py's fleet), copies the database, and rolls each
copy up in a process of its own: once pacing its chunks by the rows they write (today's
code), once at their least span (the code before the pace, the baseline). For each: the time,
the process's CPU and peak memory, and the transactions it took; then the ratio.

    python bench/bench_rollup.py                      # both engines, 1x and 10x
    python bench/bench_rollup.py --engines sqlite --scales 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import psycopg
import psycopg.sql
import sqlalchemy as sa
from benchfleet import DAY, PG_ADMIN_URL, Fleet, cpu_seconds, database, median, memory_mb

from collector.store import Store, fleet, maintenance, tiers

# name: (instances, stacks with samples a minute, hours of backlog). A quiet fleet leaves
# days of few rows; a busy one hours of many. --scales multiplies the instances.
SCENARIOS = {
    "quiet fleet, 3 days": (5, 5, 72),
    "busy fleet, 6 hours": (5, 200, 6),
}
END = 1_700_000_000 - 1_700_000_000 % DAY


def fill(url: str, instances: int, active: int, hours: int) -> int:
    """Writes ``hours`` of minute rows ending at END, never rolled up; returns how many."""
    fleet_ = Fleet(instances, 2000, active)
    written = 0
    with Store(url) as store:
        store.migrate()
        for bucket in range(END - hours * 3600, END, 60):
            rows, cursors = fleet_.minute(bucket)
            store.write(rows, cursors)
            written += len(rows)
    return written


def copy(engine: str, url: str) -> str:
    """Returns the URL of a copy of the database at ``url``."""
    if engine == "sqlite":
        path = url.removeprefix("sqlite:///")
        target = f"{path}.{uuid.uuid4().hex[:6]}"
        shutil.copyfile(path, target)
        return f"sqlite:///{target}"
    source = sa.engine.make_url(url).database
    name = f"{source}_{uuid.uuid4().hex[:6]}"
    admin = sa.engine.make_url(PG_ADMIN_URL)
    dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Identifier(source)
            )
        )
    return admin.set(database=name).render_as_string(hide_password=False)


def drop(engine: str, url: str) -> None:
    """Removes a copy made by copy()."""
    if engine == "sqlite":
        path = url.removeprefix("sqlite:///")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + suffix)
        return
    admin = sa.engine.make_url(PG_ADMIN_URL)
    dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                psycopg.sql.Identifier(sa.engine.make_url(url).database)
            )
        )


def roll_up(url: str, paced: bool) -> dict:
    """In this process: rolls the database up to END, counting its transactions."""
    if not paced:  # every chunk at its least span, as before the pace
        maintenance.ChunkPace = fleet.ChunkPace = lambda: tiers.ChunkPace(most=1)  # type: ignore[misc]
    commits = 0

    def count(conn: sa.Connection) -> None:
        nonlocal commits
        commits += 1

    with Store(url) as store:
        store.migrate()
        sa.event.listen(store.engine.sa_engine, "commit", count)
        cpu, wall = cpu_seconds(), time.perf_counter()
        store.rollup(END + 3600)
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    return {"seconds": wall, "cpu": cpu, "peak_mb": memory_mb()[1], "commits": commits}


def measured(url: str, paced: bool) -> dict:
    """Rolls a copy of the database up in a new process; returns what it measured."""
    argv = [sys.executable, __file__, "--one", url] + ([] if paced else ["--unpaced"])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--scales", default="1,10")
    parser.add_argument("--runs", type=int, default=3, help="copies rolled up per variant")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--unpaced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(roll_up(args.one, not args.unpaced)))
        return
    print("rollup of a backlog: paced chunks (now) against chunks at their least span (before)")
    for engine in args.engines.split(","):
        for scale in map(int, args.scales.split(",")):
            for name, (instances, active, hours) in SCENARIOS.items():
                with database(engine) as url:
                    began = time.monotonic()
                    rows = fill(url, instances * scale, active, hours)
                    print(f"{engine}, {scale}x, {name}: {rows:,} minute rows of "
                          f"{instances * scale} instances (written in "
                          f"{time.monotonic() - began:.0f} s)", flush=True)  # fmt: skip
                    results: dict[bool, list[dict]] = {True: [], False: []}
                    for _ in range(args.runs):
                        for paced in (False, True):  # interleaved: the same hour for both
                            scratch = copy(engine, url)
                            try:
                                results[paced].append(measured(scratch, paced))
                            finally:
                                drop(engine, scratch)
                    figures = {
                        paced: {k: median([r[k] for r in runs]) for k in runs[0]}
                        for paced, runs in results.items()
                    }
                    before, now = figures[False], figures[True]
                    for label, f in (("before", before), ("now", now)):
                        print(f"    {label:6} {f['seconds']:7.2f} s, CPU {f['cpu']:6.2f} s, "
                              f"peak {f['peak_mb']:5.0f} MB, {f['commits']:5.0f} transactions")  # fmt: skip
                    print(f"    now / before: time {now['seconds'] / before['seconds']:.2f}x, "
                          f"CPU {now['cpu'] / before['cpu']:.2f}x, peak memory "
                          f"{now['peak_mb'] / before['peak_mb']:.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
