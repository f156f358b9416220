"""Worst cases: each target's stalls and slow requests, polled and stored (issue 16).

Every ``worst_interval`` seconds, apart from the sample rounds (a slow target delays nothing
but this job), each target's ``/stalls.json?since=N`` and ``/requests.json`` are read. A stall
is stored once, keyed by its sampler instance and id. Request figures are cumulative per
sampler series (docs/wire-format.md): what each route added since the last read (its count,
errors, the bins of its latency, queueing and total sketches, its slowest 1%'s stacks, its
slowest requests not seen before) is stored in the minute of the read. A worker without the
endpoints (404: an older sampler, no middleware) is skipped quietly; anything malformed is
logged and skipped, never stored. The documents become rows in collector.worst_documents, and
the rows are merged into the tables in collector.worst_rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
import sqlalchemy as sa

from collector.logs import log_event
from collector.store import schema
from collector.store.engines.base import translate_errors
from collector.targets import Target
from collector.worst_documents import BadDocument, labels_of, route_delta, stall_row, text_of
from collector.worst_rows import add_request_rows
from sampler._sketch import SketchError
from sampler.profile import align_down

__all__ = ["WorstCases"]

log = logging.getLogger("collector.worst")
# Bounds on what one read may add: the sampler keeps 500 stalls, 50 stacks a stall, and 200
# routes besides [other] (the rest) and [unmatched].
MAX_STALLS = 500
MAX_ROUTES = 202
MAX_BYTES = 8_000_000


# A cursor to move on once what was read is written: (the cursors, a target, its new value).
_Seen = tuple[dict[str, Any], str, Any]


class WorstCases:
    """Polls and stores the targets' stalls and request figures."""

    def __init__(
        self,
        store: Any,
        *,
        bucket_seconds: int = 60,
        concurrency: int = 8,
        timeout: tuple[float, float] = (2.0, 5.0),
        token: str = "",
        lock: Any = None,
    ) -> None:
        self.store = store
        self.bucket_seconds = bucket_seconds
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="fleetflame-worst")
        self._local = threading.local()
        self._lock = lock or threading.Lock()  # the store's writer lock (SQLite: one writer)
        # target address -> (instance, the stall id to read after)
        self._stalls_next: dict[str, tuple[str, int]] = {}
        # target address -> (series, route -> its last cumulative document)
        self._requests_seen: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {}
        self._told_routes: set[str] = set()  # targets told to send too many routes

    def poll(self, targets: Sequence[Target], now: float) -> dict[str, int]:
        """Reads every target once and stores what is new; returns what was stored. What a
        read takes as seen (the stall ids, the routes' cumulative figures) is noted only once
        the write has committed: a write that fails leaves it to be read again next time."""
        results = list(self._pool.map(self._read, targets))
        stalls = [row for rows, _, _ in results for row in rows]
        buckets = [row for _, rows, _ in results for row in rows]
        bucket = align_down(int(now), self.bucket_seconds)
        for row in buckets:
            row["bucket"] = bucket
        with self._lock, translate_errors("writing worst cases"):
            with self.store.engine.write_transaction() as conn:
                self.store.engine.insert_ignore(conn, schema.stall_events, stalls)
                self._add_buckets(conn, buckets)
        for _, _, seen in results:
            for cursors, address, value in seen:
                cursors[address] = value
        return {"stalls": len(stalls), "request_buckets": len(buckets)}

    def apply_retention(self, before: float) -> None:
        """Deletes what is older than ``before`` (epoch seconds)."""
        with self._lock, translate_errors("expiring worst cases"):
            with self.store.engine.write_transaction() as conn:
                conn.execute(
                    schema.stall_events.delete().where(schema.stall_events.c.start < before)
                )
                table = schema.request_buckets
                conn.execute(table.delete().where(table.c.bucket < int(before)))
                fleet = schema.request_fleet  # a row goes once all of its time has
                conn.execute(fleet.delete().where(fleet.c.bucket + fleet.c.width <= int(before)))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # Reading one target ---------------------------------------------------------------------

    def _read(self, target: Target) -> tuple[list[dict], list[dict], list[_Seen]]:
        stalls: list[dict] = []
        buckets: list[dict] = []
        seen: list[_Seen] = []  # the cursors to move on once written
        for name, read in (("stalls", self._stall_rows), ("requests", self._request_rows)):
            try:
                (stalls if name == "stalls" else buckets).extend(read(target, seen))
            except requests.RequestException as exc:
                log.debug("worst cases: %s of %s: %s", name, target.address, exc)
            except (BadDocument, SketchError, ValueError, TypeError, KeyError) as exc:
                log_event(
                    log,
                    logging.WARNING,
                    f"worst cases: a malformed /{name}.json, skipped",
                    target=target.address,
                    error=str(exc)[:200],
                )
        return stalls, buckets, seen

    def _get(self, target: Target, path: str) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        answer = session.get(
            f"http://{target.address}{path}", headers=self._headers, timeout=self.timeout
        )
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        if len(answer.content) > MAX_BYTES:
            raise BadDocument(f"larger than {MAX_BYTES} bytes")
        return answer.json()

    def _stall_rows(self, target: Target, seen: list[_Seen]) -> list[dict]:
        instance, after = self._stalls_next.get(target.address, ("", 0))
        document = self._get(target, f"/stalls.json?since={after}")
        if document is None:
            return []
        if not isinstance(document, dict) or not isinstance(document.get("stalls"), list):
            raise BadDocument("no stalls list")
        read_instance = text_of(document.get("instance"), "instance")
        if read_instance != instance and after:  # a new process: its ids start over
            document = self._get(target, "/stalls.json?since=0") or document
        labels = labels_of(document)
        rows = [
            stall_row(stall, read_instance, labels) for stall in document["stalls"][:MAX_STALLS]
        ]
        seen.append((self._stalls_next, target.address, (read_instance, int(document["next"]) - 1)))
        return rows

    def _request_rows(self, target: Target, seen_now: list[_Seen]) -> list[dict]:
        document = self._get(target, "/requests.json")
        if document is None:
            return []
        if not isinstance(document, dict) or not isinstance(document.get("routes"), dict):
            raise BadDocument("no routes object")
        series = text_of(document.get("series"), "series")
        instance = text_of(document.get("instance") or series, "instance")
        labels = labels_of(document)
        seen_series, seen = self._requests_seen.get(target.address, ("", {}))
        if seen_series != series:
            seen = {}  # a new process or fork: everything it counted is new
        rows, current = [], {}
        routes = list(document["routes"].items())
        if len(routes) > MAX_ROUTES and target.address not in self._told_routes:
            self._told_routes.add(target.address)  # once a target: it sends as many each time
            log_event(
                log,
                logging.WARNING,
                f"worst cases: /requests.json lists more routes than {MAX_ROUTES}; the rest skipped",
                target=target.address,
                routes=len(routes),
            )
        for route, part in routes[:MAX_ROUTES]:
            if not isinstance(part, dict):
                raise BadDocument(f"route {route[:60]!r} is not an object")
            current[route] = part
            try:
                row = route_delta(part, seen.get(route), labels.get("host", target.host))
            except (SketchError, KeyError, TypeError, ValueError) as exc:
                # This route only: its sketches stay malformed until the worker restarts,
                # and its other routes are still worth keeping.
                log_event(
                    log,
                    logging.WARNING,
                    "worst cases: a route in /requests.json is malformed, skipped",
                    target=target.address,
                    route=str(route)[:200],
                    error=str(exc)[:200],
                )
                continue
            if row is not None:
                row.update(
                    instance=instance,
                    route=text_of(route, "route"),
                    service=labels.get("service", ""),
                    host=labels.get("host", target.host),
                )
                rows.append(row)
        seen_now.append((self._requests_seen, target.address, (series, current)))
        return rows

    # Writing -------------------------------------------------------------------------------

    def _add_buckets(self, conn: sa.Connection, rows: list[dict]) -> None:
        add_request_rows(conn, rows)
