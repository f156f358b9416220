"""The write path at scale: a first round larger than the buffer is written whole, in pieces."""

from __future__ import annotations

import pytest
from pollhelpers import CapturedLog, Fleet, collector_settings, stored, wait_until

from collector.service import Collector

STACKS = [f"app:main;app:handle;app:leaf{k}" for k in range(5)]


def fleet_stacks(i: int) -> list[tuple[int, str, int]]:
    return [(0, stack, 1 + (i + k) % 7) for k, stack in enumerate(STACKS)]


@pytest.fixture(scope="module")
def fleet():
    f = Fleet(1000, fleet_stacks)
    yield f
    f.close()


def test_a_first_round_over_the_buffer_is_written_whole_in_pieces(db_url, fleet):
    logs = CapturedLog()
    expected = {stack: 0 for stack in STACKS}
    for i in range(len(fleet.addresses)):
        for _, stack, count in fleet_stacks(i):
            expected[stack] += count
    # 1,000 targets x 5 new stacks: 5,000 rows in the first round, five times the buffer.
    c = Collector(
        collector_settings(db_url, fleet.addresses, buffer_max_rows=1000, poll_interval=30.0)
    )
    c.start()
    try:
        wait_until(
            lambda: c.metrics.get("fleetflame_collector_rows_written_total") == 5000,
            timeout=240,  # about 5 s; a loaded shared machine once took 90
            what="every row written",
        )
    finally:
        c.stop()
        logs.close()
    assert stored(db_url) == expected
    assert c.metrics.get("fleetflame_collector_dropped_rows_total") == 0
    assert not logs.matching("write buffer full")
    # Polls waited for room (back-pressure) rather than overfill the buffer.
    assert c.writer.most_rows <= 1000 + len(STACKS)
    assert c.buffered_rows() == 0


def test_one_cycle_at_a_time_also_writes_a_round_over_the_buffer(sqlite_url, fleet):
    c = Collector(collector_settings(sqlite_url, fleet.addresses[:300], buffer_max_rows=400))
    c.migrate()
    try:
        report = c.poll_cycle()
    finally:
        c.stop()
    assert (report.ok, report.rows, report.written) == (300, 1500, True)
    assert c.metrics.get("fleetflame_collector_dropped_rows_total") == 0
    assert sum(stored(sqlite_url).values()) == report.samples
