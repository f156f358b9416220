"""black (the mypyc-compiled wheel) reformats the standard library's argparse.py, again and again.

Nearly all of black's time is in compiled code, which has no Python frames: a profiler that
reads frames (py-spy, fleetflame's python engine) can only charge it to the Python function
that called into it, ``format_once``.
"""

from __future__ import annotations

import argparse as source_module
import os
import time

import _common

deadline = _common.start_script()

import black  # noqa: E402 - the sampler starts first, as in a service

SOURCE = open(source_module.__file__, encoding="utf-8").read()
MODE = black.Mode()


def format_once() -> str:
    return black.format_str(SOURCE, mode=MODE)


_common.add_extra(
    lambda: {
        "black": black.__version__,
        "black_compiled": bool(getattr(black, "COMPILED", False)),
        "black_module_file": os.path.basename(black.__file__ or ""),
        "source_lines": SOURCE.count("\n"),
    }
)
_common.write_module_map()
while time.monotonic() < deadline:
    format_once()
