"""A function's share over time, with deploy markers and change points (issue 15), and its
sandwich: its callers and callees merged across the graph, and the window's profile in time
order (issue 14).

``GET /api/function-series?function=NAME&kind=self|total`` plus the window and filters of every
endpoint (and ``deploy_label``, ``version`` by default): the window is cut into at most
``MAX_POINTS`` steps of whole buckets; for each, the function's self (or total) samples over
all samples of the selection; a deploy marker where the values of ``deploy_label`` seen in a
step differ from the step before; change points found in the shares by
collector/stats/changepoints.py; and the findings of the collector's scheduled comparison
for the function whose B window (where the change was seen) overlaps the window. The
flamegraph page draws it under the graph when a frame is selected (or named by ``function=``
in its URL, as the findings page links to it).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from flask import Blueprint, Response, current_app, jsonify, request

from collector.store import schema
from sampler.profile import (
    DEFAULT_INTERVAL,
    LIMITS,
    Profile,
    escape_frame,
    rescale,
    split_frames,
)
from webui import api, db
from webui.api import _describe, _selection
from webui.gcpause import paused_gc
from webui.model import flame_tree
from webui.params import ParamError, Selection, parse_choice

__all__ = ["bp"]

bp = Blueprint("history", __name__, url_prefix="/api")
api.json_errors(bp)

MAX_POINTS = 96
MAX_STEPS = 60  # columns of the time-ordered graph
MAX_FINDINGS = 50
FINDING_COLUMNS = ("found_at", "service", "kind", "change", "ci_low", "ci_high", "q", "compared")
FINDING_COLUMNS += ("b_from", "b_to", "link")


@bp.get("/function-series")
def function_series() -> Response:
    """The function's share per step of the window, deploys and change points."""
    selection = _selection()
    function, frame = _function()
    kind = parse_choice(request.args, "kind", ("self", "total"))
    deploy_label = (request.args.get("deploy_label") or "version").strip()[:200]
    query, filters = db.get_db().query, db.filters_of(selection)
    bucket = current_app.config["BUCKET_SECONDS"]
    step = bucket * max(1, math.ceil((selection.end - selection.start) / MAX_POINTS / bucket))
    points: list[dict[str, Any]] = []
    deploys: list[dict[str, Any]] = []
    seen: list[str] | None = None
    # The buckets that start in [from, to), as every view reads (api._read_from).
    for t in range(api._read_from(selection), selection.end, step):
        counts = query.profile(t, min(t + step, selection.end), filters)
        total = sum(counts.values())
        samples = sum(
            count
            for stack, count in counts.items()
            if (
                split_frames(stack)[-1] == frame if kind == "self" else frame in split_frames(stack)
            )
        )
        if total:
            points.append(
                {"t": _iso(t), "share": samples / total, "samples": samples, "total": total}
            )
        values = sorted(
            query.label_values(t, min(t + step, selection.end), filters).get(deploy_label, [])
        )
        if values and seen is not None and seen and values != seen:
            deploys.append(
                {
                    "t": _iso(t),
                    "label": deploy_label,
                    "before": ",".join(seen),
                    "after": ",".join(values),
                }
            )
        seen = values or seen
    from collector.stats.changepoints import change_points  # numpy and scipy: when asked

    found = change_points([p["share"] for p in points]) if len(points) >= 10 else []
    return jsonify(
        selection=_describe(selection),
        function=function,
        kind=kind,
        bucket_seconds=step,
        points=points,
        deploys=deploys,
        change_points=[{**c.to_dict(), "t": points[c.at]["t"]} for c in found],
        findings=_findings(selection, frame),
    )


def _function() -> tuple[str, str]:
    """The ``function`` parameter as given, and as a frame of the stored stacks (escaped).

    Not stripped: a name with spaces at its ends is a name of its own, as the flamegraph shows
    it. Any frame the store can hold is accepted: one no longer than its longest stack.
    """
    function = request.args.get("function") or ""
    if not function:
        raise ParamError("function", "name the function, as the flamegraph shows it (module:name)")
    frame = escape_frame(function)
    if len(frame) > LIMITS.max_stack:
        raise ParamError(
            "function",
            f"{len(frame):,} characters (escaped as stored), longer than any stack the store "
            f"holds ({LIMITS.max_stack:,}): no frame has this name",
        )
    return function, frame


