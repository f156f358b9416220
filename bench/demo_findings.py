"""How soon the collector's scheduled comparison finds the demo's planted regression by itself.

Runs the demo headless (``deploy/demo/run.py``: its fleet, load, collector and web UI on a
fresh SQLite store under a scratch folder) for ``--duration`` seconds with the rolling deploy of
1.4.2 at ``--deploy-after``, then reads the findings it recorded: for each, how long after the
deploy it was found, the function, the change and what was compared. The planted regression
is ``demoshop.pricing:_find_line`` (and its caller ``merge_cart_lines``) in 1.4.2; issue 15 asks
for it within 5 minutes of the deploy. Then the compare view's answer for two adjacent whole
minutes around the deploy (issue 14): the planted functions' shares in each.

    python bench/demo_findings.py                   # 7 minutes, deploy after 150 s
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANTED = ("demoshop.pricing:_find_line", "demoshop.pricing:merge_cart_lines")


def adjacent_minutes(url: str, deploy: float, started: float) -> None:
    """The compare view's answer for two adjacent whole minutes, through the web app's API:
    the last one before the deploy began (A) and the next (B, which holds the deploy)."""
    sys.path.insert(0, str(ROOT))
    from webui import create_app

    after = int(deploy) // 60 * 60
    before = after - 60
    if before < started:
        print("no whole minute of 1.4.1 before the deploy: run with a later --deploy-after")
        return
    app = create_app({"DATABASE_URL": url})
    query = {"service": "demo-shop", "a_from": before, "a_to": before + 60}
    query.update(b_from=after, b_to=after + 60, limit=10_000)
    data = app.test_client().get("/api/diff", query_string=query).json
    app.extensions["fleetflame_db"].close()
    print(f"adjacent minutes {before - int(deploy):+d} s and {after - int(deploy):+d} s from the "
          f"deploy: A {data['total_a']} samples, B {data['total_b']}")  # fmt: skip
    for change in data["functions"]:
        if change["name"] in PLANTED:
            print(f"  {change['name']}: self {100 * change['self_a']:.2f}% -> "
                  f"{100 * change['self_b']:.2f}%, total {100 * change['total_a']:.2f}% -> "
                  f"{100 * change['total_b']:.2f}%")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=420)
    parser.add_argument("--deploy-after", type=float, default=150)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as var:
        command = [
            sys.executable, str(ROOT / "deploy/demo/run.py"), "--duration", str(args.duration),
            "--deploy-after", str(args.deploy_after), "--base-port", "auto", "--var-dir", var,
            "--fresh",
        ]  # fmt: skip
        started = time.time()
        print(f"demo for {args.duration:.0f} s, deploy after {args.deploy_after:.0f} s", flush=True)
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
            return 1
        fleet = json.loads((Path(var) / "fleet.json").read_text())
        deploy = fleet.get("deployed_at") or started + args.deploy_after
        with sqlite3.connect(Path(var) / "fleetflame.db") as db:
            rows = db.execute(
                "SELECT found_at, function, kind, change, ci_low, ci_high, q, compared "
                "FROM findings ORDER BY found_at"
            ).fetchall()
        adjacent_minutes(f"sqlite:///{Path(var) / 'fleetflame.db'}", deploy, started)
    print(f"{len(rows)} findings (found: seconds after the deploy; change in points)")
    first = None
    for found_at, function, kind, change, low, high, q, compared in rows:
        after = found_at - deploy
        planted = function in PLANTED
        if planted and first is None:
            first = after
        print(f"  {after:6.0f} s  {function} ({kind}) +{change:.1f} [{low:.1f}, {high:.1f}] "
              f"q {q:.2g}  {compared}{'  <- planted' if planted else ''}")  # fmt: skip
    if first is None:
        print("the planted regression was not found")
        return 1
    verdict = "ok" if first <= 300 else "MISSED"
    print(f"planted regression found {first:.0f} s after the deploy (target <= 300 s: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
