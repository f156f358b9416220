"""Whether each change the compare view shows is real (issue 15): its statistics.

``GET /api/significance`` takes /api/diff's two sides (``a_*`` and ``b_*`` windows and filters
over the shared ones). Each side's replicates are its (instance, bucket) profiles, buckets
widened so that a side has at most ``MAX_REPLICATES`` (collector/compare_db.py), judged by
collector.stats: per function, the change of its self and total share with a 95% interval,
p and q (Benjamini-Hochberg over every hypothesis judged) and whether it is significant; the
comparison's noise floor; the replicates of each side. Functions too rare to judge are left
out of ``findings`` (the page says so). A side with fewer than two replicates cannot be judged:
``judged`` is false and ``reason`` says why. The compare page greys out the frames whose self
change is not significant and shows the intervals and q beside the table's changes.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from collector.compare_db import frames_of, replicates_in
from sampler.profile import unescape_frame
from webui import api, db
from webui.api import _describe, _now
from webui.gcpause import paused_gc
from webui.params import Selection, parse_compare

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collector.stats import Finding

__all__ = ["bp"]

bp = Blueprint("significance", __name__, url_prefix="/api")
api.json_errors(bp)

# Replicates a side at most (one per instance when there are more instances): one grouped
# read of the store a side, ~1.2 s on SQLite for a fleet-wide hour of 50 instances
# (docs/regressions.md, "In the compare view").
MAX_REPLICATES = 120
# Judged findings answered, most significant first: the rest are the least sure.
MAX_FINDINGS = 4000


@bp.get("/significance")
def significance() -> Response:
    """The comparison's findings, noise floor and replicates (see the module docstring)."""
    a, b = parse_compare(request.args, _now(), default_window=current_app.config["DEFAULT_WINDOW"])
    database = db.get_db()

    def compute() -> dict[str, Any]:
        # numpy and scipy at the first comparison, not at every web process's start (~0.25 s
        # and ~40 MB a process, where most are never asked for one).
        from collector.stats import ComparisonError, Options, compare

        sides = [_replicates(database, side) for side in (a, b)]
        described = {"a": _describe(a), "b": _describe(b)}
        replicates = {"a": len(sides[0]), "b": len(sides[1])}
        try:
            frames = frames_of(database.query, *sides)
            comparison = compare(sides[0], sides[1], Options(), frames=frames)
        except ComparisonError as exc:
            return {**described, "judged": False, "reason": str(exc), "replicates": replicates}
        judged = [f for f in comparison.findings if f.judged][:MAX_FINDINGS]
        return {
            **described,
            "judged": True,
            "replicates": replicates,
            "fdr": comparison.options.fdr,
            "hypotheses": comparison.judged,
            "noise_floor": comparison.noise_floor.to_dict(),
            "findings": [_finding(f) for f in judged],
        }

    key = ("significance", a, b)
    return jsonify(database.cached(key, database.settled(a, b), compute))


def _replicates(database: db.Database, side: Selection) -> list[dict[int, int]]:
    bucket = current_app.config["BUCKET_SECONDS"]
    filters = db.filters_of(side)
    with paused_gc():
        replicates, _ = replicates_in(
            database.query, filters, side.start, side.end, bucket, MAX_REPLICATES
        )
    return replicates


def _finding(finding: Finding) -> dict[str, Any]:
    """The finding as the statistics give it, the name as the flamegraph names the frame."""
    return {**finding.to_dict(), "function": unescape_frame(finding.function)}
