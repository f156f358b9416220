"""Export formats of a profile: folded text, speedscope JSON, pprof and the Firefox Profiler's
Gecko format."""

from __future__ import annotations

from webui.exports.base import Export, ExportInfo
from webui.exports.folded import FOLDED
from webui.exports.gecko import GECKO
from webui.exports.pprof import PPROF
from webui.exports.speedscope import SPEEDSCOPE

__all__ = ["EXPORTS", "Export", "ExportInfo"]

EXPORTS: dict[str, Export] = {export.name: export for export in (FOLDED, SPEEDSCOPE, PPROF, GECKO)}