def _findings(selection: Selection, frame: str) -> list[dict[str, Any]]:
    """The scheduled comparison's findings of the function whose B side (the window where
    the change was seen) overlaps the selection's window, oldest first."""
    table = schema.findings
    where = (
        (table.c.function == frame)
        & (table.c.b_from < selection.end)
        & (table.c.b_to > selection.start)
    )
    if selection.services:
        where &= table.c.service.in_(selection.services)
    columns = [table.c[name] for name in FINDING_COLUMNS]
    with db.read_connection("reading findings") as conn:
        rows = conn.execute(
            sa.select(*columns).where(where).order_by(table.c.b_from).limit(MAX_FINDINGS)
        ).mappings()
        return [{**row, "b_from": _iso(row["b_from"]), "b_to": _iso(row["b_to"])} for row in rows]


@bp.get("/time-order")
def time_order() -> Response:
    """The window's profile in time order: one frame per time step at the top, oldest first
    (at most ``MAX_STEPS`` steps of whole buckets), each over that step's own tree. The store
    keeps counts per bucket, not samples in order, so this is time order to the bucket."""
    selection = _selection()
    max_nodes = api._max_nodes()
    database = db.get_db()
    bucket = current_app.config["BUCKET_SECONDS"]
    step = bucket * max(1, math.ceil((selection.end - selection.start) / MAX_STEPS / bucket))

    def compute() -> dict[str, Any]:
        query, filters = database.query, db.filters_of(selection)
        with paused_gc():
            reads = [
                (t, query.read(t, min(t + step, selection.end), filters))
                for t in range(api._read_from(selection), selection.end, step)
            ]
            reads = [(t, read) for t, read in reads if read.counts]
            # Every count at the finest interval read, so each stands for the same time.
            finest = min((read.interval for _, read in reads), default=DEFAULT_INTERVAL)
            counts: dict[str, int] = {}
            for t, read in reads:
                frame = escape_frame(_iso(t))
                step_counts = read.counts
                if read.interval != finest:
                    step_counts = rescale(step_counts, read.interval / finest)
                for stack, count in step_counts.items():
                    key = f"{frame};{stack}" if stack else frame
                    counts[key] = counts.get(key, 0) + count
            profile = Profile(counts, interval=finest, mode=selection.mode)
            tree = flame_tree(profile, max_nodes=max_nodes).to_dict()
        times = {_iso(t): t for t, _ in reads}
        steps = tree["tree"].get("children") or []
        for child in steps:
            child["t"] = times.get(child["name"])  # None for a [pruned] frame
        steps.sort(key=lambda child: (child["t"] is None, child["t"] or 0))
        return {"selection": _describe(selection), "step": step, "max_nodes": max_nodes, **tree}

    key = ("time-order", selection, max_nodes)
    return jsonify(database.cached(key, database.settled(selection), compute))


@bp.get("/sandwich")
def sandwich() -> Response:
    """One function's callers and callees, merged across the whole graph: two trees rooted at
    the function (its callers' tree grows towards the roots of the stacks)."""
    selection = _selection()
    function, frame = _function()
    profile = db.get_db().read(selection)
    callers: dict[str, int] = {}
    callees: dict[str, int] = {}
    total = own = 0
    for stack, count in profile.counts.items():
        frames = split_frames(stack)
        if frame not in frames:
            continue
        at = frames.index(frame)  # the outermost call: recursion is counted once
        total += count
        own += count if frames[-1] == frame else 0
        up = ";".join(reversed(frames[: at + 1]))
        down = ";".join(frames[at:])
        callers[up] = callers.get(up, 0) + count
        callees[down] = callees.get(down, 0) + count
    every = sum(profile.counts.values())
    return jsonify(
        {
            "selection": _describe(selection),
            "function": function,
            "samples": total,
            "self": own,
            "share": total / every if every else 0.0,
            "interval": profile.interval,
            "callers": _rooted(callers),
            "callees": _rooted(callees),
        }
    )


def _rooted(counts: dict[str, int]) -> dict[str, Any] | None:
    """The tree of stacks that all start with the function, rooted at it (not at "all")."""
    if not counts:
        return None
    root = flame_tree(counts, max_nodes=2000).root
    children = root.get("children") or []
    return children[0] if len(children) == 1 else root


def _iso(t: int) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()
