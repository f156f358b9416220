"""The middleware tests share the process's recorder: each starts with a fresh one. They start
their servers as bench/bench_middleware.py does (bench/appservers.py): bench/ is importable."""

import sys
from pathlib import Path

import pytest

from sampler._requests import recorder

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)


@pytest.fixture(autouse=True)
def fresh_recorder():
    recorder.reset()
    yield recorder
    recorder.reset()  # its thread stopped: no fleetflame- thread is left behind
