"""Fixtures of the collector's polling tests (helpers that are not fixtures: pollhelpers.py)."""

from __future__ import annotations

import pytest
from pollhelpers import CapturedLog, DocServer


@pytest.fixture
def logs():
    """The collector's log lines, formatted as key=value."""
    captured = CapturedLog()
    yield captured
    captured.close()


@pytest.fixture
def servers():
    """Makes /profile.json servers (``servers(doc)``), all closed after the test."""
    made: list[DocServer] = []

    def make(doc=None):
        made.append(DocServer(doc))
        return made[-1]

    yield make
    for server in made:
        server.close()
