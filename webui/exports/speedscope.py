"""speedscope's JSON file format: one "sampled" profile over a shared frames table.

See https://www.speedscope.app/file-format-schema.json. Weights are the seconds each stack's
samples stand for (its count times the profile's interval), so speedscope shows times.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sampler.profile import split_frames, unescape_frame
from webui.exports.base import Export, ExportInfo

__all__ = ["SPEEDSCOPE", "render_speedscope", "speedscope_document"]

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def speedscope_document(counts: Mapping[str, int], info: ExportInfo) -> dict[str, Any]:
    """Returns the speedscope document: each distinct stack is one weighted sample."""
    index: dict[str, int] = {}
    frames: list[dict[str, str]] = []
    samples: list[list[int]] = []
    weights: list[float] = []
    total = 0
    for stack, count in sorted(counts.items()):
        if count <= 0 or not stack:
            continue
        total += count
        sample = []
        for frame in split_frames(stack):
            i = index.get(frame)
            if i is None:
                i = index[frame] = len(frames)
                frames.append({"name": unescape_frame(frame)})
            sample.append(i)
        samples.append(sample)
        weights.append(_seconds(count, info.interval))
    name = f"{info.title} ({info.mode}, 1 sample = {info.interval * 1000:g} ms)"
    return {
        "$schema": SCHEMA,
        "exporter": "fleetflame",
        "name": name,
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": [
            {
                "type": "sampled",
                "name": name,
                "unit": "seconds",
                "startValue": 0,
                "endValue": _seconds(total, info.interval),
                "samples": samples,
                "weights": weights,
            }
        ],
    }


def _seconds(count: int, interval: float) -> float:
    return round(count * interval, 9)  # to the nanosecond: no 0.30000000000000004


def render_speedscope(counts: Mapping[str, int], info: ExportInfo) -> bytes:
    """Renders the speedscope document as compact JSON."""
    document = speedscope_document(counts, info)
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


SPEEDSCOPE = Export("speedscope", "application/json", "speedscope.json", render_speedscope)
