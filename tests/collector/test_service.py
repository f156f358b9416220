"""The collector service against real HTTP targets and a real store, on both engines."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest
import requests
from pollhelpers import (
    DocServer,
    closed_port,
    collector_settings,
    make_doc,
    migrated_collector,
    stored,
    wait_until,
)

from collector.service import Collector


@contextmanager
def running(url, servers, release, **settings):
    """A started collector polling ``servers``; at the end, lets the held ones go, then stops all."""
    c = Collector(collector_settings(url, [s.address for s in servers], **settings))
    c.start()
    try:
        yield c
    finally:
        release.set()
        c.stop()
        for s in servers:
            s.close()


@pytest.fixture
def server():
    s = DocServer(make_doc([(0, "m;a", 5), (0, "m;b", 2)]))
    yield s
    s.close()


def test_cycles_store_exact_deltas_and_a_restart_resumes_from_the_cursors(db_url, server, logs):
    c = migrated_collector(db_url, [server.address])
    try:
        report = c.poll_cycle()
        assert (report.ok, report.failed, report.rows, report.samples) == (1, 0, 2, 7)
        assert report.written
        server.doc = make_doc([(0, "m;a", 9), (0, "m;b", 2), (0, "m;c", 1)])
        assert c.poll_cycle().samples == 5
        assert c.poll_cycle().rows == 0  # nothing changed
    finally:
        c.stop()
    assert stored(db_url, "a1") == {"m;a": 9, "m;b": 2, "m;c": 1}
    # A new collector process on the same database: same snapshot adds nothing...
    c = migrated_collector(db_url, [server.address])
    try:
        assert c.poll_cycle().samples == 0
        server.doc = make_doc([(0, "m;a", 12), (0, "m;b", 2), (0, "m;c", 1)])
        assert c.poll_cycle().samples == 3
        # ...and a restarted worker (new instance id) counts from zero.
        server.doc = make_doc([(0, "m;a", 4)], instance="b2")
        assert c.poll_cycle().samples == 4
    finally:
        c.stop()
    assert stored(db_url, "a1") == {"m;a": 12, "m;b": 2, "m;c": 1}
    assert stored(db_url, "b2") == {"m;a": 4}
    assert logs.matching("new instance", f"target={server.address}", "instance=b2")


def test_labels_reach_the_rows(sqlite_url, server):
    from collector.query import Filters, Query
    from collector.store import Store

    server.doc = make_doc(
        [(1, "m;a", 5)],
        label_sets=[{}, {"route": "/x"}],
        labels={"service": "api", "host": "web-3", "version": "1"},
    )
    c = migrated_collector(sqlite_url, [server.address], target_labels={"environment": "prod"})
    try:
        c.poll_cycle()
    finally:
        c.stop()
    store = Store(sqlite_url)
    try:
        now = int(time.time())
        values = Query(store).label_values(now - 7200, now + 7200, Filters())
    finally:
        store.close()
    assert values["service"] == ["api"] and values["host"] == ["web-3"]
    assert values["route"] == ["/x"] and values["environment"] == ["prod"]


def test_the_samplers_interval_reaches_the_store(db_url, server):
    from collector.query import Query
    from collector.store import Store

    server.doc["interval"] = 0.005  # a worker sampling at 200 Hz
    c = migrated_collector(db_url, [server.address])
    try:
        c.poll_cycle()
    finally:
        c.stop()
    store = Store(db_url)
    try:
        now = int(time.time())
        profile = Query(store).read(now - 7200, now + 7200)
    finally:
        store.close()
    assert profile.interval == 0.005 and profile.counts == {"m;a": 5, "m;b": 2}


def test_closed_ports_in_a_range_are_debug_not_failures(sqlite_url, server, logs):
    port = closed_port()
    c = migrated_collector(
        sqlite_url, [f"127.0.0.1:{port}-{port}", f"127.0.0.1:{closed_port()}", server.address]
    )
    try:
        report = c.poll_cycle()
    finally:
        c.stop()
    # The range's closed port is counted apart, in the report and the round's log line.
    assert (report.targets, report.ok, report.failed, report.closed) == (3, 1, 1, 1)
    assert logs.matching("poll cycle done", "targets=3 ok=1 failed=1 closed=1")
    assert logs.matching("level=debug", "range port closed", f"target=127.0.0.1:{port}")
    assert not logs.matching("level=warning", f"target=127.0.0.1:{port}")
    assert (
        c.metrics.get(
            "fleetflame_collector_target_failures_total",
            target=f"127.0.0.1:{port}",
            reason="refused",
        )
        == 0
    )
    assert logs.matching("level=warning", "poll failed", "reason=refused")


def test_discovery_file_changes_are_picked_up(sqlite_url, server, tmp_path):
    other = DocServer(make_doc([(0, "x;y", 3)], instance="o1"))
    sd = tmp_path / "targets.json"
    sd.write_text(json.dumps([{"targets": [server.address]}]))
    c = migrated_collector(sqlite_url, [], target_files=[str(sd)])
    try:
        assert c.poll_cycle().targets == 1
        tmp = tmp_path / "targets.json.tmp"
        tmp.write_text(json.dumps([{"targets": [server.address, other.address]}]))
        tmp.replace(sd)
        report = c.poll_cycle()
        assert (report.targets, report.samples) == (2, 3)
    finally:
        c.stop()
        other.close()
    assert stored(sqlite_url, "o1") == {"x;y": 3}


def test_a_target_that_leaves_and_returns_resumes_from_its_stored_cursor(sqlite_url, tmp_path):
    server = DocServer(make_doc([(0, "m;a", 5)], instance="r1"))
    sd = tmp_path / "targets.json"

    def listed(*addresses):
        tmp = tmp_path / "targets.json.tmp"
        tmp.write_text(json.dumps([{"targets": list(addresses)}]))
        tmp.replace(sd)

    listed(server.address)
    c = migrated_collector(sqlite_url, [], target_files=[str(sd)])
    try:
        assert c.poll_cycle().samples == 5
        listed()  # gone from the fleet: its state is dropped, its cursor stays stored
        assert c.poll_cycle().targets == 0
        assert server.address not in c.rounds.states
        server.doc = make_doc([(0, "m;a", 9)], instance="r1")
        listed(server.address)
        assert c.poll_cycle().samples == 4  # not 9: counted from the stored cursor
    finally:
        c.stop()
        server.close()
    assert stored(sqlite_url, "r1") == {"m;a": 9}


def test_scheduled_collector_serves_health_and_metrics(sqlite_url, server):
    c = Collector(
        collector_settings(
            sqlite_url, [server.address], poll_interval=0.3, health_listen="127.0.0.1:0"
        )
    )
    c.start()
    try:
        wait_until(
            lambda: c.metrics.get("fleetflame_collector_rows_written_total") == 2,
            what="first write",
        )
        health = requests.get(c.health_url + "/healthz", timeout=5)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["database_up"] is True
        server.doc = make_doc([(0, "m;a", 8), (0, "m;b", 2)])
        wait_until(
            lambda: c.metrics.get("fleetflame_collector_samples_written_total") == 10,
            what="second write",
        )
        text = requests.get(c.health_url + "/metrics", timeout=5).text
    finally:
        c.stop()
    assert "# TYPE fleetflame_collector_polls_total counter" in text
    assert 'fleetflame_collector_polls_total{result="ok"}' in text
    assert "fleetflame_collector_rows_written_total 3" in text
    assert "fleetflame_collector_buffered_rows 0" in text
    assert 'fleetflame_collector_fetch_seconds_bucket{le="+Inf"}' in text
    assert f'fleetflame_collector_target_up{{target="{server.address}"}} 1' in text
    assert stored(sqlite_url, "a1") == {"m;a": 8, "m;b": 2}


@pytest.mark.alone
def test_a_hanging_and_a_dripping_target_never_delay_the_others(sqlite_url, logs):
    import statistics
    import threading

    from pollhelpers import drip, hang_mid_response

    release = threading.Event()
    healthy = [DocServer(make_doc([(0, "m;a", 5)], instance=f"h{i}")) for i in range(4)]
    hanging = DocServer(make_doc([(0, "s", 1)], instance="s1"))
    hanging.behaviour = hang_mid_response(release)
    dripping = DocServer(make_doc([(0, "d", 1)], instance="d1"))
    dripping.behaviour = drip(release)
    interval = 1.0
    # Each slow target holds its poll 3 s (read timeout, fetch deadline): three intervals.
    servers = (hanging, dripping, *healthy)
    with running(
        sqlite_url, servers, release, poll_interval=interval, read_timeout=3.0, fetch_deadline=3.0
    ) as c:
        wait_until(lambda: min(len(s.times) for s in healthy) >= 9, timeout=30, what="9 polls")
    gaps = [b - a for s in healthy for a, b in zip(s.times[1:], s.times[2:], strict=False)]
    # Every healthy target was polled every interval, within 10%, while the slow ones were
    # stuck (before: every 3 s, the slow targets' timeout, whatever the interval).
    assert abs(statistics.median(gaps) - interval) <= 0.1 * interval, gaps
    assert max(gaps) < 1.5 * interval, gaps
    # The slow targets were not asked again while their poll was in flight (3 s): skipped.
    for slow in (hanging, dripping):
        assert min(b - a for a, b in zip(slow.times, slow.times[1:], strict=False)) > 2.9, (
            slow.times
        )
    assert c.metrics.get("fleetflame_collector_skipped_polls_total") >= 4
    assert logs.matching("skipped this round")
    assert logs.matching("poll cycle overran the interval")
    assert logs.matching("poll failed", f"target={hanging.address}", "reason=timeout")
    assert logs.matching("poll failed", f"target={dripping.address}", "reason=timeout")


@pytest.mark.alone
def test_more_slow_targets_than_threads_never_starve_the_healthy_ones(sqlite_url, logs):
    import statistics
    import threading

    from pollhelpers import drip_head

    release = threading.Event()
    healthy = [DocServer(make_doc([(0, "m;a", 5)], instance=f"h{i}")) for i in range(3)]
    slow = [DocServer(make_doc([(0, "s", 1)], instance=f"s{i}")) for i in range(3)]
    for server in slow:
        server.behaviour = drip_head(release)
    interval = 1.0
    # Three targets that hold their poll until the 3 s deadline, and a pool of two threads:
    # before, they took every thread and the healthy targets waited for one, round after round.
    with running(
        sqlite_url,
        (*slow, *healthy),
        release,
        poll_interval=interval,
        poll_concurrency=2,
        read_timeout=3.0,
        fetch_deadline=3.0,
    ):
        wait_until(lambda: min(len(s.times) for s in healthy) >= 10, timeout=40, what="10 polls")
    # After the first round, which learns which targets are slow (they took both threads).
    settled = [[t for t in s.times if t > healthy[0].times[0] + 3.5] for s in healthy]
    gaps = [b - a for times in settled for a, b in zip(times, times[1:], strict=False)]
    assert abs(statistics.median(gaps) - interval) <= 0.1 * interval, gaps
    assert max(gaps) < 1.6 * interval, gaps
    # Every slow target was still tried again, in turn.
    assert all(len(s.times) >= 2 for s in slow), [s.times for s in slow]


@pytest.mark.alone
def test_a_fleet_that_timed_out_once_is_polled_again_within_a_round(sqlite_url):
    import threading

    from pollhelpers import drip_head

    release = threading.Event()
    servers = [DocServer(make_doc([(0, "m;a", 5)], instance=f"t{i}")) for i in range(6)]
    for server in servers:
        server.behaviour = drip_head(release)
    with running(
        sqlite_url,
        servers,
        release,
        poll_interval=1.0,
        poll_concurrency=2,
        read_timeout=1.0,
        fetch_deadline=1.0,
    ) as c:
        # Every target times out once (a network blip), then all answer at once.
        wait_until(lambda: len(c.rounds._slow) == 6, timeout=30, what="each to time out")
        for server in servers:
            server.behaviour = "ok"
        release.set()
        healed = time.monotonic()
        wait_until(lambda: all(len(s.times) >= 2 for s in servers), timeout=30, what="polls")
    # All six within about a round (one slow poll at a time, each followed at once by the
    # next): before, one a round was polled, the others skipped until their turn (6 rounds).
    assert max(s.times[1] for s in servers) - healed < 2.5


def test_polls_after_the_first_ask_only_for_what_changed(sqlite_url, server, logs):
    server.doc["generation"] = 50
    c = migrated_collector(sqlite_url, [server.address])
    try:
        c.poll_cycle()
        server.doc = make_doc([(0, "m;a", 7)], now=server.doc["time"] + 10)
        server.doc.update(generation=90, since=50)
        c.poll_cycle()
        assert server.paths == ["/profile.json", "/profile.json?since=50&instance=a1"]
        assert stored(sqlite_url) == {"m;a": 7, "m;b": 2}
        # An answer for a snapshot the collector does not hold: refused, then read whole.
        server.doc.update(generation=120, since=100)
        assert c.poll_cycle().failed == 1
        assert logs.matching("not the snapshot the collector holds")
        server.doc = make_doc([(0, "m;a", 8), (0, "m;b", 2)])
        server.doc["generation"] = 130
        c.poll_cycle()
        assert server.paths[-1] == "/profile.json"
        assert stored(sqlite_url) == {"m;a": 8, "m;b": 2}
    finally:
        c.stop()


def test_a_target_the_store_refuses_is_set_aside_and_the_others_are_written(db_url, logs):
    from collector.store.rows import Limits as StoreLimits

    good = DocServer(make_doc([(0, "m;a", 5)], instance="g1"))
    bad = DocServer(make_doc([(0, "m;b", 2), (0, "m;" + "x" * 40, 3)], instance="b1"))
    c = migrated_collector(db_url, [good.address, bad.address])
    try:
        c.store.limits = StoreLimits(max_stack=30)  # one of the bad target's stacks is too long
        report = c.poll_cycle()
        assert report.written
        assert logs.matching("store refused a batch")
        assert logs.matching("store refused a target's delta", f"target={bad.address}")
        assert not logs.matching("store refused a target's delta", f"target={good.address}")
        assert stored(db_url, "g1") == {"m;a": 5}
        assert stored(db_url, "b1") == {}
        # The bad target counts again from what the store holds for it (nothing): once its
        # snapshot can be stored, none of its samples are lost or counted twice.
        bad.doc = make_doc([(0, "m;b", 6)], instance="b1")
        good.doc = make_doc([(0, "m;a", 7)], instance="g1")
        assert c.poll_cycle().written
        assert c.poll_cycle().rows == 0
    finally:
        c.stop()
        good.close()
        bad.close()
    assert stored(db_url, "g1") == {"m;a": 7}
    assert stored(db_url, "b1") == {"m;b": 6}
