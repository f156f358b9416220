"""The HTML pages: the flamegraph view and the compare view; all data comes from the API."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from flask import Blueprint, Response, current_app, jsonify, render_template

from collector.store import StoreError
from webui import db

__all__ = ["bp"]

bp = Blueprint("pages", __name__)

# Our modules import each other as `import { ... } from './name.js'`.
_IMPORT = re.compile(r"^import\b[^;\n]*?\bfrom\s+'\./([\w-]+\.js)'", re.MULTILINE)
# The modules each page runs: its own, and for the flamegraph the one starting its requests.
_ENTRIES = {"flamegraph": ("prefetch.js", "flamegraph.js"), "compare": ("compare.js",)}


@functools.cache
def modules_of(js_folder: Path, entries: tuple[str, ...]) -> tuple[str, ...]:
    """Returns the modules ``entries`` import, directly or not: the page lists them all as
    modulepreload links, so the browser fetches them at once rather than one import level
    after another (three round trips before the flamegraph's request could start)."""
    found: dict[str, None] = {}
    pending = list(entries)
    while pending:
        name = pending.pop()
        for imported in _IMPORT.findall((js_folder / name).read_text(encoding="utf-8")):
            if imported not in found and imported not in entries:
                found[imported] = None
                pending.append(imported)
    return tuple(sorted(found))


def _render(view: str) -> str:
    js_folder = Path(current_app.static_folder or "", "js")
    return render_template(f"{view}.html", view=view, preload=modules_of(js_folder, _ENTRIES[view]))


@bp.get("/")
def flamegraph() -> str:
    """The flamegraph of a window, with its timeline, filters, search and function table."""
    return _render("flamegraph")


@bp.get("/compare")
def compare() -> str:
    """Two windows or two label values as a differential flamegraph and a table of changes."""
    return _render("compare")


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
