"""The running collector: scheduled poll cycles, the write buffer, rollup and retention jobs.

Each poll cycle fetches every target, turns the snapshots into deltas against the in-memory
cursors, queues the rows together with their cursor updates, and writes the queue to the store.
Rows and the cursors that produced them always travel (and commit) together, so:

- the database unreachable: the queue is kept in memory, bounded by ``buffer_max_rows``; past
  the bound the oldest rows are dropped (counted and logged) but their cursor updates are folded
  into the next batch, so what is written later is never counted twice;
- a restart: cursors are loaded from the database before the first poll, and polling waits
  until they can be, so a restart neither loses nor double counts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from collector.deltas import Limits, ProfileError, TargetState, compute_delta, merge_cursor_updates
from collector.health import HealthServer, Metrics
from collector.logs import log_event
from collector.poller import Poller, PollResult
from collector.settings import Settings
from collector.store import CursorUpdate, InvalidRow, SampleRow, Store, StoreError, StoreUnavailable
from collector.targets import Target, TargetSet, parse_shard

__all__ = ["Collector", "CycleReport"]

log = logging.getLogger("collector.service")


@dataclass
class _Pending:
    """One poll cycle's output waiting to be written: per target, its rows and cursor update."""

    created: float
    parts: dict[str, tuple[list[SampleRow], CursorUpdate]] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(len(rows) for rows, _ in self.parts.values())

    def samples(self) -> int:
        return sum(row.count for rows, _ in self.parts.values() for row in rows)


@dataclass(frozen=True)
class CycleReport:
    """What one poll cycle did (returned for tests, the CLI's --once and the benchmark)."""

    targets: int
    ok: int
    failed: int
    rows: int
    samples: int
    fetch_seconds: float  # fetch, parse, validate and delta, all targets
    write_seconds: float
    written: bool  # the queue was fully written
    skipped: str = ""  # why the cycle did not poll ("" when it did)


