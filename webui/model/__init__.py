"""The web UI's pure model: pruned and differential trees, function tables, time parsing.

Nothing here does I/O or reads a clock: callers pass the data and the current time in.
"""

from __future__ import annotations

from .flametree import PRUNED, DiffTree, FlameTree, diff_tree, flame_tree
from .functions import FunctionChange, rank_changes, top_functions
from .timewindow import choose_step, fill_timeline, parse_duration, parse_time

__all__ = [
    "PRUNED",
    "DiffTree",
    "FlameTree",
    "FunctionChange",
    "choose_step",
    "diff_tree",
    "fill_timeline",
    "flame_tree",
    "parse_duration",
    "parse_time",
    "rank_changes",
    "top_functions",
]
