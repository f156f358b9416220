"""Cart pricing, the code that changes between versions 1.4.1 and 1.4.2.

Version 1.4.2 made SKU matching tolerant of case and stray spaces, and in doing so made merging
duplicate cart lines quadratic: for every line it scans (and normalises) the lines merged so
far. That is the planted regression the compare view shows (``demoshop.pricing:_find_line``
appears under ``merge_cart_lines``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from demoshop import GOOD_VERSION, VERSIONS

Line = dict[str, Any]


def merge_cart_lines(lines: Iterable[Mapping[str, Any]], version: str) -> list[Line]:
    """Merges lines with the same SKU, summing quantities, the way ``version`` does it."""
    if version not in VERSIONS:
        raise ValueError(f"unknown shop version {version!r}; expected one of {VERSIONS}")
    if version == GOOD_VERSION:
        return _merge_with_index(lines)
    return _merge_by_scanning(lines)


def _merge_with_index(lines: Iterable[Mapping[str, Any]]) -> list[Line]:
    merged: dict[str, Line] = {}
    for line in lines:
        existing = merged.get(line["sku"])
        if existing is None:
            merged[line["sku"]] = dict(line)
        else:
            existing["qty"] += line["qty"]
    return list(merged.values())


def _merge_by_scanning(lines: Iterable[Mapping[str, Any]]) -> list[Line]:
    merged: list[Line] = []
    for line in lines:
        existing = _find_line(merged, line["sku"])
        if existing is None:
            merged.append(dict(line))
        else:
            existing["qty"] += line["qty"]
    return merged


def _find_line(lines: list[Line], sku: str) -> Line | None:
    wanted = sku.strip().upper()
    for line in lines:
        if line["sku"].strip().upper() == wanted:
            return line
    return None


def price_cart(
    lines: Iterable[Mapping[str, Any]],
    prices: Mapping[str, int],
    version: str,
    discount_percent: int = 0,
) -> dict[str, Any]:
    """Prices a cart: merges duplicate lines, then sums price times quantity with a discount."""
    merged = merge_cart_lines(lines, version)
    subtotal = 0
    for line in merged:
        try:
            unit = prices[line["sku"]]
        except KeyError:
            raise ValueError(f"unknown SKU {line['sku']!r} in cart") from None
        line["unit_cents"] = unit
        line["total_cents"] = unit * line["qty"]
        subtotal += line["total_cents"]
    discount = subtotal * discount_percent // 100
    return {
        "lines": merged,
        "subtotal_cents": subtotal,
        "discount_cents": discount,
        "total_cents": subtotal - discount,
    }
