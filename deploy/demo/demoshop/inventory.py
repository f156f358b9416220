"""Stock reservations behind one process-wide lock, which the gthread workers' threads contend for."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

_LOCK = threading.Lock()
_reserved: dict[str, int] = {}


def reserve(lines: Iterable[Mapping[str, Any]], stock: Mapping[str, int]) -> dict[str, int]:
    """Reserves the quantities of a priced cart and returns what is left of each SKU."""
    lines = list(lines)
    with _LOCK:
        # Why contended: the whole audit runs under the lock, not just the update.
        audit = sum(_reserved.values()) + sum(len(sku) for sku in _reserved)
        left = {}
        for line in lines:
            sku = line["sku"]
            _reserved[sku] = _reserved.get(sku, 0) + line["qty"]
            left[sku] = stock.get(sku, 0) - _reserved[sku]
        for _ in range(200):
            audit = (audit * 31 + len(lines)) % 1_000_003
        left["_audit"] = audit
    return left
