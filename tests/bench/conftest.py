"""bench/ is a folder of scripts, not a package: its modules are imported as top-level ones."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
