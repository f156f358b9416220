"""The Firefox Profiler's Gecko profile format (https://profiler.firefox.com, "Load a profile").

One thread, one process. A merged window has no order of its own, so its samples are laid out
stack after stack, each at the sampler's real interval: the timeline's length is the profile's
CPU (or wall) time, and every count, the call tree and the flame graph are exact; the order
along the timeline is not the order things ran in. Frames are ``module:qualname`` with the line
when one was recorded (``--lineno``), in a "Python" category.

The tables are self-describing (each has its ``schema``: column name to index), as the Gecko
profiler writes them; ``meta.version`` names the format's version, from which the Firefox
Profiler upgrades a profile to its current one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sampler.profile import split_frames, split_line_number, unescape_frame
from webui.exports.base import Export, ExportInfo

__all__ = ["GECKO", "gecko_document", "render_gecko"]

VERSION = 24
CATEGORIES = [
    {"name": "Other", "color": "grey", "subcategories": ["Other"]},
    {"name": "Python", "color": "yellow", "subcategories": ["Other"]},
]
PYTHON = 1
# More samples than this make a file the Firefox Profiler loads slowly: ask for a shorter window.
MAX_SAMPLES = 2_000_000


def gecko_document(counts: Mapping[str, int], info: ExportInfo) -> dict[str, Any]:
    """Returns the Gecko profile of merged folded counts (see the module's note on time)."""
    total = sum(count for count in counts.values() if count > 0)
    if total > MAX_SAMPLES:
        raise ValueError(
            f"{total:,} samples are more than the {MAX_SAMPLES:,} a Gecko profile holds here: "
            "export a shorter window, or use speedscope or pprof"
        )
    strings: list[str] = []
    string_index: dict[str, int] = {}
    frames: list[list[Any]] = []
    frame_index: dict[str, int] = {}
    stacks: list[list[Any]] = []
    stack_index: dict[tuple[int | None, int], int] = {}
    samples: list[list[Any]] = []
    interval_ms = info.interval * 1000

    def string(text: str) -> int:
        if text not in string_index:
            string_index[text] = len(strings)
            strings.append(text)
        return string_index[text]

    def frame(name: str) -> int:
        if name not in frame_index:
            function, line = split_line_number(name)
            frame_index[name] = len(frames)
            # location, relevantForJS, innerWindowID, implementation, line, column, category,
            # subcategory
            frames.append(
                [string(unescape_frame(function)), False, 0, None, line or None, None, PYTHON, 0]
            )
        return frame_index[name]

    time = 0.0
    for stack, count in sorted(counts.items()):
        if count <= 0 or not stack:
            continue
        prefix: int | None = None
        for name in split_frames(stack):
            key = (prefix, frame(name))
            if key not in stack_index:
                stack_index[key] = len(stacks)
                stacks.append([prefix, key[1]])
            prefix = stack_index[key]
        for _ in range(count):
            samples.append([prefix, round(time, 3), 0])
            time += interval_ms
    thread = {
        "name": f"{info.title} ({info.mode})",
        "processType": "default",
        "processName": "fleetflame",
        "registerTime": 0,
        "unregisterTime": None,
        "tid": 0,
        "pid": "0",
        "markers": {
            "schema": {
                "name": 0,
                "startTime": 1,
                "endTime": 2,
                "phase": 3,
                "category": 4,
                "data": 5,
            },
            "data": [],
        },
        "samples": {"schema": {"stack": 0, "time": 1, "eventDelay": 2}, "data": samples},
        "frameTable": {
            "schema": {
                "location": 0,
                "relevantForJS": 1,
                "innerWindowID": 2,
                "implementation": 3,
                "line": 4,
                "column": 5,
                "category": 6,
                "subcategory": 7,
            },
            "data": frames,
        },
        "stackTable": {"schema": {"prefix": 0, "frame": 1}, "data": stacks},
        "stringTable": strings,
    }
    return {
        "meta": {
            "version": VERSION,
            "interval": interval_ms,
            "startTime": info.start * 1000,
            "shutdownTime": None,
            "processType": 0,
            "product": f"fleetflame: {info.title}, {info.mode} time",
            "stackwalk": 0,
            "abi": "",
            "misc": "",
            "oscpu": "",
            "platform": "",
            "toolkit": "",
            "categories": CATEGORIES,
            "markerSchema": [],
        },
        "libs": [],
        "pausedRanges": [],
        "processes": [],
        "threads": [thread],
    }


def render_gecko(counts: Mapping[str, int], info: ExportInfo) -> bytes:
    """Renders the Gecko profile as compact JSON."""
    return json.dumps(gecko_document(counts, info), separators=(",", ":")).encode("utf-8")


GECKO = Export("gecko", "application/json", "gecko.json", render_gecko)
