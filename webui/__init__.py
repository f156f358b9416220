"""The fleetflame web UI: flamegraphs of any time window, and two windows compared.

``create_app()`` builds the Flask app; run it under gunicorn in production::

    FLEETFLAME_WEB_CONFIG=/etc/fleetflame/web.toml gunicorn -w 2 'webui:create_app()'
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask, Response, request

__all__ = ["create_app"]

STATIC = Path(__file__).resolve().parent / "static"
# Vendored scripts the pages load (copied from node_modules by webui/build_assets.py).
VENDOR_FILES = ("d3.min.js", "d3-flamegraph.min.js", "d3-flamegraph.css")
# Static files are served below a hash of their contents, so browsers keep them this long
# without asking again: a changed file comes with a new URL.
STATIC_MAX_AGE = 365 * 86400

_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """Builds the app: settings from defaults, the TOML file, ``FLEETFLAME_WEB_*``, ``config``.

    ``config`` may name the file as ``CONFIG_FILE`` and override any setting by its upper-case
    name. The app only reads the database, and never runs in debug mode.
    """
    from webui import api, auth, db, findings, history, live, pages, significance, worst
    from webui.settings import load_settings

    overrides = dict(config or {})
    config_file = overrides.pop("CONFIG_FILE", None)
    app = Flask(__name__, static_url_path=f"/static/{asset_version()}")
    app.config.update(load_settings(config_file, overrides=overrides))
    app.config["SEND_FILE_MAX_AGE_DEFAULT"] = STATIC_MAX_AGE
    app.config["DEBUG"] = False
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.json.compact = True  # type: ignore[attr-defined]
    db.init_app(app)
    auth.init_app(app)
    app.register_blueprint(pages.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(worst.bp)
    app.register_blueprint(history.bp)
    app.register_blueprint(live.bp)
    app.register_blueprint(findings.bp)
    app.register_blueprint(significance.bp)
    app.after_request(_security_headers)
    missing = [name for name in VENDOR_FILES if not (STATIC / "vendor" / name).is_file()]
    if missing:
        app.logger.warning(
            "web UI assets missing (%s): run 'make setup' or 'python -m webui.build_assets'",
            ", ".join(missing),
        )
    return app


def asset_version() -> str:
    """Returns a short hash of the static files' names and contents (hidden files, such as
    build_assets' temporary copies, left out)."""
    digest = hashlib.sha256()
    for path in sorted(STATIC.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            digest.update(path.relative_to(STATIC).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _security_headers(response: Response) -> Response:
    if request.endpoint == "static" and response.status_code == 200:
        response.cache_control.immutable = True
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response
