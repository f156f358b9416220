"""Folded stacks, the text that flamegraph.pl, inferno and speedscope read."""

from __future__ import annotations

from collections.abc import Mapping

from sampler.profile import format_folded
from webui.exports.base import Export, ExportInfo

__all__ = ["FOLDED", "render_folded"]


def render_folded(counts: Mapping[str, int], info: ExportInfo) -> bytes:
    """Renders ``stack count`` lines (frames stay escaped, as the wire format defines them)."""
    return format_folded(counts).encode("utf-8")


FOLDED = Export("folded", "text/plain; charset=utf-8", "folded", render_folded)
