"""Every fault the collector must survive: no crash, a clear log line, nothing double counted,
nothing lost that could have been kept. Each runs on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
from pollhelpers import (
    ROOT,
    collector_settings,
    gigantic,
    hang_mid_response,
    make_doc,
    migrated_collector,
    send_status,
    stored,
    wait_until,
)
from storehelpers import TcpProxy

from collector.service import Collector


def pg_proxy() -> TcpProxy:
    """A forwarder to the local PostgreSQL: stopping it is an outage of that database."""
    proxy = TcpProxy(5432)
    proxy.start()
    return proxy


def through(proxy: TcpProxy, pg_url: str) -> str:
    """The URL of a PostgreSQL database on 127.0.0.1:5432, reached through ``proxy``."""
    return pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")


def _doc_with(entry):
    doc = make_doc([(0, "h;x", 1)], instance="h1")
    doc["stacks"].append(entry)
    return json.dumps(doc).encode()


def _wrong_types():
    doc = make_doc([(0, "h;x", 1)], instance="h1")
    doc["interval"] = "fast"
    return json.dumps(doc).encode()


HOSTILE = {
    "malformed_json": (
        lambda: b'{"format": "fleetflame.profile/1", "stacks": [[0, "a", 1',
        "invalid",
        "not valid JSON",
    ),
    "wrong_types": (_wrong_types, "invalid", "field 'interval'"),
    "negative_count": (lambda: _doc_with([0, "h;y", -5]), "invalid", "count -5 is negative"),
    "absurd_count": (lambda: _doc_with([0, "h;y", 10**40]), "invalid", "is absurd"),
    "gigantic": (lambda: gigantic(total_mb=128), "too_large", "byte cap"),
    "http_500": (
        lambda: send_status(500, b"worker exploded\n"),
        "http",
        "HTTP 500: worker exploded",
    ),
    "hangs_mid_response": (None, "timeout", ""),
}


@pytest.mark.parametrize("fault", sorted(HOSTILE))
def test_hostile_target(db_url, servers, logs, fault):
    make_behaviour, reason, message = HOSTILE[fault]
    good = servers(make_doc([(0, "g;a", 4)], instance="g1"))
    bad = servers(make_doc([(0, "h;x", 7), (0, "h;y", 2)], instance="h1"))
    release = threading.Event()
    bad.behaviour = hang_mid_response(release) if make_behaviour is None else make_behaviour()
    c = migrated_collector(db_url, [good.address, bad.address], max_response_bytes=2 * 1024 * 1024)
    try:
        started = time.monotonic()
        report = c.poll_cycle()
        assert (report.ok, report.failed) == (1, 1)
        assert time.monotonic() - started < 30
        (line,) = logs.matching("level=warning", "poll failed", f"target={bad.address}")
        assert f"reason={reason}" in line and message in line
        assert (
            c.metrics.get(
                "fleetflame_collector_target_failures_total", target=bad.address, reason=reason
            )
            == 1
        )
        # The target recovers: its counts are stored once, in full, and only once.
        release.set()
        bad.behaviour = "ok"
        good.doc = make_doc([(0, "g;a", 6)], instance="g1")
        c.poll_cycle()
        c.poll_cycle()
    finally:
        release.set()
        c.stop()
    assert stored(db_url, "h1") == {"h;x": 7, "h;y": 2}
    assert stored(db_url, "g1") == {"g;a": 6}


def test_dns_failure(db_url, servers, logs):
    good = servers(make_doc([(0, "g;a", 4)], instance="g1"))
    c = migrated_collector(db_url, [good.address, "no-such-worker.invalid:8021"])
    try:
        report = c.poll_cycle()
    finally:
        c.stop()
    assert (report.ok, report.failed) == (1, 1)
    assert logs.matching(
        "poll failed", "target=no-such-worker.invalid:8021", "reason=dns", "DNS lookup failed"
    )
    assert stored(db_url, "g1") == {"g;a": 4}


def test_postgresql_unreachable_for_a_while(pg_url, servers, logs):
    proxy = pg_proxy()
    server = servers(make_doc([(0, "a", 1)]))
    c = migrated_collector(through(proxy, pg_url), [server.address])
    try:
        assert c.poll_cycle().written
        proxy.stop()
        for count in (3, 6, 10):
            server.doc = make_doc([(0, "a", count), (0, f"b{count}", 1)])
            report = c.poll_cycle()
            assert report.ok == 1 and not report.written
        assert logs.matching("level=warning", "database unavailable; keeping deltas in memory")
        assert c.buffered_rows() == 6
        assert c.metrics.get("fleetflame_collector_database_up") == 0
        assert c.status()[0]  # still healthy: restarting would lose the buffer
        proxy.start()
        server.doc = make_doc([(0, "a", 11), (0, "b3", 1), (0, "b6", 1), (0, "b10", 1)])
        assert c.poll_cycle().written
        assert c.buffered_rows() == 0
    finally:
        c.stop()
        proxy.stop()
    assert stored(pg_url, "a1") == {"a": 11, "b3": 1, "b6": 1, "b10": 1}


def test_database_unreachable_at_start_waits_for_the_cursors(pg_url, servers, logs):
    proxy = pg_proxy()
    server = servers(make_doc([(0, "a", 5)]))
    first = migrated_collector(pg_url, [server.address])
    try:
        first.poll_cycle()
    finally:
        first.stop()
    proxy.stop()
    # A restart while the database is away: it must not poll without the cursors (it would
    # count the 5 samples again), and it must not crash.
    c = Collector(collector_settings(through(proxy, pg_url), [server.address]))
    try:
        server.doc = make_doc([(0, "a", 8)])
        assert c.poll_cycle().skipped == "no cursors"
        assert logs.matching("cannot load cursors; not polling yet")
        proxy.start()
        assert c.poll_cycle().samples == 3
    finally:
        c.stop()
        proxy.stop()
    assert stored(pg_url, "a1") == {"a": 8}


def test_full_buffer_drops_oldest_rows_but_keeps_their_cursors(pg_url, servers, logs):
    proxy = pg_proxy()
    server = servers(make_doc([(0, "a", 1)]))
    c = migrated_collector(through(proxy, pg_url), [server.address], buffer_max_rows=3)
    try:
        c.poll_cycle()
        proxy.stop()
        stacks = [(0, "a", 1)]
        for i in range(2, 5):  # three cycles of two new rows each, with room for three rows
            stacks = [(0, "a", i)] + [(0, f"c{i}", 10)] + stacks[1:]
            server.doc = make_doc(stacks)
            c.poll_cycle()
        dropped = c.metrics.get("fleetflame_collector_dropped_rows_total")
        assert dropped == 4
        lines = logs.matching("level=error", "write buffer full", "rows=2", "samples=11")
        assert len(lines) == 2
        proxy.start()
        c.poll_cycle()
        stacks = [(0, "a", 9)] + stacks[1:]
        server.doc = make_doc(stacks)
        c.poll_cycle()
    finally:
        c.stop()
        proxy.stop()
    # Rows of cycles 2 and 3 were dropped (a +1 and c2, a +1 and c3); the rest is exact and
    # the growth after the outage is counted from the right cursor, not again from zero.
    assert stored(pg_url, "a1") == {"a": 9 - 2, "c4": 10}


SQLITE_HOLDER = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN " + sys.argv[2])
conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
print("holding", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


@pytest.mark.parametrize("lock", ["DEFERRED", "EXCLUSIVE"])
def test_sqlite_locked_by_another_process(sqlite_url, servers, logs, lock):
    server = servers(make_doc([(0, "a", 1)]))
    c = migrated_collector(sqlite_url, [server.address])
    path = sqlite_url.removeprefix("sqlite:///")
    holder = subprocess.Popen(
        [sys.executable, "-c", SQLITE_HOLDER, path, lock],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        server.doc = make_doc([(0, "a", 4)])
        report = c.poll_cycle()
        if lock == "DEFERRED":
            # A reader (open read transaction) never blocks the writer in WAL mode.
            assert report.written
        else:
            assert not report.written and c.buffered_rows() == 1
            assert logs.matching("database unavailable; keeping deltas in memory", "locked")
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(30)
        server.doc = make_doc([(0, "a", 6)])
        assert c.poll_cycle().written
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdin.close()
        holder.stdout.close()
        c.stop()
    assert stored(sqlite_url, "a1") == {"a": 6}


def test_collector_killed_mid_write(db_url, servers, tmp_path):
    """SIGKILL a real collector process again and again while it writes big batches."""
    stacks = {f"mod:main;mod:handler;mod:leaf_{i}": 1 for i in range(6000)}
    server = servers(make_doc([(0, s, c) for s, c in stacks.items()], instance="k1"))
    lock = threading.Lock()
    stop = threading.Event()

    def grow():
        rng = random.Random(7)
        keys = list(stacks)
        while not stop.wait(0.1):
            with lock:
                for key in rng.sample(keys, 2000):
                    stacks[key] += rng.randint(1, 5)
                server.doc = make_doc([(0, s, c) for s, c in stacks.items()], instance="k1")

    grower = threading.Thread(target=grow, daemon=True)
    grower.start()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [
        sys.executable,
        "-m",
        "collector",
        "--database-url",
        db_url,
        "--targets",
        server.address,
        "--poll-interval",
        "0.3",
        "--health-listen",
        "",
        "--log-level",
        "info",
    ]
    rng = random.Random(11)
    kills = 0
    try:
        for _ in range(3):
            log_path = tmp_path / f"collector-{kills}.log"
            with open(log_path, "w") as log_file:
                proc = subprocess.Popen(args, env=env, stderr=log_file, stdout=log_file)
                wait_until(
                    lambda p=log_path: "poll cycle done" in p.read_text(),
                    timeout=60,
                    what="a first cycle",
                )
                # Kill shortly after the next fetch: while it computes deltas or writes them.
                seen = server.requests
                wait_until(
                    lambda s=seen: server.requests > s,
                    timeout=30,
                    interval=0.01,
                    what="the next fetch",
                )
                time.sleep(rng.uniform(0.02, 0.3))
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
            kills += 1
    finally:
        stop.set()
        grower.join(10)
    # A final collector run after the dust settled stores exactly what the worker reports.
    final = subprocess.run(args + ["--once"], env=env, capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr
    assert stored(db_url, "k1") == stacks
    assert kills == 3
