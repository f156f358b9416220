"""The regressions the collector's scheduled comparison found (issue 15): a page and its API.

``GET /api/findings`` (the common window and ``service`` filter; 100 newest first) and the
``/findings`` page, each finding with its change, interval, q-value, what was compared and a
link to the comparison.
"""

from __future__ import annotations

import sqlalchemy as sa
from flask import Blueprint, Response, jsonify, request

from collector.store import schema
from webui import api, db, pages
from webui.api import _describe, _selection
from webui.params import parse_int

__all__ = ["bp"]

bp = Blueprint("findings", __name__)
api.json_errors(bp)
pages.add_view(bp, "/findings", "findings")

COLUMNS = (
    "found_at", "service", "function", "kind", "a_share", "b_share", "change", "ci_low",
    "ci_high", "q", "compared", "a_from", "a_to", "b_from", "b_to", "a_label", "b_label",
    "link", "sent",
)  # fmt: skip


@bp.get("/api/findings")
def findings() -> Response:
    """The newest findings of the window, newest first."""
    selection = _selection()
    limit = parse_int(request.args, "limit", 100, 1, 1000)
    table = schema.findings
    where = (table.c.found_at >= selection.start) & (table.c.found_at < selection.end)
    if selection.services:
        where &= table.c.service.in_(selection.services)
    with db.read_connection("reading findings") as conn:
        rows = conn.execute(
            sa.select(table).where(where).order_by(table.c.found_at.desc()).limit(limit)
        ).mappings()
        found = [{name: row[name] for name in COLUMNS} for row in rows]
    return jsonify(selection=_describe(selection), findings=found)
