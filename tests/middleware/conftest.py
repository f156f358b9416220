"""The middleware tests share the process's recorder: each starts with a fresh one."""

import pytest

from sampler._requests import recorder


@pytest.fixture(autouse=True)
def fresh_recorder():
    recorder.reset()
    yield recorder
    recorder.reset()  # its thread stopped: no fleetflame- thread is left behind
