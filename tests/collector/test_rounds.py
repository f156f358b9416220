"""The rounds' handling of slow targets (those whose last poll timed out), step by step: a
poller that runs each poll when the test says, a real store and writer, and a clock of the
test's. Slow targets' polls hold half the pool at most; the others wait for one to end."""

from __future__ import annotations

import json

import pytest
from pollhelpers import make_doc

from collector.health import Metrics
from collector.poller import PollResult
from collector.rounds import Rounds
from collector.store import Store
from collector.targets import Target
from collector.writer import Writer
from sampler.profile import Limits, decode_document

TARGETS = [Target("127.0.0.1", 9000 + i) for i in range(4)]


class SteppedPoller:
    """Takes polls (two threads' worth, as a pool of two) and runs them when asked; refuses
    new ones once closed, as a shut-down pool does."""

    concurrency = 2

    def __init__(self) -> None:
        self.waiting: list = []
        self.closed = False

    def submit(self, target, query, then):
        if self.closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        self.waiting.append((target, then))

    def answer(self, reason: str = "ok") -> Target:
        target, then = self.waiting.pop(0)
        doc = make_doc([(0, "m;a", 5)], instance=f"i{target.port}") if reason == "ok" else None
        profile = decode_document(json.dumps(doc).encode(), Limits()) if doc else None
        then(PollResult(target, profile, reason, "" if doc else reason, 0.1, 10))
        return target


@pytest.fixture
def rounds(sqlite_url):
    now = [6000.0]
    store = Store(sqlite_url)
    store.migrate()
    poller = SteppedPoller()
    writer = Writer(store, Metrics(), max_rows=10_000, retry_seconds=1, on_refused=lambda t: None)
    made = Rounds(
        poller=poller,  # type: ignore[arg-type]
        writer=writer,
        store=store,
        metrics=Metrics(),
        limits=Limits(),
        bucket_seconds=60,
        poll_interval=1.0,
        clock=lambda: now[0],
    )
    made.start(TARGETS)
    while poller.waiting:  # a first round in which every target timed out
        poller.answer("timeout")
    yield made, poller, writer, now
    store.close()


def test_slow_polls_hold_half_the_pool_and_the_next_starts_as_one_ends(rounds):
    made, poller, _, _ = rounds
    current = made.start(TARGETS)
    assert len(poller.waiting) == 1 and len(made._slow_waiting) == 3
    for left in (3, 2, 1, 0):  # each answers at once now: the next starts in the same round
        poller.answer()
        assert len(poller.waiting) == (1 if left else 0)
    assert current.wait(5).ok == 4 and not made._slow


def test_a_waiting_slow_poll_counts_in_the_bucket_it_was_polled_in(rounds):
    made, poller, writer, now = rounds
    made.start(TARGETS)
    buckets = []
    for _ in range(4):
        now[0] += 200  # each took its deadline: 800 s for the four
        poller.answer()
        buckets.append(writer._queue[-1][1].bucket)  # the part just handed to the writer
    # The first was polled with its round; each after it when the one before it ended.
    assert buckets == [6000, 6180, 6360, 6600]


def test_waiting_targets_that_left_the_fleet_are_not_polled(rounds):
    made, poller, _, _ = rounds
    first = made.start(TARGETS)
    made.start(TARGETS[:1])  # the other three left (a scale-down) while waiting
    polled = [poller.answer("timeout")] + [poller.answer() for _ in list(poller.waiting)]
    assert {target.address for target in polled} <= {TARGETS[0].address}
    first.wait(5)  # its round is over: the three were dropped, not left waiting
    assert not made.in_flight()


def test_stopping_ends_the_waiting_polls_and_their_round(rounds):
    made, poller, _, _ = rounds
    current = made.start(TARGETS)
    made.close()  # the collector stops: what waits is not polled
    poller.closed = True
    poller.answer("timeout")  # the running one ends after the pool shut down
    report = current.wait(5)
    assert report is not None and report.failed == 1 and not made.in_flight()
