"""``fleetflame web``: serves the web UI with the development server (demos, trying it out).

In production run it under gunicorn instead: ``gunicorn 'webui:create_app()'`` with
``FLEETFLAME_WEB_CONFIG`` naming the config file (docs/webui.md).
"""

from __future__ import annotations

import argparse
import logging
import sys

from collector.store import StoreError
from sampler.settings import is_loopback, port
from webui.settings import SETTINGS, SettingsError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetflame web",
        description="Serve the fleetflame web UI (development server; use gunicorn in production).",
    )
    parser.add_argument("--config", help="TOML config file (a [web] table or top-level keys)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=port, default=8080, help="port to listen on")
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a --host other than loopback with no authentication (every profile to any "
        "host that can reach it: only behind a proxy that authenticates)",
    )
    for setting in SETTINGS:
        parser.add_argument(
            "--" + setting.name.replace("_", "-"),
            dest=setting.name,
            type=setting.type,
            default=None,
            help=f"{setting.help} (default {setting.default!r}; env {setting.env_var})".replace(
                "%", "%%"
            ),  # argparse formats help with %
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the web UI until interrupted; returns the exit status."""
    args = _parser().parse_args(argv)
    import werkzeug.serving
    from werkzeug.serving import run_simple

    # werkzeug colours its request lines whatever its output is: a log file or journald got
    # the terminal's escape codes.
    werkzeug.serving._log_add_style = sys.stderr.isatty()

    from webui import create_app

    overrides = {
        s.key: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name) is not None
    }
    try:
        app = create_app({"CONFIG_FILE": args.config, **overrides})
    except SettingsError as exc:
        print(f"fleetflame web: {exc}", file=sys.stderr)
        return 2
    exposed = not is_loopback(args.host)
    if exposed and not (app.config["AUTH_TOKEN"] or app.config["AUTH_USER"]):
        if not args.allow_unauthenticated:
            print(
                f"fleetflame web: --host {args.host} with no authentication would serve every "
                "profile to any host that can reach it: set auth_token (or auth_user and "
                "auth_password), bind to 127.0.0.1, or pass --allow-unauthenticated if a proxy "
                "in front authenticates",
                file=sys.stderr,
            )
            return 2
        print(
            f"fleetflame web: serving {args.host} with no authentication (--allow-unauthenticated)",
            file=sys.stderr,
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        app.extensions["fleetflame_db"].open()  # starts warming the stack index now
    except StoreError as exc:
        print(f"fleetflame web: {exc}", file=sys.stderr)  # each request will say so too
    print(
        f"fleetflame web UI on http://{args.host}:{args.port}/ (development server: "
        "run gunicorn 'webui:create_app()' in production)",
        file=sys.stderr,
    )
    run_simple(args.host, args.port, app, threaded=True, use_debugger=False, use_reloader=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
