"""``python -m attach``: the same as ``fleetflame attach``."""

from __future__ import annotations

import sys

from attach.cli import main

if __name__ == "__main__":
    sys.exit(main())
