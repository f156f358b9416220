"""The named exceptions the store raises, so callers can tell bad input from an outage."""

from __future__ import annotations

__all__ = ["InvalidQuery", "InvalidRow", "StackHashCollision", "StoreError", "StoreUnavailable"]


class StoreError(Exception):
    """Something went wrong storing or reading profiles; the message says what."""


class InvalidRow(StoreError, ValueError):
    """A sample row or cursor update was refused before anything was written."""

    def __init__(self, message: str, *, index: int | None = None) -> None:
        super().__init__(message if index is None else f"row {index}: {message}")
        self.index = index


class StoreUnavailable(StoreError):
    """The database cannot be reached or is busy: nothing was written, retry later."""


class StackHashCollision(StoreError):
    """Two different stacks hashed to the same id; the write was rolled back."""


class InvalidQuery(StoreError, ValueError):
    """A query's window, filters or step are malformed."""
