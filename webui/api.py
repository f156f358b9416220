"""The JSON API (documented in docs/api.md): profiles, diffs, timelines, tables, exports.

Every endpoint takes ``service``, ``from``, ``to``, ``mode`` and filters (``host``,
``instance``, ``label=key:value``, each repeatable); /api/diff takes ``a_*`` and ``b_*``
variants of them for its two sides. Bad parameters get a 400 whose JSON names the parameter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from collector.store import InvalidQuery, StoreError, StoreUnavailable
from sampler.profile import LIMITS, align_up, unescape_frame
from webui import db
from webui.exports import EXPORTS, ExportInfo
from webui.gcpause import paused_gc
from webui.model import (
    choose_step,
    diff_tree_sorted,
    fill_timeline,
    flame_tree_sorted,
    rank_changes,
    top_functions,
)
from webui.params import (
    ParamError,
    Selection,
    label_param,
    parse_choice,
    parse_compare,
    parse_float,
    parse_int,
    parse_selection,
)
from webui.readonly import sqlite_file_problem

__all__ = ["bp"]

MAX_SEARCH = 200  # characters of /api/top's search: its texts are tried on every function

bp = Blueprint("api", __name__, url_prefix="/api")


def _now() -> int:
    return int(time.time())


def _selection() -> Selection:
    return parse_selection(
        request.args, _now(), default_window=current_app.config["DEFAULT_WINDOW"]
    )


def _max_nodes() -> int:
    config = current_app.config
    return parse_int(request.args, "max_nodes", config["MAX_NODES"], 2, config["MAX_NODES_LIMIT"])


def _read_from(selection: Selection) -> int:
    # The first bucket a window reads: its points start there, not at the bucket `from` cuts
    # (which is never read, so drew as a zero at the chart's left edge).
    return align_up(selection.start, current_app.config["BUCKET_SECONDS"])


def _describe(selection: Selection) -> dict[str, Any]:
    # What is read: the buckets that start in [from, to), so the window read runs from the
    # first bucket start at or after `from` to the first at or after `to`.
    bucket = current_app.config["BUCKET_SECONDS"]
    return {
        "from": selection.start,
        "to": selection.end,
        "read_from": _read_from(selection),
        "read_to": align_up(selection.end, bucket),
        "mode": selection.mode,
        "service": list(selection.services),
        "host": list(selection.hosts),
        "instance": list(selection.instances),
        "label": [label_param(k, v) for k, v in selection.labels],
    }


@bp.get("/flamegraph")
def flamegraph() -> Response:
    """The merged profile of a window as a pruned tree in d3-flame-graph's shape."""
    selection = _selection()
    max_nodes = _max_nodes()
    min_share = parse_float(request.args, "min_share", 0.0, 0.0, 1.0)
    database = db.get_db()

    def compute() -> dict[str, Any]:
        with paused_gc():
            stacks, interval = database.sorted_stacks(selection)
            tree = flame_tree_sorted(
                stacks, max_nodes=max_nodes, min_share=min_share, interval=interval
            )
        return {
            "selection": _describe(selection),
            "resolution": database.query.resolution(selection.start, selection.end),
            "max_nodes": max_nodes,
            **tree.to_dict(),
        }

    key = ("flamegraph", selection, max_nodes, min_share)
    return jsonify(database.cached(key, database.settled(selection), compute))


@bp.get("/diff")
def diff() -> Response:
    """Two selections compared: a differential tree and functions ranked by change of share."""
    a, b = parse_compare(request.args, _now(), default_window=current_app.config["DEFAULT_WINDOW"])
    max_nodes = _max_nodes()
    limit = parse_int(request.args, "limit", 100, 1, 10_000)
    order = parse_choice(request.args, "order", ("self", "total"))
    database = db.get_db()

    def compute() -> dict[str, Any]:
        with paused_gc():
            # Each side read once: the tree and the table describe the same samples.
            counts_a, counts_b, interval = database.compared(a, b)
            index = database.index
            tree = diff_tree_sorted(
                index.arrange([counts_a, counts_b]), max_nodes=max_nodes, interval=interval
            )
            samples_a, samples_b = (database.functions.table(c) for c in (counts_a, counts_b))
            changes = rank_changes(samples_a, samples_b, limit=limit, order=order)
        return {
            "a": _describe(a),
            "b": _describe(b),
            "max_nodes": max_nodes,
            "functions": [change.to_dict() for change in changes],
            **tree.to_dict(),
        }

    key = ("diff", a, b, max_nodes, limit, order)
    return jsonify(database.cached(key, database.settled(a, b), compute))


