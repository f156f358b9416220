"""The HTML pages: the flamegraph view and the compare view; all data comes from the API."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify, render_template

from collector.store import StoreError
from webui import db

__all__ = ["bp"]

bp = Blueprint("pages", __name__)


@bp.get("/")
def flamegraph() -> str:
    """The flamegraph of a window, with its timeline, filters, search and function table."""
    return render_template("flamegraph.html", view="flamegraph")


@bp.get("/compare")
def compare() -> str:
    """Two windows or two label values as a differential flamegraph and a table of changes."""
    return render_template("compare.html", view="compare")


@bp.get("/healthz")
def healthz() -> tuple[Response, int]:
    """Tells a load balancer whether the UI can read its database."""
    try:
        database = db.get_db()
        database.query.resolution(0, 1)
    except StoreError as exc:
        current_app.logger.warning("health check: %s", exc)
        return jsonify(status="unavailable", error=str(exc)), 503
    return jsonify(status="ok"), 200
