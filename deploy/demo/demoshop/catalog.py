"""The shop's SQLite database: a product catalogue and an order queue for the job worker."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

_WORDS = (
    "oak walnut steel linen wool cotton brass copper matte gloss compact deluxe portable "
    "ergonomic vintage modern rustic classic premium eco travel kitchen garden office "
    "outdoor lamp chair table kettle mug blanket backpack bottle knife board shelf rug"
).split()

_SCHEMA = """
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    sku TEXT NOT NULL,
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    price_cents INTEGER NOT NULL,
    stock INTEGER NOT NULL,
    tags TEXT NOT NULL
);
CREATE TABLE reviews (
    id INTEGER PRIMARY KEY,
    product_id INTEGER NOT NULL,
    stars INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    created REAL NOT NULL,
    payload TEXT NOT NULL,
    processed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX orders_pending ON orders (processed, id);
CREATE INDEX reviews_product ON reviews (product_id);
"""


def connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Opens the shop database, waiting rather than failing while another process writes."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 30000")
    # A demo queue, not a ledger: no fsync per order (WAL keeps the file consistent anyway).
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def ensure_catalog(path: str | os.PathLike[str], products: int = 300, seed: int = 42) -> Path:
    """Creates the database with a deterministic catalogue unless it exists; returns its path.

    The file is built under a temporary name and renamed into place, so a worker that starts
    at the same moment never opens a half-written catalogue.
    """
    target = Path(path)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".catalog-", suffix=".db", dir=target.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp)
        conn.executescript(_SCHEMA)
        rng = random.Random(seed)
        rows, reviews = [], []
        for pid in range(1, products + 1):
            words = rng.sample(_WORDS, 3)
            description = " ".join(rng.choice(_WORDS) for _ in range(40))
            tags = json.dumps(sorted(set(rng.sample(_WORDS, 4))))
            rows.append(
                (
                    pid,
                    f"SKU-{pid:06d}",
                    " ".join(words).title(),
                    description,
                    rng.randint(199, 49_999),
                    rng.randint(0, 500),
                    tags,
                )
            )
            for _ in range(rng.randint(0, 6)):
                body = " ".join(rng.choice(_WORDS) for _ in range(25))
                reviews.append((pid, rng.randint(1, 5), body))
        conn.executemany("INSERT INTO products VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        conn.executemany("INSERT INTO reviews (product_id, stars, body) VALUES (?, ?, ?)", reviews)
        conn.commit()
        conn.execute("PRAGMA journal_mode = WAL")
        conn.close()
        if not target.exists():
            os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_all_products(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Loads the whole catalogue with its reviews, one query per product (the classic N+1)."""
    products = [dict(row) for row in conn.execute("SELECT * FROM products ORDER BY id")]
    for product in products:
        product["reviews"] = [
            dict(r)
            for r in conn.execute(
                "SELECT stars, body FROM reviews WHERE product_id = ?", (product["id"],)
            )
        ]
        product["tags"] = json.loads(product["tags"])
    return products


def enqueue_order(conn: sqlite3.Connection, order: dict[str, Any]) -> int:
    """Queues an order for the background job worker and returns its id."""
    cur = conn.execute(
        "INSERT INTO orders (created, payload) VALUES (?, ?)", (time.time(), json.dumps(order))
    )
    return int(cur.lastrowid or 0)


def claim_orders(conn: sqlite3.Connection, limit: int = 20) -> list[tuple[int, dict[str, Any]]]:
    """Takes up to ``limit`` pending orders off the queue, marking them processed."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        rows = conn.execute(
            "SELECT id, payload FROM orders WHERE processed = 0 ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        conn.executemany("UPDATE orders SET processed = 1 WHERE id = ?", [(r[0],) for r in rows])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return [(int(r[0]), json.loads(r[1])) for r in rows]
