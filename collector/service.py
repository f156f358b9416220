"""The running collector: the scheduled poll rounds, the write path, rollup and retention jobs.

The parts, each in its own module: ``rounds`` polls the targets and turns their snapshots into
deltas against the cursors, ``writer`` writes the deltas with the cursors that produced them,
``store`` keeps both. This module wires them together and schedules them (APScheduler): a poll
round every ``poll_interval`` that does not wait for the previous one's stragglers, a writer
thread, and the maintenance jobs. A restart neither loses nor double counts: cursors are
loaded from the database before the first poll, and polling waits until they can be.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from collector.findings import FindingsJob, WebhookSender
from collector.health import HealthServer, Metrics
from collector.logs import log_event
from collector.poller import Poller
from collector.rounds import RoundReport, Rounds
from collector.settings import Settings, SettingsError
from collector.store import Store, StoreError, StoreUnavailable
from collector.targets import TargetSet, parse_shard
from collector.worst import WorstCases
from collector.writer import Writer
from sampler.profile import Limits

__all__ = ["Collector"]

log = logging.getLogger("collector.service")


class Collector:
    """Polls the fleet and writes deltas to the store; runs scheduled or one round at a time."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.store = store or Store(
            settings.database_url,
            bucket_seconds=settings.bucket_seconds,
            retention_seconds=settings.retention_days * 86400,
            busy_timeout=settings.db_busy_timeout,
        )
        self.targets = TargetSet(
            settings.targets,
            static_labels=settings.target_labels,
            files=settings.target_files,
            shard=parse_shard(settings.shard),
        )
        limits = Limits(max_stacks=settings.max_stacks, max_count=settings.max_count)
        self.metrics = Metrics()
        self.poller = Poller(
            concurrency=settings.poll_concurrency,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            deadline=settings.fetch_deadline,
            max_bytes=settings.max_response_bytes,
            limits=limits,
            token=settings.token,
        )
        self.writer = Writer(
            self.store,
            self.metrics,
            max_rows=settings.buffer_max_rows,
            retry_seconds=settings.poll_interval,
            on_refused=lambda target: self.rounds.forget(target),
            clock=clock,
        )
        self.rounds = Rounds(
            poller=self.poller,
            writer=self.writer,
            store=self.store,
            metrics=self.metrics,
            limits=limits,
            bucket_seconds=settings.bucket_seconds,
            poll_interval=settings.poll_interval,
            clock=clock,
        )
        self.worst = WorstCases(
            self.store,
            bucket_seconds=settings.bucket_seconds,
            timeout=(settings.connect_timeout, settings.read_timeout),
            token=settings.token,
            lock=self.writer.db_lock,
        )
        self.webhook = (
            WebhookSender(settings.findings_webhook, on_sent=lambda i: self.findings.mark_sent(i))
            if settings.findings_webhook
            else None
        )
        self.findings = FindingsJob(
            self.store,
            window=settings.findings_window,
            fail_above=settings.findings_fail_above,
            webhook=self.webhook,
            link_base=settings.web_url,
            lock=self.writer.db_lock,
        )
        self._cycle_lock = threading.Lock()
        self._started = clock()
        self._scheduler: Any = None
        self._health: HealthServer | None = None
        self._stopped = threading.Event()
        self._awaiting_database = False  # at start, until the schema is migrated

    # One round at a time (tests, --once, the benchmark) ---------------------------------------

    def poll_cycle(self) -> RoundReport:
        """Polls every target once, waits for every result, and writes what was queued."""
        if not self._cycle_lock.acquire(blocking=False):
            self.metrics.inc("fleetflame_collector_overruns_total")
            log_event(log, logging.WARNING, "poll cycle still running; this one is skipped")
            return RoundReport(0, 0, 0, 0, 0, 0.0, written=False, skipped="overrun")
        try:
            report = self.rounds.start(self.targets.current()).wait()
            if report.skipped:
                return report
            started = time.monotonic()
            written = self.writer.flush()
            return replace(report, write_seconds=time.monotonic() - started, written=written)
        finally:
            self._cycle_lock.release()

    def buffered_rows(self) -> int:
        """Sample rows queued in memory, not yet written."""
        return self.writer.buffered_rows

    # Maintenance jobs -----------------------------------------------------------------------

    def rollup(self) -> None:
        """Runs the store's rollup; a database outage is logged and retried at the next run."""
        self._maintain("rollup", self.store.rollup)

    def apply_retention(self) -> None:
        """Runs the store's retention; a database outage is logged and retried at the next run."""
        self._maintain("retention", self.store.apply_retention)
        try:
            self.worst.apply_retention(self.clock() - self.settings.retention_days * 86400)
        except StoreError as exc:
            log_event(log, logging.WARNING, "worst cases retention failed", error=str(exc))

    def find_regressions(self) -> list[dict[str, Any]]:
        """Runs the scheduled comparison once (a database outage is logged and retried)."""
        try:
            return self.findings.run(self.clock())
        except StoreError as exc:
            log_event(log, logging.WARNING, "findings failed; will retry", error=str(exc))
            return []

    def poll_worst(self) -> dict[str, int]:
        """Reads and stores every target's stalls and slow requests once (a database outage is
        logged: what was read is read again, cumulative, at the next run)."""
        try:
            return self.worst.poll(self.targets.current(), self.clock())
        except StoreError as exc:
            log_event(
                log, logging.WARNING, "storing worst cases failed; will retry", error=str(exc)
            )
            return {}

    def _maintain(self, name: str, job: Callable[[int], None]) -> None:
        started = time.monotonic()
        try:
            with self.writer.db_lock:
                job(int(self.clock()))
        except StoreError as exc:
            log_event(log, logging.WARNING, f"{name} failed; will retry", error=str(exc))
            return
        log_event(log, logging.INFO, f"{name} done", seconds=round(time.monotonic() - started, 3))

    # Health ---------------------------------------------------------------------------------

    def status(self) -> tuple[bool, dict[str, Any]]:
        """Healthy while poll rounds keep completing, or while it waits at start for the
        database (alive, doing what it should); the database state is reported, not fatal."""
        if self._awaiting_database:
            return True, {"awaiting_database": True, "database_up": False}
        now = self.clock()
        last = self.rounds.last_round_end
        stale_after = 3 * self.settings.poll_interval + self.settings.fetch_deadline
        reference = last if last is not None else self._started
        lag = round(self.writer.lag(), 3)
        self.metrics.set("fleetflame_collector_buffered_rows", self.writer.buffered_rows)
        self.metrics.set("fleetflame_collector_lag_seconds", lag)
        return now - reference <= stale_after, {
            "last_cycle_age_seconds": None if last is None else round(now - last, 3),
            "database_up": bool(self.metrics.get("fleetflame_collector_database_up")),
            "buffered_rows": self.writer.buffered_rows,
            "lag_seconds": lag,
            "targets": int(self.metrics.get("fleetflame_collector_targets")),
        }

    # Running --------------------------------------------------------------------------------

    def start(self, *, migrate: bool = True) -> None:
        """Migrates the schema, starts the health server, the writer and the scheduled jobs."""
        from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES
        from apscheduler.schedulers.background import BackgroundScheduler

        self._awaiting_database = migrate
        listen = self.settings.health_listen
        if listen:  # first: a liveness probe is answered while the database is awaited
            try:
                self._health = HealthServer(listen, self.metrics, self.status)
            except OSError as exc:
                raise SettingsError(
                    f"health_listen: cannot listen on {listen!r}: {exc.strerror or exc}"
                ) from exc
            log_event(log, logging.INFO, "health server listening", url=self._health.url)
        if migrate:
            self.migrate()
            if self._stopped.is_set():
                return  # stopped while it waited for the database: nothing to start
            self._started = self.clock()  # rounds are due from now on
        self.writer.start()
        scheduler = BackgroundScheduler(timezone="UTC")
        interval = self.settings.poll_interval
        jobs: tuple[tuple[str, Callable[[], object], float], ...] = (
            # Starting a round only submits its fetches: it returns at once, so rounds start on
            # time whatever the targets do, and a target still in flight is skipped.
            ("poll", lambda: self.rounds.start(self.targets.current()), interval),
            ("rollup", self.rollup, self.settings.rollup_interval),
            ("retention", self.apply_retention, self.settings.retention_interval),
        )
        if self.settings.worst_interval > 0:
            jobs += (("worst", self.poll_worst, self.settings.worst_interval),)
        if self.settings.findings_interval > 0:
            jobs += (("findings", self.find_regressions, self.settings.findings_interval),)
        for job_id, func, seconds in jobs:
            # max_instances=1 + coalesce: a maintenance run that overruns is never stacked;
            # missed runs collapse into one that starts when the previous one ends.
            scheduler.add_job(
                func,
                "interval",
                seconds=seconds,
                id=job_id,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(1, int(seconds)),
                next_run_time=_utcnow(),
            )
        scheduler.add_listener(self._on_job_event, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_ERROR)
        scheduler.start()
        self._scheduler = scheduler
        log_event(
            log,
            logging.INFO,
            "collector started",
            interval=interval,
            shard=self.settings.shard,
            database=_redact(self.settings.database_url),
        )

    def migrate(self, *, wait: bool = True) -> None:
        """Brings the schema up to date, waiting for the database if it is not reachable yet
        (``wait=False``: StoreUnavailable at once, as a one-shot run wants)."""
        delay = 1.0
        while not self._stopped.is_set():
            try:
                with self.writer.db_lock:
                    self.store.migrate()
                self._awaiting_database = False
                return
            except StoreUnavailable as exc:
                if not wait:
                    raise
                log_event(log, logging.WARNING, "database unavailable; retrying", error=str(exc))
                self._stopped.wait(delay)
                delay = min(delay * 2, 30.0)

    def _on_job_event(self, event: Any) -> None:
        from apscheduler.events import EVENT_JOB_MAX_INSTANCES

        if event.code == EVENT_JOB_MAX_INSTANCES:
            log_event(
                log,
                logging.WARNING,
                "previous run still going; this run is skipped, not stacked",
                job=event.job_id,
            )
        else:
            log_event(
                log, logging.ERROR, "job crashed", job=event.job_id, error=repr(event.exception)
            )

    def request_stop(self) -> None:
        """Makes ``wait()`` return (safe from a signal handler)."""
        self._stopped.set()

    def wait(self) -> None:
        """Blocks until ``request_stop()`` or ``stop()`` is called."""
        while not self._stopped.wait(1.0):
            pass

    def stop(self) -> None:
        """Stops the jobs, lets running polls end, makes a last attempt to write and closes."""
        self._stopped.set()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        self.writer.stop()
        self.rounds.close()  # slow targets' polls still waiting: not started now
        self.poller.close()
        self.worst.close()
        if self.webhook is not None:
            self.webhook.stop()
        if not self.writer.flush():
            log_event(
                log,
                logging.ERROR,
                "stopping with deltas not written; the next start polls them again",
                rows=self.writer.buffered_rows,
            )
        if self._health is not None:
            self._health.stop()
            self._health = None
        self.store.close()

    @property
    def health_url(self) -> str | None:
        """The URL of the health server, when it runs."""
        return self._health.url if self._health is not None else None


def _utcnow() -> Any:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc)


def _redact(url: str) -> str:
    """Hides a password in a database URL for logging."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}" if ":" in credentials else url
