"""The collector's logs: what a start tells at INFO."""

import logging

import pytest

from collector.logs import setup_logging


@pytest.fixture
def restored_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quiet = {
        name: logging.getLogger(name).level for name in ("apscheduler", "alembic.runtime.plugins")
    }
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in quiet.items():
        logging.getLogger(name).setLevel(old)


def test_a_start_tells_migrations_not_each_alembic_plugin(restored_logging):
    setup_logging("info")
    assert logging.getLogger("alembic.runtime.migration").isEnabledFor(logging.INFO)
    assert not logging.getLogger("alembic.runtime.plugins").isEnabledFor(logging.INFO)
    assert logging.getLogger("alembic.runtime.plugins").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("apscheduler.scheduler").isEnabledFor(logging.INFO)
