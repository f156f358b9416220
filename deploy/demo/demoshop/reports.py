"""A sales report that is cheap from cache and about a hundred times slower on a cache miss."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def sales_report(products: Sequence[dict[str, Any]], cache_miss: bool) -> dict[str, Any]:
    """Summarises prices and review stars; a cache miss recomputes it for every product."""
    # A tenth of the catalogue once, or all of it ten times over: a hundredfold difference.
    scope = products if cache_miss else products[: max(1, len(products) // 10)]
    rounds = 10 if cache_miss else 1
    per_tag: dict[str, list[int]] = {}
    for _ in range(rounds):
        per_tag.clear()
        for product in scope:
            for tag in product["tags"]:
                per_tag.setdefault(tag, []).append(product["price_cents"])
            stars = [r["stars"] for r in product["reviews"]]
            product_score = statistics.fmean(stars) if stars else 0.0
            per_tag.setdefault("_score", []).append(int(product_score * 100))
    return {
        tag: {"n": len(v), "median": statistics.median(v), "max": max(v)}
        for tag, v in sorted(per_tag.items())
    }
