"""``python -m webui``: the same as ``fleetflame web``."""

from __future__ import annotations

import sys

from webui.cli import main

sys.exit(main())
