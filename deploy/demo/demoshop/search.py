"""Product search with a slow regex: a pattern built per request with a backtracking prefix."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

_TERM = re.compile(r"[a-z0-9]{2,20}")


def parse_terms(query: str) -> list[str]:
    """Splits a search query into lower-case terms; raises ValueError when there are none."""
    terms = _TERM.findall(query.lower())
    if not terms:
        raise ValueError("the search query needs at least one word of 2 to 20 letters or digits")
    return terms[:5]


def find_products(
    products: Iterable[Mapping[str, Any]], query: str, limit: int = 20
) -> list[dict[str, Any]]:
    """Returns products whose description mentions every term, with the matches highlighted."""
    terms = parse_terms(query)
    # Why slow: a lazy ".*?" before every term makes each search quadratic in the description,
    # and the pattern is rebuilt for every query (the real service had one regex per filter).
    pattern = re.compile("".join(rf"(?=.*?\b{re.escape(t)}\w*)" for t in terms) + r".*", re.S)
    highlight = re.compile("|".join(rf"\b{re.escape(t)}\w*" for t in terms), re.I)
    hits = []
    for product in products:
        text = f"{product['name']} {product['description']}".lower()
        if pattern.match(text):
            hits.append(
                {
                    "sku": product["sku"],
                    "name": product["name"],
                    "snippet": highlight.sub(lambda m: f"**{m.group()}**", text[:200]),
                }
            )
            if len(hits) >= limit:
                break
    return hits
