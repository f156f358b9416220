"""Storage of time-bucketed samples in SQLite or PostgreSQL (see docs/storage.md)."""

from __future__ import annotations

from collector.store.errors import (
    InvalidQuery,
    InvalidRow,
    StackHashCollision,
    StoreError,
    StoreUnavailable,
)
from collector.store.rows import Cursor, CursorUpdate, Limits, SampleRow
from collector.store.store import Store
from collector.store.tiers import DEFAULT_ROLLUPS

__all__ = [
    "DEFAULT_ROLLUPS",
    "Cursor",
    "CursorUpdate",
    "InvalidQuery",
    "InvalidRow",
    "Limits",
    "SampleRow",
    "StackHashCollision",
    "Store",
    "StoreError",
    "StoreUnavailable",
]
