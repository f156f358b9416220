"""Fleet tiers: reads without host or instance filters, on SQLite and PostgreSQL."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa
from storehelpers import T0, row, sparse_rows, store_fixture, write_all  # noqa: F401

from collector.query import Filters, Query
from collector.store import Store, fleet
from collector.store.tiers import DAY

HOUR = 3600
NOW = T0 + 9 * DAY + 7 * HOUR + 1234
SERVICES = ("api", "batch")
HOSTS = ("web-1", "web-2", "web-3")


def fill(store: Store, days: int = 9, seed: int = 5) -> None:
    """Writes samples of two services on three hosts, two routes and two intervals."""
    instances = [
        {
            "host": host,
            "instance": f"{host}-i",
            "service": SERVICES[i % 2],
            "interval": 0.02 if host == "web-3" else 0.01,
        }
        for i, host in enumerate(HOSTS)
    ]
    stacks = ["m;a", "m;a;b", "m;c", "m;c;d;e", "m;a;b;a;b", "m;x%3By"]
    rows = sparse_rows(NOW - days * DAY, NOW, 60 * 11, instances, stacks=stacks, seed=seed)
    write_all(store, rows, 3000)


def everywhere(filters: Filters) -> Filters:
    """The same samples, read from the instance tiers (a filter on every host)."""
    return Filters(filters.mode, filters.services, HOSTS, (), filters.labels)


FILTERS = [
    Filters(),
    Filters(services=("api",)),
    Filters(labels=(("route", "/a"),)),
    Filters(services=("batch",), labels=(("route", "/b"), ("route", "/a"))),
    Filters(mode="wall"),
    Filters(labels=(("route", "/nowhere"),)),
]


def windows(rng: random.Random) -> list[tuple[int, int]]:
    hour_aligned = [
        (NOW - NOW % HOUR - rng.randrange(1, 24 * 9) * HOUR, NOW - NOW % HOUR - h * HOUR)
        for h in range(3)
    ]
    recent = [(NOW - rng.randrange(60, 20 * HOUR), NOW - rng.randrange(0, 50)) for _ in range(4)]
    return hour_aligned + recent + [(T0, NOW + 60)]


def test_fleet_reads_equal_instance_reads(store: Store) -> None:
    fill(store)
    q = Query(store)
    rng = random.Random(1)
    cases = [(w, f) for w in windows(rng) for f in FILTERS]
    before = [q.stack_counts(*w, f) for w, f in cases]
    store.rollup(NOW)
    plans = {(s.width, s.fleet) for w in windows(rng) for s in q.plan(*w)}
    assert {(60, True), (600, True), (3600, True), (6 * HOUR, True), (DAY, True)} <= plans
    for (window, filters), first in zip(cases, before, strict=True):
        fleet_read = q.stack_counts(*window, filters)
        assert fleet_read == q.stack_counts(*window, everywhere(filters)), (window, filters)
        if window[0] > NOW - DAY + HOUR:  # minute rows still there: exactly what was written
            assert fleet_read == first, (window, filters)
        assert q.timeline(*window, filters, step=HOUR) == q.timeline(
            *window, everywhere(filters), step=HOUR
        )


def test_mixed_intervals_are_counted_at_the_finest(store: Store) -> None:
    store.write(
        [
            row(T0, "m;a", 3, interval=0.01),
            row(T0, "m;a", 2, host="web-2", instance="w2", interval=0.05),
            row(T0, "m;b", 1, host="web-2", instance="w2", interval=0.05),
        ]
    )
    q = Query(store)
    mixed = q.stack_counts(T0, T0 + 60)
    assert mixed.interval == 0.01 and mixed.intervals == (0.01, 0.05)
    names = q.stack_names(mixed.counts)
    # 2 samples of 50 ms are 10 samples of 10 ms: every count stands for the same time.
    assert {names[s]: c for s, c in mixed.counts.items()} == {"m;a": 13, "m;b": 5}
    slow = q.read(T0, T0 + 60, Filters(hosts=("web-2",)))
    assert slow.interval == 0.05 and slow.counts == {"m;a": 2, "m;b": 1}
    assert slow.seconds == pytest.approx(0.15)
    assert q.timeline(T0, T0 + 60) == [(T0, 18)]
    store.rollup(T0 + 2 * DAY)
    assert q.stack_counts(T0, T0 + 60) == mixed
    assert q.timeline(T0, T0 + 60) == [(T0, 18)]


def test_late_rows_reach_the_fleet_tiers_once(store: Store) -> None:
    fill(store, days=2)
    store.rollup(NOW)
    q = Query(store)
    late = NOW - DAY - 5 * HOUR - NOW % 60
    window = (late - late % DAY, late - late % DAY + DAY)
    assert [s.fleet for s in q.plan(*window)] == [True]
    before = q.profile(*window)
    store.write([row(late, "late;stack", 9, host="web-2", instance="web-2-i", service="batch")])
    assert q.profile(*window) == {**before, "late;stack": 9}
    assert q.profile(*window, Filters(services=("batch",)))["late;stack"] == 9
    store.rollup(NOW + 600)
    assert q.profile(*window) == {**before, "late;stack": 9}


def test_fleet_tiers_are_folded_for_a_database_from_before_them(store: Store) -> None:
    fill(store)
    store.rollup(NOW)
    q = Query(store)
    rng = random.Random(2)
    cases = [(w, f) for w in windows(rng) for f in FILTERS[:4]]
    expected = [q.stack_counts(*w, everywhere(f)) for w, f in cases]
    with store.engine.write_transaction() as conn:  # as migration 0003 leaves an old database
        conn.execute(sa.text("DELETE FROM fleet_samples"))
        conn.execute(sa.text("UPDATE fleet_tiers SET rolled_to = 0, kept_from = 0"))
    assert not any(s.fleet for w, _ in cases for s in q.plan(*w))
    assert [q.stack_counts(*w, f) for w, f in cases] == expected
    store.rollup(NOW + 60)
    assert any(s.fleet and s.width == 600 for w, _ in cases for s in q.plan(*w))
    assert [q.stack_counts(*w, f) for w, f in cases] == expected


def test_expiry_and_retention_of_fleet_rows(store: Store) -> None:
    fill(store, days=3)
    store.rollup(NOW)
    with store.engine.sa_engine.connect() as conn:
        oldest = dict(
            conn.execute(
                sa.text("SELECT width, min(bucket) FROM fleet_samples GROUP BY width")
            ).all()
        )
    assert oldest[60] >= NOW - DAY - 2 * HOUR  # minute rows kept a day (to the hour)
    assert oldest[3600] < NOW - 2 * DAY
    store.apply_retention(NOW + 28 * DAY)  # 30 days kept: from 2 days before NOW
    with store.engine.sa_engine.connect() as conn:
        left = conn.execute(sa.text("SELECT min(bucket) FROM fleet_samples")).scalar()
    assert left == NOW - 2 * DAY - (NOW - 2 * DAY) % HOUR
    assert Query(store).profile(T0, NOW) == Query(store).profile(T0, NOW, everywhere(Filters()))
    store.apply_retention(NOW + 31 * DAY)
    with store.engine.sa_engine.connect() as conn:
        count = lambda table: conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()  # noqa: E731
        assert count("fleet_samples") == count("fleet_series") == count("series") == 0


def test_packed_rows_round_trip() -> None:
    counts = {-(2**63): 1, 2**63 - 1: 10**12, 0: 5, 12345: 7}
    packed_ids, packed_counts, total = fleet.encode(counts)
    ids, values = fleet.decode(packed_ids, packed_counts)
    assert dict(zip(ids, values, strict=True)) == counts and total == sum(counts.values())
    assert list(ids) == sorted(counts) and list(fleet.decode_ids(packed_ids)) == sorted(counts)
    assert len(packed_ids) == 8 * len(counts)
    summed: dict[int, int] = {}
    fleet.sum_rows(summed, [(packed_ids, packed_counts), fleet.encode({0: 1, 9: 2})[:2]])
    assert summed == {**counts, 0: 6, 9: 2}


def test_labels_naming_an_instance_are_left_out_of_fleet_series(store: Store) -> None:
    # As the Kubernetes discovery labels targets: each pod's own pod and node labels.
    rows = [
        row(T0, "m;a", n + 1, host=f"10.0.0.{n}", instance=f"i{n}", labels=labels)
        for n, labels in enumerate(
            [
                {"pod": "api-1", "node": "n1", "version": "1"},
                {"pod": "api-2", "node": "n1", "version": "1"},
                {"pod": "api-3", "node": "n2", "version": "2"},
            ]
        )
    ]
    store.write(rows)
    store.rollup(T0 + DAY)
    with store.engine.sa_engine.connect() as conn:
        fleets = conn.execute(sa.text("SELECT count(*) FROM fleet_series")).scalar()
    assert fleets == 2  # one per version, not one per pod
    q = Query(store)
    by_version = Filters(labels=(("version", "1"),))
    assert all(s.fleet for s in q.plan(T0, T0 + 3600, filters=by_version))
    assert q.profile(T0, T0 + 3600, by_version) == {"m;a": 3}
    one_pod = Filters(labels=(("pod", "api-3"),))  # read from the instance tiers
    assert not any(s.fleet for s in q.plan(T0, T0 + 3600, filters=one_pod))
    assert q.profile(T0, T0 + 3600, one_pod) == {"m;a": 3}
    assert q.profile(T0, T0 + 3600, Filters(labels=(("node", "n1"),))) == {"m;a": 3}
    assert q.label_values(T0, T0 + 3600)["pod"] == ["api-1", "api-2", "api-3"]
