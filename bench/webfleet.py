"""A synthetic fleet with realistic Python frame names, written through the collector's store.

Used by bench/bench_web.py and docs/make_screenshots.py. Stacks come from random walks in a
call graph of a web shop (Flask, SQLAlchemy, Jinja2, json...), so flamegraphs look like real
ones; ``distinct`` stacks per instance are drawn with Zipf-like popularity. Version 1.4.2 has
a regression (discount rules in shop.pricing got slower) for the compare view to find.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from collector.store import SampleRow, Store

__all__ = ["CALLS", "fleet_rows", "make_stacks", "write_fleet"]

# caller -> callees; a frame without callees is a leaf.
CALLS: dict[str, list[str]] = {
    "__main__:<module>": ["gunicorn.arbiter:Arbiter.run"],
    "gunicorn.arbiter:Arbiter.run": ["gunicorn.workers.gthread:ThreadWorker.run"],
    "gunicorn.workers.gthread:ThreadWorker.run": [
        "gunicorn.workers.gthread:ThreadWorker.handle",
        "selectors:EpollSelector.select",
    ],
    "gunicorn.workers.gthread:ThreadWorker.handle": ["flask.app:Flask.wsgi_app"],
    "flask.app:Flask.wsgi_app": ["flask.app:Flask.full_dispatch_request"],
    "flask.app:Flask.full_dispatch_request": [
        "flask.app:Flask.dispatch_request",
        "flask.app:Flask.preprocess_request",
    ],
    "flask.app:Flask.preprocess_request": ["shop.auth:load_user"],
    "shop.auth:load_user": ["shop.auth:verify_token", "sqlalchemy.orm.session:Session.get"],
    "shop.auth:verify_token": ["hmac:compare_digest", "hashlib:pbkdf2_hmac"],
    "flask.app:Flask.dispatch_request": [
        "shop.views:product_page",
        "shop.views:search",
        "shop.views:checkout",
        "shop.api:list_orders",
        "shop.api:upload_image",
    ],
    "shop.views:product_page": [
        "shop.catalog:get_product",
        "jinja2.environment:Template.render",
        "shop.pricing:price_for",
    ],
    "shop.views:search": ["shop.search:query", "jinja2.environment:Template.render"],
    "shop.views:checkout": [
        "shop.pricing:apply_discounts",
        "shop.orders:create_order",
        "shop.payments:charge",
    ],
    "shop.api:list_orders": ["shop.orders:recent_orders", "json.encoder:JSONEncoder.encode"],
    "shop.api:upload_image": ["PIL.Image:Image.resize", "PIL.Image:open", "shop.storage:put"],
    "shop.catalog:get_product": ["sqlalchemy.orm.query:Query.one", "shop.cache:get"],
    "shop.search:query": ["re:compile", "shop.search:rank", "sqlalchemy.orm.query:Query.all"],
    "shop.search:rank": ["shop.search:score", "builtins:sorted"],
    "shop.search:score": ["shop.search:tokenize", "math:log"],
    "shop.search:tokenize": ["re:Pattern.findall", "str:lower"],
    "shop.pricing:price_for": ["shop.pricing:tax_for", "decimal:Decimal.quantize"],
    "shop.pricing:apply_discounts": ["shop.pricing:match_rule", "shop.pricing:price_for"],
    "shop.pricing:match_rule": ["re:Pattern.match", "shop.pricing:rule_applies"],
    "shop.pricing:rule_applies": ["datetime:datetime.now", "shop.pricing:match_rule"],
    "shop.orders:create_order": [
        "sqlalchemy.orm.session:Session.commit",
        "sqlalchemy.orm.session:Session.add",
    ],
    "shop.orders:recent_orders": ["sqlalchemy.orm.query:Query.all"],
    "shop.payments:charge": ["requests.sessions:Session.post"],
    "requests.sessions:Session.post": ["urllib3.connectionpool:HTTPConnectionPool.urlopen"],
    "urllib3.connectionpool:HTTPConnectionPool.urlopen": [
        "ssl:SSLSocket.recv",
        "socket:create_connection",
    ],
    "sqlalchemy.orm.query:Query.all": [
        "sqlalchemy.engine.base:Connection.execute",
        "sqlalchemy.orm.loading:instances",
    ],
    "sqlalchemy.orm.query:Query.one": [
        "sqlalchemy.engine.base:Connection.execute",
        "sqlalchemy.orm.loading:instances",
    ],
    "sqlalchemy.orm.session:Session.get": ["sqlalchemy.engine.base:Connection.execute"],
    "sqlalchemy.orm.session:Session.commit": ["sqlalchemy.engine.base:Connection.execute"],
    "sqlalchemy.engine.base:Connection.execute": [
        "psycopg.cursor:Cursor.execute",
        "sqlalchemy.sql.compiler:SQLCompiler.__init__",
    ],
    "sqlalchemy.orm.loading:instances": ["sqlalchemy.orm.loading:_instance"],
    "psycopg.cursor:Cursor.execute": ["psycopg.waiting:wait_conn"],
    "jinja2.environment:Template.render": ["jinja2.runtime:Context.call", "markupsafe:escape"],
    "jinja2.runtime:Context.call": ["shop.templates:format_price", "jinja2.runtime:Context.call"],
    "json.encoder:JSONEncoder.encode": ["json.encoder:JSONEncoder.iterencode"],
    "shop.storage:put": ["botocore.client:BaseClient._make_api_call"],
}
# Relative cost of each route handler: where the fleet spends its time.
_HOT = {
    "shop.views:search": 4.0,
    "shop.views:product_page": 3.0,
    "shop.api:list_orders": 2.0,
    "shop.views:checkout": 1.5,
    "shop.api:upload_image": 1.0,
}


def _walk(rng: random.Random, variety: int) -> str:
    frames = ["__main__:<module>"]
    while True:
        callees = CALLS.get(frames[-1])
        if not callees or len(frames) > 40 or rng.random() < 0.08:
            break
        if frames[-1] == "flask.app:Flask.dispatch_request":
            names = list(_HOT)
            frames.append(rng.choices(names, [_HOT[n] for n in names])[0])
        else:
            frames.append(rng.choice(callees))
    if variety:
        # Deeper, rarer paths (helpers called with many code paths): the long tail of a profile.
        for _ in range(rng.randint(1, 4)):
            module = rng.randint(0, variety // 10)
            frames.append(f"shop.lib.m{module}:helper_{rng.randint(0, variety)}")
    return ";".join(frames)


def make_stacks(rng: random.Random, count: int, variety: int = 0) -> list[str]:
    """Returns ``count`` distinct stacks; ``variety`` > 0 adds a long tail of rare helpers."""
    stacks: set[str] = set()
    tries = 0
    while len(stacks) < count:
        tries += 1
        stacks.add(_walk(rng, variety if tries > 200 else 0))
        if tries > 50 * count and not variety:
            variety = max(count, 1000)
    return sorted(stacks)


def fleet_rows(
    start: int,
    minutes: int,
    *,
    instances: int = 8,
    stacks: int = 400,
    per_minute: int = 120,
    regression_from: int | None = None,
    seed: int = 1,
) -> Iterator[list[SampleRow]]:
    """Yields the rows of each minute of a fleet: api and worker services, two versions.

    From ``regression_from`` (epoch seconds) on, instances run version 1.4.2, whose
    shop.pricing spends about three times longer.
    """
    rng = random.Random(seed)
    pool = make_stacks(rng, stacks * 2, variety=stacks)
    fleet = []
    for i in range(instances):
        own = rng.sample(pool, stacks)
        # The long tail of rare helpers is rare: most time goes to the main code paths.
        weights = [
            (0.04 if "shop.lib." in stack else 1.0) / (rank + 1) ** 0.5
            for rank, stack in enumerate(own)
        ]
        fleet.append(
            {
                "service": "api" if i % 4 else "worker",
                "host": f"web-{i // 2 + 1}",
                "instance": f"{i:04x}{rng.getrandbits(48):012x}",
                "stacks": own,
                "weights": weights,
            }
        )
    for minute in range(minutes):
        bucket = start + 60 * minute
        version = "1.4.2" if regression_from is not None and bucket >= regression_from else "1.4.1"
        rows = []
        for inst in fleet:
            counts: dict[str, int] = {}
            for stack in rng.choices(inst["stacks"], inst["weights"], k=per_minute):
                boost = 8 if version == "1.4.2" and "shop.pricing" in stack else 1
                counts[stack] = counts.get(stack, 0) + boost
            labels = {"version": version, "env": "prod"}
            rows += [
                SampleRow(
                    bucket, "cpu", inst["service"], inst["host"], inst["instance"], labels, s, c
                )
                for s, c in counts.items()
            ]
        yield rows


def write_fleet(url: str, start: int, minutes: int, **kwargs: object) -> Store:
    """Creates the schema and writes the fleet; returns the store (close it)."""
    store = Store(url)
    store.migrate()
    for rows in fleet_rows(start, minutes, **kwargs):  # type: ignore[arg-type]
        store.write(rows)
    return store