@bp.get("/timeline")
def timeline() -> Response:
    """Samples per time step over the window, zero-filled, for the chart above the graph."""
    selection = _selection()
    bucket = current_app.config["BUCKET_SECONDS"]
    default_step = choose_step(selection.start, selection.end, bucket)
    step = parse_int(request.args, "step", default_step, bucket, 366 * 86400)
    if (selection.end - selection.start) / step > 5000:
        raise ParamError("step", "too small for the window: more than 5000 points")
    points, interval = db.get_db().query.timeline_at(
        selection.start, selection.end, db.filters_of(selection), step
    )
    filled = fill_timeline(points, _read_from(selection), selection.end, step)
    answer: dict[str, Any] = {
        "selection": _describe(selection),
        "step": step,
        "total": sum(count for _, count in filled),
        "points": filled,
    }
    split = request.args.get("split") or ""  # a label key, exactly (it may hold spaces)
    if split:
        answer["split"] = split
        answer["series"] = _split_timeline(selection, split, step, interval)
    return jsonify(answer)


MAX_SPLIT = 12


def _split_timeline(
    selection: Selection, key: str, step: int, interval: float
) -> list[dict[str, Any]]:
    """The timeline once per value of ``key`` (a label, or service, host, instance): the
    ``MAX_SPLIT`` values with the most samples, each its own line, counted in samples of
    ``interval`` (the whole timeline's: a host sampling at 20 ms beside 10 ms ones counts
    its samples twice, in every line as in the total)."""
    if len(key) > LIMITS.max_name:
        raise ParamError("split", "a label key, or service, host or instance")
    query = db.get_db().query
    filters = db.filters_of(selection)
    # The values offered for a key ignore that key's own filter (label_values: a dropdown lists
    # the alternatives); a split by a filtered key keeps to the values the filter accepts.
    values = query.label_values(selection.start, selection.end, filters).get(key, [])
    column = {"service": "services", "host": "hosts", "instance": "instances"}.get(key)
    if column is not None:
        accepted = set(getattr(filters, column))
    else:
        accepted = set(filters.label_groups().get(key, ()))
        others = tuple(label for label in filters.labels if label[0] != key)
    if accepted:
        values = [value for value in values if value in accepted]
    series = []
    for value in values[:100]:
        if column is not None:
            narrowed = replace(filters, **{column: (value,)})
        else:
            narrowed = replace(filters, labels=(*others, (key, value)))
        points, _ = query.timeline_at(selection.start, selection.end, narrowed, step, interval)
        filled = fill_timeline(points, _read_from(selection), selection.end, step)
        series.append({"value": value, "total": sum(c for _, c in filled), "points": filled})
    series.sort(key=lambda s: -s["total"])
    return series[:MAX_SPLIT]


@bp.get("/top")
def top() -> Response:
    """Functions by self samples, with total samples and both shares."""
    selection = _selection()
    limit = parse_int(request.args, "limit", 200, 1, 100_000)
    search = request.args.get("search", "")
    match = _search_match(search)
    database = db.get_db()

    def compute() -> dict[str, Any]:
        with paused_gc():
            samples, interval = database.function_samples(selection, limit=limit, match=match)
            functions = top_functions(samples, limit=limit, interval=interval)
        return {"selection": _describe(selection), "total": samples.total, "functions": functions}

    if match is not None:  # each search typed would push a costlier answer out of the cache
        return jsonify(compute())
    key = ("top", selection, limit)
    return jsonify(database.cached(key, database.settled(selection), compute))


