"""The worker view: the live profile of one instance over the next N seconds (issue 14).

``GET /api/workers`` lists the targets the collector has polled, with their latest instance,
its service, host and the last minute sampled, latest first. ``GET /api/live?instance=ID&seconds=N`` asks that instance's
sampler for ``/stacks?seconds=N`` and answers its flamegraph. Only instances the collector polls are reachable: the address is
the collector's own record of the target that served that instance (the store's cursor
targets), never one the request names, so the UI cannot be used to reach anything else.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

import sqlalchemy as sa
from flask import Blueprint, Response, current_app, jsonify, request

from collector.store import schema
from sampler.profile import LIMITS, parse_folded
from webui import api, db, pages
from webui.model import flame_tree
from webui.params import ParamError, parse_int

__all__ = ["bp"]

bp = Blueprint("live", __name__)
api.json_errors(bp)
pages.add_view(bp, "/worker", "worker")

MAX_SECONDS = 60
MAX_BYTES = 50_000_000


@bp.get("/api/live")
def live() -> Response:
    """The flamegraph of one instance's next ``seconds`` (1 to 60)."""
    instance = request.args.get("instance") or ""  # as stored, exactly
    if not instance or len(instance) > LIMITS.max_name:
        raise ParamError("instance", "name an instance the collector polls (its id)")
    seconds = parse_int(request.args, "seconds", 10, 1, MAX_SECONDS)
    target = _target_of(instance)
    if target is None:
        raise ParamError("instance", f"no polled target serves instance {instance[:60]!r}")
    url = f"http://{target}/stacks?seconds={seconds}"
    headers = {}
    token = current_app.config["SAMPLER_TOKEN"]
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=seconds + 10
        ) as answer:
            text = answer.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        exc.close()
        hint = ""
        if exc.code == 401:
            hint = (
                " (sampler_token is not the worker's token)"
                if token
                else " (the worker needs a token: set sampler_token)"
            )
        return jsonify(error=f"the worker at {target} answered {exc.code}{hint}"), 502
    except OSError as exc:
        message = (
            f"the worker at {target} did not answer: {exc}; pick another instance, or try again"
        )
        return jsonify(error=message), 504
    except (http.client.InvalidURL, ValueError) as exc:
        # The store's record of the target, not the request, names an address no one can ask
        # (a space, a port that is no number): neither an OSError nor the worker's fault.
        message = f"the collector's address of this worker, {target!r}, cannot be asked: {exc}"
        return jsonify(error=message), 502
    except http.client.HTTPException as exc:  # an answer that is not HTTP, or cut short
        return jsonify(error=f"the worker at {target} did not answer HTTP: {exc!r}"), 502
    if len(text) > MAX_BYTES:
        return jsonify(error=f"the worker at {target} sent more than {MAX_BYTES} bytes"), 502
    try:
        counts = parse_folded(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return jsonify(error=f"the worker at {target} sent no folded stacks: {exc}"), 502
    return jsonify(
        instance=instance, target=target, seconds=seconds, **flame_tree(counts).to_dict()
    )


@bp.get("/api/workers")
def workers() -> Response:
    """Every target the collector has polled, with its latest instance (one a restart
    replaced is gone), service, host and the last minute sampled, latest first."""
    targets, series = schema.cursor_targets, schema.series
    last = sa.func.max(series.c.last_bucket)
    query = (
        sa.select(targets.c.target, targets.c.instance, series.c.service, series.c.host, last)
        .join(series, series.c.instance == targets.c.instance, isouter=True)
        .group_by(targets.c.target, targets.c.instance, series.c.service, series.c.host)
    )
    with db.read_connection("listing the workers") as conn:
        rows = conn.execute(query).all()
    found: dict[str, dict] = {}
    for target, instance, service, host, last_bucket in rows:
        seen = found.get(instance)
        if seen is None or (last_bucket or 0) > (seen["last"] or 0):
            found[instance] = {
                "instance": instance,
                "target": target,
                "service": service or "",
                "host": host or "",
                "last": last_bucket,
            }
    listed = sorted(found.values(), key=lambda w: (-(w["last"] or 0), w["instance"]))
    return jsonify(workers=listed)


def _target_of(instance: str) -> str | None:
    table = schema.cursor_targets
    with db.read_connection("finding a worker") as conn:
        row = conn.execute(
            sa.select(table.c.target).where(table.c.instance == instance).limit(1)
        ).first()
    return None if row is None else str(row.target)
