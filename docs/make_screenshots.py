"""Takes the screenshots in docs/ of the flamegraph and compare views (make screenshots).

Writes three hours of the synthetic web-shop fleet (bench/webfleet.py, version 1.4.2 with a
pricing regression in the last hour) to a temporary SQLite file, serves the real app and
photographs it in headless Chromium.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from headless import launch_chromium  # noqa: E402
from werkzeug.serving import WSGIRequestHandler, make_server  # noqa: E402

from webfleet import write_fleet  # noqa: E402
from webui import create_app  # noqa: E402

VIEWS = {
    "screenshot-flamegraph.png": "/?from=-3h&service=api&search=pricing",
    "screenshot-compare.png": (
        "/compare?from=-3h&service=api&a_label=version:1.4.1&b_label=version:1.4.2"
    ),
}


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: object, **kwargs: object) -> None:
        pass


def main(out_dir: str = "docs") -> int:
    """Writes the screenshots into ``out_dir``."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/fleet.db"
        now = int(time.time()) // 60 * 60
        write_fleet(url, now - 3 * 3600, 180, regression_from=now - 3600).close()
        app = create_app({"DATABASE_URL": url})
        httpd = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_QuietHandler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{httpd.server_port}"
        try:
            with sync_playwright() as playwright:
                browser = launch_chromium(playwright)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                for name, path in VIEWS.items():
                    page.goto(base + path)
                    page.wait_for_selector("body[data-state=ready]", timeout=60_000)
                    page.wait_for_selector("#chart .d3-flame-graph-label", timeout=60_000)
                    # The compare page's statistics come after its graph (and colour it again).
                    page.wait_for_function(
                        "() => !document.getElementById('significance') || "
                        "document.getElementById('significance').textContent.includes('judged')",
                        timeout=60_000,
                    )
                    # The table of functions comes after the graph (its own request).
                    page.wait_for_selector("table.sortable tbody tr", timeout=60_000)
                    page.wait_for_timeout(600)  # d3-flame-graph's label transition
                    target = Path(out_dir) / name
                    tmp_png = target.with_suffix(".tmp.png")
                    page.screenshot(path=str(tmp_png))
                    os.replace(tmp_png, target)
                    print(f"wrote {target}")
                browser.close()
        finally:
            httpd.shutdown()
            httpd.server_close()
            app.extensions["fleetflame_db"].close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
