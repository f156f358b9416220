"""The web UI's pure model: pruned and differential trees, function tables, and the time
parsing of the profile core (sampler.profile), re-exported.

Nothing here does I/O or reads a clock: callers pass the data, the current time, and the
function that reads stack names (StackIndex) in.
"""

from __future__ import annotations

from sampler.profile import choose_step, fill_timeline, parse_duration, parse_time

from .flametree import (
    PRUNED,
    DiffTree,
    FlameTree,
    SortedStacks,
    diff_tree,
    diff_tree_sorted,
    flame_tree,
    flame_tree_sorted,
)
from .functions import FunctionChange, FunctionSamples, rank_changes, top_functions
from .stackindex import StackIndex

__all__ = [
    "PRUNED",
    "DiffTree",
    "FlameTree",
    "FunctionChange",
    "FunctionSamples",
    "SortedStacks",
    "StackIndex",
    "choose_step",
    "diff_tree",
    "diff_tree_sorted",
    "fill_timeline",
    "flame_tree",
    "flame_tree_sorted",
    "parse_duration",
    "parse_time",
    "rank_changes",
    "top_functions",
]
