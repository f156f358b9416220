"""Findings that arrive by themselves (issue 15): a scheduled comparison per service.

Every ``findings_interval`` seconds, for each service with samples in the latest
``findings_window`` (5 minutes): the baseline is the previous version when the ``version``
label changed (the latest version's window against the previous version's last day), else the
same window a day earlier. The comparison is collector.stats's (one replicate per instance and
bucket). A significant regression (a function's self or total share up by more than
``findings_fail_above`` points) is a finding: recorded once in the database (keyed by service,
function, kind and what was compared: a version pair, or a day), written to the log, and POSTed
as JSON to ``findings_webhook`` when one is set, by a thread of its own that retries with
exponential backoff; polling never waits for it.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from collector.compare_db import _side, frames_of
from collector.logs import log_event
from collector.query import Filters, Query
from collector.stats import ComparisonError, Options, compare
from collector.store import schema
from collector.store.engines.base import translate_errors
from collector.store.ids import event_id

__all__ = ["FindingsJob", "WebhookSender"]

log = logging.getLogger("collector.findings")

DAY = 86400
HOUR = 3600


class FindingsJob:
    """Compares each service's latest window with its baseline and records what regressed."""

    def __init__(
        self,
        store: Any,
        *,
        window: int = 300,
        fail_above: float = 2.0,
        webhook: WebhookSender | None = None,
        link_base: str = "",
        lock: Any = None,
    ) -> None:
        self.store = store
        self.query = Query(store)
        self.window = window
        self.fail_above = fail_above
        self.webhook = webhook
        self.link_base = link_base.rstrip("/")
        self._lock = lock or threading.Lock()

    def run(self, now: float) -> list[dict[str, Any]]:
        """One round: returns the findings new in it (already recorded and queued)."""
        end = int(now)
        start = end - self.window
        services = self.query.label_values(start, end, Filters()).get("service", [])
        new: list[dict[str, Any]] = []
        for service in services:
            try:
                new += self._service(service, start, end)
            except ComparisonError as exc:  # too few replicates: nothing to judge yet
                log.debug("findings: %s: %s", service, exc)
        return new

    def _service(self, service: str, start: int, end: int) -> list[dict[str, Any]]:
        plan = self._baseline(service, start, end)
        if plan is None:
            return []
        (a_start, a_end, a_label), (b_start, b_end, b_label), what = plan
        # At most 120 replicates a side: a round reads at most 240 small windows a service.
        a, _ = _side(self.query, service, a_start, a_end, a_label, 60, most=120)
        b, _ = _side(self.query, service, b_start, b_end, b_label, 60, most=120)
        if len(a) < 2 or len(b) < 2:
            return []
        options = Options(fail_above=self.fail_above)
        comparison = compare(a, b, options, frames=frames_of(self.query, a, b))
        rows = []
        for finding in comparison.regressions():
            key = f"{service}\0{finding.function}\0{finding.kind}\0{what}"
            row = {
                "id": event_id(key, 0),  # the same regression found again is not new
                "found_at": float(end),
                "service": service,
                "function": finding.function,
                "kind": finding.kind,
                "a_share": finding.a_share,
                "b_share": finding.b_share,
                "change": finding.change,
                "ci_low": finding.ci_low,
                "ci_high": finding.ci_high,
                "q": finding.q,
                "compared": what,
                "a_from": a_start,
                "a_to": a_end,
                "b_from": b_start,
                "b_to": b_end,
                "a_label": f"{a_label[0]}:{a_label[1]}" if a_label else "",
                "b_label": f"{b_label[0]}:{b_label[1]}" if b_label else "",
                "sent": 0,
            }
            row["link"] = self._link(row)
            rows.append(row)
        return self._record(rows)

    def _baseline(self, service: str, start: int, end: int) -> Any:
        """(side A, side B, what is compared), or None when there is nothing to compare."""
        filters = Filters(services=(service,))
        now_versions = self.query.label_values(start, end, filters).get("version", [])
        if now_versions:
            # The newest version live in the window (a rollout runs both for a while) against
            # the one seen last before it: found from the first round after a deploy.
            current = max(now_versions, key=_version_order)
            seen = self.query.label_values(end - DAY, end, filters).get("version", [])
            previous = [v for v in seen if v != current]
            if previous:
                last = max(previous, key=lambda v: self._last_seen(service, v, end - DAY, end))
                # The previous version's last hour: its samples next to the new one's.
                return (
                    (end - HOUR, end, ("version", last)),
                    (start, end, ("version", current)),
                    f"version {last} -> {current}",
                )
        day = time.strftime("%Y-%m-%d", time.gmtime(start))
        return (
            (start - DAY, end - DAY, None),
            (start, end, None),
            f"same window a day earlier, {day}",
        )

    def _last_seen(self, service: str, version: str, start: int, end: int) -> int:
        filters = Filters(services=(service,), labels=(("version", version),))
        points = self.query.timeline(start, end, filters)
        return max((t for t, count in points if count), default=start)

    def _link(self, row: dict[str, Any]) -> str:
        names = ["service", "a_from", "a_to", "b_from", "b_to"]
        if row["a_label"]:
            names += ["a_label", "b_label"]
        # Every value percent-encoded: a version such as 1.4.2+build.8 (a '+' reads as a
        # space), or a service holding '&' or '#', would otherwise name something else. ':' and
        # '/' stay as they are, so a link still reads a_label=version:1.4.2.
        query = urllib.parse.urlencode(
            [(name, str(row[name])) for name in names], quote_via=urllib.parse.quote, safe=":/"
        )
        return f"{self.link_base}/compare?{query}"

    def _record(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Inserts the findings not recorded before; returns those."""
        if not rows:
            return []
        table = schema.findings
        with self._lock, translate_errors("recording findings"):
            with self.store.engine.write_transaction() as conn:
                known = set(
                    conn.execute(
                        sa.select(table.c.id).where(table.c.id.in_([r["id"] for r in rows]))
                    ).scalars()
                )
                new = [r for r in rows if r["id"] not in known]
                if new:
                    conn.execute(table.insert(), new)
        for row in new:
            log_event(
                log,
                logging.WARNING,
                "regression found",
                service=row["service"],
                function=row["function"],
                kind=row["kind"],
                change=round(row["change"], 2),
                compared=row["compared"],
                link=row["link"],
            )
            if self.webhook is not None:
                self.webhook.send(row)
        return new

    def mark_sent(self, finding_id: int) -> None:
        table = schema.findings
        with self._lock, translate_errors("marking a finding sent"):
            with self.store.engine.write_transaction() as conn:
                conn.execute(table.update().where(table.c.id == finding_id).values(sent=1))


class WebhookSender:
    """POSTs findings to a URL from a thread of its own, retrying with exponential backoff."""

    def __init__(
        self,
        url: str,
        *,
        attempts: int = 6,
        first_delay: float = 1.0,
        timeout: float = 10.0,
        on_sent: Callable[[int], None] | None = None,
    ) -> None:
        self.url = url
        self.attempts = attempts
        self.first_delay = first_delay
        self.timeout = timeout
        self.on_sent = on_sent
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=10_000)
        self._thread = threading.Thread(target=self._run, name="fleetflame-webhook", daemon=True)
        self._thread.start()

    def send(self, finding: dict[str, Any]) -> None:
        """Queues a finding (dropped, and logged, if 10,000 wait already)."""
        try:
            self._queue.put_nowait(finding)
        except queue.Full:
            log_event(log, logging.ERROR, "webhook queue full; finding not sent", id=finding["id"])

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while (finding := self._queue.get()) is not None:
            body = json.dumps({"finding": finding}, default=str).encode()
            delay = self.first_delay
            for attempt in range(1, self.attempts + 1):
                try:
                    request = urllib.request.Request(
                        self.url, data=body, headers={"Content-Type": "application/json"}
                    )
                    with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                        answer.read()
                    if self.on_sent is not None:
                        self.on_sent(finding["id"])
                    break
                except Exception as exc:  # noqa: BLE001 - any failure is retried, then logged
                    if attempt == self.attempts:
                        log_event(
                            log,
                            logging.ERROR,
                            "webhook failed; finding not sent",
                            id=finding["id"],
                            attempts=attempt,
                            error=str(exc)[:200],
                        )
                        break
                    time.sleep(delay)
                    delay *= 2


def _version_order(version: str) -> tuple[tuple[int, int | str], ...]:
    """Versions as people number them: 1.4.10 after 1.4.9 (numbers before words)."""
    parts = version.replace("-", ".").split(".")
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)
