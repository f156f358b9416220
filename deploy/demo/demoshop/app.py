"""The shop's Flask app, served by gunicorn in the demo fleet (``demoshop.app:create_app()``).

Nothing here imports the sampler to start it: gunicorn's ``post_fork`` hook in
``deploy/gunicorn.conf.py`` does that from environment variables, as in production. The app
only adds the request middleware, the one line a service adds (docs/worst-cases.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import sqlite3
import threading
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask, Response, g, jsonify, request

from demoshop import GOOD_VERSION, VERSIONS, catalog, inventory, pricing, reports, search

ROUTES = ("/api/products", "/api/search", "/api/checkout", "/api/report")
REPORT_MISS_RATE = 0.01
MAX_CART_LINES = 1000


class BadRequest(ValueError):
    """A request the shop refuses, with a message for the client."""


def _with_request_middleware(wsgi_app: Callable[..., Iterable[bytes]]) -> Any:
    """The request middleware around the app: each request timed per route (the worst-cases
    page's latency percentiles and slowest requests) and its samples labelled with the route.
    Without the sampler installed, the app as it is."""
    try:
        import sampler.middleware
    except ImportError:
        return wsgi_app
    return sampler.middleware.WSGIMiddleware(wsgi_app)


def create_app(db_path: str | None = None, version: str | None = None) -> Flask:
    """Builds the shop app for ``version`` on the SQLite catalogue at ``db_path``."""
    version = version or os.environ.get("DEMO_VERSION", GOOD_VERSION)
    if version not in VERSIONS:
        raise ValueError(f"DEMO_VERSION={version!r} is not one of {', '.join(VERSIONS)}")
    db_path = db_path or os.environ.get("DEMO_DB", os.path.join("var", "demo", "shop.db"))
    catalog.ensure_catalog(db_path)

    app = Flask("demoshop")
    app.config.update(DB_PATH=db_path, SHOP_VERSION=version)
    app.wsgi_app = _with_request_middleware(app.wsgi_app)  # type: ignore[method-assign]
    cache: dict[str, Any] = {}
    cache_lock = threading.Lock()

    def db() -> sqlite3.Connection:
        if "db" not in g:
            g.db = catalog.connect(app.config["DB_PATH"])
        return g.db

    def cached_products() -> list[dict[str, Any]]:
        with cache_lock:
            if "products" not in cache:
                cache["products"] = catalog.load_all_products(db())
                cache["prices"] = {p["sku"]: p["price_cents"] for p in cache["products"]}
                cache["stock"] = {p["sku"]: p["stock"] for p in cache["products"]}
            return cache["products"]

    @app.teardown_appcontext
    def close_db(_exc: BaseException | None) -> None:
        conn = g.pop("db", None)
        if conn is not None:
            conn.close()

    @app.errorhandler(BadRequest)
    def bad_request(exc: BadRequest) -> tuple[Response, int]:
        return jsonify(error=str(exc)), 400

    @app.get("/")
    def index() -> Response:
        return jsonify(service="demo-shop", version=version, endpoints=list(ROUTES))

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify(status="ok", version=version, pid=os.getpid())

    @app.get("/api/products")
    def products() -> Response:
        page = _int_arg("page", 1, 1, 10_000)
        per_page = _int_arg("per_page", 20, 1, 100)
        # Why slow: the whole catalogue (with reviews, one query per product) is loaded and
        # serialised on every request, only to page through it and compute an ETag.
        everything = catalog.load_all_products(db())
        etag = hashlib.sha1(
            json.dumps(everything, sort_keys=True, indent=2, default=str).encode()
        ).hexdigest()
        start = (page - 1) * per_page
        body = json.dumps(
            {"page": page, "items": everything[start : start + per_page], "total": len(everything)},
            sort_keys=True,
            indent=2,
        )
        return Response(body, mimetype="application/json", headers={"ETag": etag})

    @app.get("/api/search")
    def search_products() -> Response:
        try:
            hits = search.find_products(cached_products(), request.args.get("q", ""))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return jsonify(hits=hits)

    @app.post("/api/checkout")
    def checkout() -> tuple[Response, int]:
        lines, discount = _parse_cart(request.get_json(silent=True))
        cached_products()
        try:
            priced = pricing.price_cart(lines, cache["prices"], version, discount)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        left = inventory.reserve(priced["lines"], cache["stock"])
        order_id = catalog.enqueue_order(db(), {"version": version, **priced})
        return jsonify(
            order=order_id,
            total_cents=priced["total_cents"],
            low_stock=sum(v < 0 for v in left.values()),
        ), 201

    @app.get("/api/report")
    def report() -> Response:
        miss = request.args.get("refresh") == "1" or random.random() < REPORT_MISS_RATE
        return jsonify(cache_miss=miss, report=reports.sales_report(cached_products(), miss))

    return app


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    with contextlib.suppress(ValueError):
        value = int(raw)
        if low <= value <= high:
            return value
    raise BadRequest(f"{name} must be an integer from {low} to {high}, not {raw!r}")


def _parse_cart(body: Any) -> tuple[list[dict[str, Any]], int]:
    if not isinstance(body, dict) or not isinstance(body.get("lines"), list):
        raise BadRequest('the body must be JSON like {"lines": [{"sku": "SKU-000001", "qty": 1}]}')
    lines = body["lines"]
    if not 1 <= len(lines) <= MAX_CART_LINES:
        raise BadRequest(f"a cart has 1 to {MAX_CART_LINES} lines, not {len(lines)}")
    for i, line in enumerate(lines):
        if not (
            isinstance(line, dict)
            and isinstance(line.get("sku"), str)
            and isinstance(line.get("qty"), int)
            and 0 < line["qty"] <= 1000
        ):
            raise BadRequest(f"line {i} needs a string sku and an integer qty from 1 to 1000")
    discount = body.get("discount", 0)
    if not isinstance(discount, int) or not 0 <= discount <= 100:
        raise BadRequest("discount must be an integer percentage from 0 to 100")
    return [{"sku": line["sku"], "qty": line["qty"]} for line in lines], discount
