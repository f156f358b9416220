"""A small online shop that serves as fleetflame's demo fleet.

The code is deliberately ordinary, with the hot spots real services have: JSON serialisation,
a slow regex, a needless database load, a lock contended by threads, an occasional
pathological request, and (in version 1.4.2) a planted quadratic regression.
"""

from __future__ import annotations

GOOD_VERSION = "1.4.1"
REGRESSED_VERSION = "1.4.2"
VERSIONS = (GOOD_VERSION, REGRESSED_VERSION)
