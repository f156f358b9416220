"""Optional authentication: a shared bearer token, or HTTP basic, checked before every request.

With neither configured the UI is open, which suits a reverse proxy that authenticates
(docs/webui.md shows one). ``/healthz`` stays open for load balancers.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from flask import Flask, Response, current_app, jsonify, request

__all__ = ["init_app"]

_OPEN_PATHS = ("/healthz",)


def init_app(app: Flask) -> None:
    """Registers the check when a token or a user and password are configured."""
    if app.config["AUTH_TOKEN"] or app.config["AUTH_USER"]:
        app.before_request(_check)


def _same(given: str, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())


def _allowed(header: str) -> bool:
    token = current_app.config["AUTH_TOKEN"]
    user, password = current_app.config["AUTH_USER"], current_app.config["AUTH_PASSWORD"]
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer":
        return _same(credentials.strip(), token)
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        given_user, _, given_password = decoded.partition(":")
        # A browser can send the token as the password of any user name.
        if _same(given_password, token):
            return True
        return _same(given_user, user) & _same(given_password, password)
    return False


def _check() -> Response | None:
    if request.path in _OPEN_PATHS or _allowed(request.headers.get("Authorization", "")):
        return None
    response = jsonify(error="authentication required: a bearer token or HTTP basic")
    response.status_code = 401
    response.headers["WWW-Authenticate"] = 'Basic realm="fleetflame", charset="UTF-8"'
    return response