def _search_match(search: str) -> Callable[[str], bool] | None:
    """What a ``search`` parameter accepts, told an escaped frame name: the names whose
    displayed (unescaped) form holds one of its texts, separated by ``|``. Plain text, not a
    regular expression: a pattern made to backtrack would hold the function index's lock
    for as long as it ran (the page matches regular expressions itself)."""
    texts = [text for text in search.split("|") if text]
    if not texts:
        return None
    if len(search) > MAX_SEARCH:
        raise ParamError("search", f"at most {MAX_SEARCH} characters")

    def accepts(name: str) -> bool:
        shown = unescape_frame(name)
        return any(text in shown for text in texts)

    return accepts


@bp.get("/labels")
def labels() -> Response:
    """The values of service, host, instance and every label key seen in the window."""
    selection = _selection()
    values = db.get_db().query.label_values(
        selection.start, selection.end, db.filters_of(selection)
    )
    return jsonify(selection=_describe(selection), values=values)


@bp.get("/export")
def export() -> Response:
    """The merged profile as a file: ``format=folded`` (default), ``speedscope`` or ``pprof``."""
    return _export(parse_choice(request.args, "format", tuple(EXPORTS)), download=True)


@bp.get("/folded")
def folded() -> Response:
    """Folded stacks as text: ``curl .../api/folded?service=api&from=-1h | flamegraph.pl``."""
    return _export("folded")


@bp.get("/speedscope")
def speedscope() -> Response:
    """The profile in speedscope's JSON format."""
    return _export("speedscope")


@bp.get("/pprof")
def pprof() -> Response:
    """The profile as gzipped pprof protobuf (go tool pprof, Pyroscope)."""
    return _export("pprof")


def _export(name: str, download: bool = False) -> Response:
    """The profile in an export format: a file to save, but /api/folded's text shown inline
    (``curl ... | flamegraph.pl``) unless ``download``."""
    selection = _selection()
    fmt = EXPORTS[name]
    profile = db.get_db().read(selection)
    info = ExportInfo(
        start=selection.start,
        end=selection.end,
        mode=selection.mode,
        interval=profile.interval,
        title=selection.describe(),
    )
    try:
        body = fmt.render(profile.counts, info)
    except ValueError as exc:  # a window too large for the format
        raise ParamError("format", str(exc)) from None
    response = Response(body, content_type=fmt.content_type)
    if name != "folded" or download:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(selection.start))
        filename = f"fleetflame-{stamp}.{fmt.extension}"
        response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _bad_param(exc: ParamError) -> tuple[Response, int]:
    return jsonify(error=str(exc), param=exc.param), 400


def _bad_query(exc: InvalidQuery) -> tuple[Response, int]:
    return jsonify(error=str(exc)), 400


def _unavailable(exc: StoreUnavailable) -> tuple[Response, int]:
    db.mark_unavailable()
    current_app.logger.warning("database unavailable: %s", exc)
    problem = sqlite_file_problem(current_app.config["DATABASE_URL"])
    if problem is not None:  # not an outage: nothing of ours is there (yet)
        return jsonify(error=f"the database is unavailable: {problem}"), 503
    return jsonify(error=f"the database is unavailable, try again shortly ({exc})"), 503


def _store_error(exc: StoreError) -> tuple[Response, int]:
    current_app.logger.error("database error: %s", exc)
    problem = sqlite_file_problem(current_app.config["DATABASE_URL"])
    if problem is not None:
        return jsonify(error=f"the database is unavailable: {problem}"), 503
    return jsonify(error=f"database error: {exc}"), 500


def json_errors(blueprint: Blueprint) -> None:
    """Answers a blueprint's bad parameters (400) and database errors (503, 500) as JSON."""
    blueprint.register_error_handler(ParamError, _bad_param)
    blueprint.register_error_handler(InvalidQuery, _bad_query)
    blueprint.register_error_handler(StoreUnavailable, _unavailable)
    blueprint.register_error_handler(StoreError, _store_error)


json_errors(bp)


@bp.route("/<path:unknown>")
def _not_found(unknown: str) -> tuple[Response, int]:
    return jsonify(error=f"no API endpoint /api/{unknown[:80]}"), 404
