"""Copies the JavaScript the pages need from node_modules into webui/static/vendor/.

Run by ``make setup`` after ``npm ci`` and by setup.py's build step, so an installed package
and a built wheel serve them; nothing third-party is committed. Standard library only: setup.py
loads this file by path, before any dependency is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ASSETS", "AssetError", "build_assets"]

ROOT = Path(__file__).resolve().parent.parent
VENDOR = Path(__file__).resolve().parent / "static" / "vendor"

# (file in node_modules, name in static/vendor). d3-flame-graph 5.x's UMD bundle defines the
# global `flamegraph` as a namespace whose `default` is the chart factory; 4.x defined the
# factory itself. webui/static/js/flame.js accepts both.
ASSETS = (
    ("d3/dist/d3.min.js", "d3.min.js"),
    ("d3/LICENSE", "d3.LICENSE.txt"),
    ("d3-flame-graph/dist/d3-flamegraph.umd.min.js", "d3-flamegraph.min.js"),
    ("d3-flame-graph/dist/d3-flamegraph.css", "d3-flamegraph.css"),
    ("d3-flame-graph/LICENSE", "d3-flamegraph.LICENSE.txt"),
)


class AssetError(RuntimeError):
    """The npm packages are not installed and cannot be; the message says what to run."""


def _copy_atomically(source: Path, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600: the web UI may run as another user
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def build_assets(root: Path = ROOT, vendor: Path = VENDOR, *, install: bool = True) -> list[Path]:
    """Copies the assets into ``vendor``; runs ``npm ci`` first when node_modules lacks them."""
    modules = root / "node_modules"
    missing = [src for src, _ in ASSETS if not (modules / src).is_file()]
    if missing and install and (root / "package-lock.json").is_file() and shutil.which("npm"):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=root, check=True)
        missing = [src for src, _ in ASSETS if not (modules / src).is_file()]
    if missing:
        raise AssetError(
            f"missing {', '.join(missing)} in {modules}: run 'npm ci' in {root} (needs Node.js)"
        )
    vendor.mkdir(parents=True, exist_ok=True)
    written = []
    for src, name in ASSETS:
        _copy_atomically(modules / src, vendor / name)
        written.append(vendor / name)
    return written


def main() -> int:
    """Builds the assets and reports what was written."""
    try:
        for path in build_assets():
            print(f"wrote {path.relative_to(ROOT)}")
    except (AssetError, subprocess.CalledProcessError) as exc:
        print(f"build_assets: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
