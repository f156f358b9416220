"""The HTML pages: the flamegraph view and the compare view; all data comes from the API."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from urllib.parse import urlencode

from flask import Blueprint, Response, current_app, jsonify, render_template, request
from werkzeug.datastructures import MultiDict

from collector.store import StoreError
from webui import db

__all__ = ["bp"]

bp = Blueprint("pages", __name__)

# Our modules import each other as `import { ... } from './name.js'`.
_IMPORT = re.compile(r"^import\b[^;\n]*?\bfrom\s+'\./([\w-]+\.js)'", re.MULTILINE)
# The parameters of the page's URL the flamegraph's request passes on: as graphQuery() in
# state.js, which makes the later requests (keep the two alike).
_GRAPH_PARAMS = ("from", "to", "mode", "service", "host", "instance", "label", "max_nodes")


@functools.cache
def _modules_of(js_folder: Path, entry: str) -> tuple[str, ...]:
    """Returns the modules ``entry`` imports, directly or not: the page lists them all as
    modulepreload links, so the browser fetches them at once rather than one import level
    after another."""
    found: set[str] = set()
    pending = [entry]
    while pending:
        name = pending.pop()
        for imported in _IMPORT.findall((js_folder / name).read_text(encoding="utf-8")):
            if imported not in found and imported != entry:
                found.add(imported)
                pending.append(imported)
    return tuple(sorted(found))


def _graph_query(args: MultiDict[str, str], default_window: str) -> str:
    """Returns the query of the flamegraph request a page with these arguments makes first.

    The page names it in a preload link, so the browser starts it as soon as it reads the
    page's head, while the scripts that draw the answer load (and asks for the same URL then).
    """
    pairs = [(key, value) for key in _GRAPH_PARAMS for value in args.getlist(key) if value]
    if not args.get("from"):
        pairs.insert(0, ("from", default_window))
    return urlencode(pairs)


def render_view(view: str, **context: str) -> str:
    """Renders a view's page (its template, with its script's modules preloaded)."""
    js_folder = Path(current_app.static_folder or "", "js")
    preload = _modules_of(js_folder, f"{view}.js")
    return render_template(f"{view}.html", view=view, preload=preload, **context)


def add_view(blueprint: Blueprint, rule: str, view: str) -> None:
    """Serves a view's page at ``rule`` as the blueprint's ``page`` endpoint (its data comes
    from the blueprint's API)."""
    blueprint.add_url_rule(rule, "page", functools.partial(render_view, view), methods=["GET"])


@bp.get("/")
def flamegraph() -> str:
    """The flamegraph of a window, with its timeline, filters, search and function table."""
    query = _graph_query(request.args, current_app.config["DEFAULT_WINDOW"])
    return render_view("flamegraph", graph_query=query)


@bp.get("/compare")
def compare() -> str:
    """Two windows or two label values as a differential flamegraph and a table of changes."""
    return render_view("compare")


@bp.get("/healthz")
def healthz() -> tuple[Response, int]:
    """Tells a load balancer whether the UI can read its database."""
    try:
        database = db.get_db()
        database.query.resolution(0, 1)
    except StoreError as exc:
        # Open to anyone (see webui/auth.py): the cause, which may name the database's host
        # and user, goes to the log only.
        current_app.logger.warning("health check: %s", exc)
        return jsonify(status="unavailable", error="the database cannot be read (see the log)"), 503
    return jsonify(status="ok"), 200
