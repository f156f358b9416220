"""The overhead budget counts the sampler's own work only."""

import time

import pytest

from sampler._budget import OverheadBudget

pytestmark = pytest.mark.parallel


def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def own_work(budget):
    return budget._busy + sum(busy for _, busy, _ in budget.history)


def test_host_work_done_inside_a_measured_block_is_not_the_samplers():
    # The native drain frees the host's code objects it kept for its records: that work
    # would have run on the host's thread anyway, so it is taken off the drain's.
    budget = OverheadBudget(0.01, 1.0, arm=lambda interval: None)
    with budget.measure() as block:
        burn(0.02)  # the sampler's own
        started = time.thread_time()
        burn(0.05)  # the host's, done for it
        block.exclude(time.thread_time() - started)
    assert 0.015 <= own_work(budget) <= 0.035


def test_host_work_of_one_block_takes_nothing_off_another():
    # Two blocks at once (the drain thread's, waiting for the lock, and an endpoint's
    # catch-up): each takes off only what it did itself.
    budget = OverheadBudget(0.01, 1.0, arm=lambda interval: None)
    with budget.measure():
        with budget.measure() as other:
            other.exclude(1.0)
        burn(0.02)
    assert 0.015 <= own_work(budget) <= 0.035