class Collector:
    """Polls the fleet and writes deltas to the store; runs scheduled or one cycle at a time."""

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
        self.limits = Limits(max_stacks=settings.max_stacks, max_count=settings.max_count)
        self.poller = Poller(
            concurrency=settings.poll_concurrency,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            deadline=settings.fetch_deadline,
            max_bytes=settings.max_response_bytes,
            limits=self.limits,
            token=settings.token,
        )
        self.metrics = Metrics()
        self.states: dict[str, TargetState] = {}
        self.pending: deque[_Pending] = deque()
        self._cursors_loaded = False
        self._reload: set[str] = set()  # targets whose cursor must be re-read from the store
        self._db_lock = threading.Lock()  # one database operation at a time (SQLite has one writer)
        self._cycle_lock = threading.Lock()
        self._last_cycle_end: float | None = None
        self._started = clock()
        self._scheduler: Any = None
        self._health: HealthServer | None = None
        self._stopped = threading.Event()

    # Cursors --------------------------------------------------------------------------------

    def load_cursors(self) -> bool:
        """Loads the stored cursors (once, or for targets marked for reload); False if the DB is down."""
        if self._cursors_loaded and not self._reload:
            return True
        try:
            with self._db_lock:
                stored = self.store.load_cursors()
        except StoreError as exc:
            self.metrics.set("fleetflame_collector_database_up", 0)
            log_event(log, logging.WARNING, "cannot load cursors; not polling yet", error=str(exc))
            return False
        self.metrics.set("fleetflame_collector_database_up", 1)
        wanted = set(stored) if not self._cursors_loaded else self._reload
        for target in wanted:
            self.states.pop(target, None)
            cursor = stored.get(target)
            if cursor is not None:
                self.states[target] = TargetState(
                    cursor.instance, dict(cursor.counts), dict(cursor.label_sets)
                )
        if not self._cursors_loaded:
            log_event(log, logging.INFO, "cursors loaded", targets=len(stored))
        self._cursors_loaded = True
        self._reload.clear()
        return True

    # One cycle ------------------------------------------------------------------------------

    def poll_cycle(self) -> CycleReport:
        """Polls every target once, queues the deltas and writes the queue."""
        if not self._cycle_lock.acquire(blocking=False):
            self.metrics.inc("fleetflame_collector_overruns_total")
            log_event(log, logging.WARNING, "poll cycle still running; this one is skipped")
            return CycleReport(0, 0, 0, 0, 0, 0.0, 0.0, False, skipped="overrun")
        try:
            return self._poll_cycle()
        finally:
            self._cycle_lock.release()

    def _poll_cycle(self) -> CycleReport:
        started = time.monotonic()
        if not self.load_cursors():
            self._update_gauges()
            return CycleReport(0, 0, 0, 0, 0, 0.0, 0.0, False, skipped="no cursors")
        now = self.clock()
        bucket = int(now) - int(now) % self.settings.bucket_seconds
        targets = self.targets.current()
        self.metrics.set("fleetflame_collector_targets", len(targets))
        pending = _Pending(created=now)
        outcome = {"ok": 0, "failed": 0, "samples": 0}

        def handle(result: PollResult) -> None:
            # Runs in this thread as results arrive, overlapping the remaining fetches.
            part = self._consume(result, bucket)
            if part is None:
                return
            outcome["ok"] += 1
            rows, cursor = part
            if cursor is not None:
                pending.parts[result.target.address] = (rows, cursor)
                outcome["samples"] += sum(row.count for row in rows)

        self.poller.poll(targets, on_result=handle, query=self._since_query)
        outcome["failed"] = len(targets) - outcome["ok"]
        fetched = time.monotonic()
        if pending.parts:
            self.pending.append(pending)
        self._enforce_bound()
        written = self.flush()
        ended = time.monotonic()
        self._last_cycle_end = self.clock()
        self.metrics.observe("fleetflame_collector_poll_cycle_seconds", ended - started)
        if ended - started > self.settings.poll_interval:
            log_event(
                log,
                logging.WARNING,
                "poll cycle overran the interval",
                seconds=round(ended - started, 3),
                interval=self.settings.poll_interval,
            )
        report = CycleReport(
            targets=len(targets),
            ok=outcome["ok"],
            failed=outcome["failed"],
            rows=pending.rows,
            samples=outcome["samples"],
            fetch_seconds=fetched - started,
            write_seconds=ended - fetched,
            written=written,
        )
        log_event(
            log,
            logging.INFO,
            "poll cycle done",
            targets=report.targets,
            ok=report.ok,
            failed=report.failed,
            rows=report.rows,
            samples=report.samples,
            fetch_s=round(report.fetch_seconds, 3),
            write_s=round(report.write_seconds, 3),
            buffered_rows=self.buffered_rows(),
        )
        return report

    def _since_query(self, target: Target) -> str:
        # Incremental reads: a target whose counts the collector holds up to a sampler tick
        # sends only the stacks counted since (docs/wire-format.md).
        state = self.states.get(target.address)
        return state.since_query() if state is not None else ""

    def _consume(
        self, result: PollResult, bucket: int
    ) -> tuple[list[SampleRow], CursorUpdate | None] | None:
        """Turns one target's result into rows and a cursor update; None when it failed."""
        target = result.target
        address = target.address
        self.metrics.observe("fleetflame_collector_fetch_seconds", result.seconds)
        if result.profile is None:
            self._failed(target, result.reason, result.error)
            return None
        previous = self.states.get(address)
        try:
            delta = compute_delta(
                address,
                target.labels,
                previous,
                result.profile,
                bucket=bucket,
                max_delta=self.limits.max_delta,
            )
        except ProfileError as exc:
            self._failed(target, "invalid", str(exc))
            return None
        self.metrics.inc("fleetflame_collector_polls_total", result="ok")
        self.metrics.set("fleetflame_collector_target_up", 1, target=address)
        if delta.new_instance:
            self.metrics.inc("fleetflame_collector_new_instances_total")
            if previous is not None:
                log_event(
                    log,
                    logging.INFO,
                    "target has a new instance; counting from zero",
                    target=address,
                    old_instance=previous.instance,
                    instance=result.profile.instance_id,
                )
        if delta.resets:
            self.metrics.inc("fleetflame_collector_resets_total", delta.resets)
            log_event(
                log,
                logging.WARNING,
                "counts went down for the same instance; treated as resets",
                target=address,
                counters=delta.resets,
            )
        self.states[address] = delta.state
        return delta.rows, delta.cursor

    def _failed(self, target: Target, reason: str, error: str) -> None:
        address = target.address
        # A closed port in a range is a worker that is not running: normal, not a failure.
        if target.optional and reason == "refused":
            log_event(log, logging.DEBUG, "range port closed", target=address)
            self.metrics.set("fleetflame_collector_target_up", 0, target=address)
            return
        self.metrics.inc("fleetflame_collector_polls_total", result="failed")
        self.metrics.inc(
            "fleetflame_collector_target_failures_total", target=address, reason=reason
        )
        self.metrics.set("fleetflame_collector_target_up", 0, target=address)
        log_event(log, logging.WARNING, "poll failed", target=address, reason=reason, error=error)

    # Writing --------------------------------------------------------------------------------

    def buffered_rows(self) -> int:
        """Sample rows queued in memory, not yet written."""
        return sum(p.rows for p in self.pending)

    def _enforce_bound(self) -> None:
        """Drops the oldest queued rows past ``buffer_max_rows``, keeping their cursor updates."""
        limit = self.settings.buffer_max_rows
        total = self.buffered_rows()
        dropped_rows = dropped_samples = 0
        while total > limit and self.pending:
            oldest = self.pending[0]
            dropped_rows += oldest.rows
            dropped_samples += oldest.samples()
            total -= oldest.rows
            cursors_only = {t: ([], cursor) for t, (_rows, cursor) in oldest.parts.items()}
            if len(self.pending) > 1:
                self.pending.popleft()
                newer = self.pending[0]
                for address, (rows, cursor) in newer.parts.items():
                    if address in cursors_only:
                        cursor = merge_cursor_updates(cursors_only[address][1], cursor)
                    cursors_only[address] = (rows, cursor)
                newer.parts = cursors_only
                newer.created = oldest.created
            else:
                oldest.parts = cursors_only
        if dropped_rows:
            self.metrics.inc("fleetflame_collector_dropped_rows_total", dropped_rows)
            log_event(
                log,
                logging.ERROR,
                "write buffer full; dropped the oldest sample rows",
                rows=dropped_rows,
                samples=dropped_samples,
                limit=limit,
            )

    def flush(self) -> bool:
        """Writes queued batches oldest first; returns False if some are still queued."""
        with self._db_lock:
            while self.pending:
                batch = self.pending[0]
                if not self._write(batch):
                    self._update_gauges()
                    return False
                self.pending.popleft()
            self._update_gauges()
            return True

    def _write(self, batch: _Pending) -> bool:
        rows = [row for part_rows, _ in batch.parts.values() for row in part_rows]
        cursors = [cursor for _, cursor in batch.parts.values()]
        started = time.monotonic()
        try:
            self.store.write(rows, cursors)
        except StoreUnavailable as exc:
            self.metrics.set("fleetflame_collector_database_up", 0)
            log_event(
                log,
                logging.WARNING,
                "database unavailable; keeping deltas in memory",
                error=str(exc),
                buffered_rows=self.buffered_rows(),
            )
            return False
        except InvalidRow as exc:
            log_event(
                log,
                logging.ERROR,
                "store refused a batch; writing target by target",
                error=str(exc),
            )
            return self._write_each(batch)
        except StoreError as exc:
            self.metrics.set("fleetflame_collector_database_up", 0)
            log_event(log, logging.ERROR, "store write failed; will retry", error=str(exc))
            return False
        self._written(rows, time.monotonic() - started)
        return True

    def _write_each(self, batch: _Pending) -> bool:
        """Writes a refused batch one target at a time, setting aside only the bad targets."""
        for address in list(batch.parts):
            rows, cursor = batch.parts[address]
            started = time.monotonic()
            try:
                self.store.write(rows, [cursor])
            except InvalidRow as exc:
                # Forget this delta and re-read the target's cursor from the store, so the
                # samples are computed again from what the database holds: nothing is double
                # counted, and the samples are not lost if the target's next snapshot is sane.
                log_event(
                    log,
                    logging.ERROR,
                    "store refused a target's delta; re-reading its cursor",
                    target=address,
                    rows=len(rows),
                    error=str(exc),
                )
                self._forget_target(address)
            except StoreError:
                return False  # the outer loop logs and retries what is left
            else:
                self._written(rows, time.monotonic() - started)
            batch.parts.pop(address, None)  # _forget_target may have taken it out already
        return True

    def _forget_target(self, address: str) -> None:
        self.states.pop(address, None)
        self._reload.add(address)
        for later in self.pending:
            later.parts.pop(address, None)

    def _written(self, rows: list[SampleRow], seconds: float) -> None:
        self.metrics.set("fleetflame_collector_database_up", 1)
        self.metrics.inc("fleetflame_collector_rows_written_total", len(rows))
        self.metrics.inc("fleetflame_collector_samples_written_total", sum(r.count for r in rows))
        self.metrics.observe("fleetflame_collector_write_seconds", seconds)

    def _update_gauges(self) -> None:
        self.metrics.set("fleetflame_collector_buffered_rows", self.buffered_rows())
        lag = self.clock() - self.pending[0].created if self.pending else 0.0
        self.metrics.set("fleetflame_collector_lag_seconds", round(max(lag, 0.0), 3))

    # Maintenance jobs -----------------------------------------------------------------------

    def rollup(self) -> None:
        """Runs the store's rollup; a database outage is logged and retried at the next run."""
        self._maintain("rollup", self.store.rollup)

    def apply_retention(self) -> None:
        """Runs the store's retention; a database outage is logged and retried at the next run."""
        self._maintain("retention", self.store.apply_retention)

    def _maintain(self, name: str, job: Callable[[int], None]) -> None:
        started = time.monotonic()
        try:
            with self._db_lock:
                job(int(self.clock()))
        except StoreError as exc:
            log_event(log, logging.WARNING, f"{name} failed; will retry", error=str(exc))
            return
        log_event(log, logging.INFO, f"{name} done", seconds=round(time.monotonic() - started, 3))

    # Health ---------------------------------------------------------------------------------

    def status(self) -> tuple[bool, dict[str, Any]]:
        """Healthy while poll cycles keep completing; the database state is reported, not fatal."""
        now = self.clock()
        last = self._last_cycle_end
        stale_after = 3 * self.settings.poll_interval + self.settings.fetch_deadline
        reference = last if last is not None else self._started
        healthy = now - reference <= stale_after
        self._update_gauges()
        return healthy, {
            "last_cycle_age_seconds": None if last is None else round(now - last, 3),
            "database_up": bool(self.metrics.get("fleetflame_collector_database_up")),
            "buffered_rows": self.buffered_rows(),
            "lag_seconds": self.metrics.get("fleetflame_collector_lag_seconds"),
            "targets": int(self.metrics.get("fleetflame_collector_targets")),
        }

    # Running --------------------------------------------------------------------------------

    def start(self, *, migrate: bool = True) -> None:
        """Migrates the schema, starts the health server and the scheduled jobs (in the background)."""
        from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES
        from apscheduler.schedulers.background import BackgroundScheduler

        if migrate:
            self.migrate()
        if self.settings.health_listen:
            self._health = HealthServer(self.settings.health_listen, self.metrics, self.status)
            log_event(log, logging.INFO, "health server listening", url=self._health.url)
        scheduler = BackgroundScheduler(timezone="UTC")
        interval = self.settings.poll_interval
        jobs: Iterable[tuple[str, Callable[[], object], float]] = (
            ("poll", self.poll_cycle, interval),
            ("rollup", self.rollup, self.settings.rollup_interval),
            ("retention", self.apply_retention, self.settings.retention_interval),
        )
        for job_id, func, seconds in jobs:
            # max_instances=1 + coalesce: an overrunning run is never stacked; missed runs
            # collapse into one that starts when the previous one ends.
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

    def migrate(self) -> None:
        """Brings the schema up to date, waiting for the database if it is not reachable yet."""
        delay = 1.0
        while not self._stopped.is_set():
            try:
                with self._db_lock:
                    self.store.migrate()
                return
            except StoreUnavailable as exc:
                log_event(log, logging.WARNING, "database unavailable; retrying", error=str(exc))
                self._stopped.wait(delay)
                delay = min(delay * 2, 30.0)

    def _on_job_event(self, event: Any) -> None:
        from apscheduler.events import EVENT_JOB_MAX_INSTANCES

        if event.code == EVENT_JOB_MAX_INSTANCES:
            self.metrics.inc("fleetflame_collector_overruns_total")
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

    def wait(self) -> None:
        """Blocks until ``stop()`` is called (from a signal handler or another thread)."""
        while not self._stopped.wait(1.0):
            pass

    def stop(self) -> None:
        """Stops the jobs, makes a last attempt to write queued deltas and closes everything."""
        self._stopped.set()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        if self.pending and not self.flush():
            log_event(
                log,
                logging.ERROR,
                "stopping with deltas not written; the next start polls them again",
                rows=self.buffered_rows(),
            )
        if self._health is not None:
            self._health.stop()
            self._health = None
        self.poller.close()
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
