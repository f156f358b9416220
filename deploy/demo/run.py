"""Runs fleetflame's demo (``make demo``): python deploy/demo/run.py [--duration S] ..."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demoshop.fleet import main  # noqa: E402 - needs the path above

if __name__ == "__main__":
    raise SystemExit(main())
