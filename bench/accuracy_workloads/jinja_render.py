"""Jinja2 renders an HTML order report: loops, filters, macros, attribute access, autoescaping."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import _common

deadline = _common.start_script()

import jinja2  # noqa: E402 - the sampler starts first, as in a service

TEMPLATE = """
{%- macro money(cents) -%}{{ "%.2f"|format(cents / 100) }} EUR{%- endmacro -%}
<h1>Orders for {{ customer.name|title }}</h1>
<table>
{%- for order in orders|sort(attribute="created") %}
  <tr class="{{ loop.cycle('odd', 'even') }}">
    <td>{{ order.number }}</td><td>{{ order.created }}</td>
    <td>{{ order.lines|map(attribute="product")|join(", ")|truncate(60) }}</td>
    <td>{{ money(order.lines|sum(attribute="cents")) }}</td>
    <td>{% if order.note %}{{ order.note|e }}{% else %}-{% endif %}</td>
  </tr>
  {%- for line in order.lines if line.quantity > 1 %}
  <tr><td colspan="5">{{ line.quantity }} x {{ line.product|upper }}</td></tr>
  {%- endfor %}
{%- endfor %}
</table>
<p>{{ orders|length }} orders, {{ orders|selectattr("note")|list|length }} with notes</p>
"""


@dataclass
class Line:
    product: str
    quantity: int
    cents: int


@dataclass
class Order:
    number: str
    created: str
    lines: list[Line]
    note: str


def make_orders(count: int) -> list[Order]:
    rng = random.Random(1)
    products = ["widget", "gadget", "sprocket <b>", "flange & co", "gizmo", "doohickey"]
    return [
        Order(
            number=f"A-{i:05d}",
            created=f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            lines=[
                Line(rng.choice(products), rng.randint(1, 4), rng.randint(100, 90_000))
                for _ in range(rng.randint(1, 6))
            ],
            note=rng.choice(["", "", "leave at the door", "<script>alert(1)</script>"]),
        )
        for i in range(count)
    ]


ENVIRONMENT = jinja2.Environment(autoescape=True)
REPORT = ENVIRONMENT.from_string(TEMPLATE)
CUSTOMER = {"name": "ada lovelace"}
ORDERS = make_orders(300)


def render_once() -> str:
    return REPORT.render(customer=CUSTOMER, orders=ORDERS)


_common.write_module_map()
while time.monotonic() < deadline:
    render_once()
