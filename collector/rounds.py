"""Poll rounds: every target fetched once, each result turned into a delta and queued for writing.

A round starts the fetches and returns; each result is decoded and turned into a delta on the
pool thread that fetched it, as soon as it arrives, and handed to the writer. A round never
waits for a straggler: a target whose previous poll is still in flight (one that hangs or
drips, for up to ``fetch_deadline``, or one waiting for room in the write buffer) is skipped
by the next round, so the other targets keep their cadence. Targets whose last poll timed out
go last in a round, and their polls hold half the pool's threads at most (the others wait
for one of them to end): more of them than the pool has threads would otherwise keep every
healthy target waiting for a thread.

Targets' states (the cumulative counts last seen) and the fleet's stack table are shared by
the pool threads under one lock; a target is never polled twice at once, so its state only
changes through its own poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from collector.deltas import Part, compute_delta
from collector.health import Metrics
from collector.logs import log_event
from collector.poller import Poller, PollResult
from collector.states import StackTable, TargetState
from collector.store import Store, StoreError
from collector.targets import Target
from collector.writer import Writer
from sampler.profile import DocumentError, Limits

__all__ = ["Round", "RoundReport", "Rounds"]

log = logging.getLogger("collector.rounds")

_SWEEP_FLOOR = 100_000  # stacks the table may hold before it is first swept


@dataclass(frozen=True)
class RoundReport:
    """What one poll round did (returned for tests, the CLI's --once and the benchmark)."""

    targets: int
    ok: int
    failed: int
    rows: int
    samples: int
    fetch_seconds: float  # from the round's start to its last result (fetch, decode, delta)
    write_seconds: float = 0.0  # writing what was queued, when the round waited for it
    written: bool = True  # everything queued was written (for a round that waited for it)
    skipped: str = ""  # why the round did not poll ("" when it did)
    skipped_targets: int = 0  # targets still in flight from an earlier round
    cpu_seconds: float = 0.0  # CPU of the fetches, decoding and deltas, all threads
    received_bytes: int = 0
    closed: int = 0  # range ports with nothing listening (workers not running: no failure)


# A poll to start: its round, its target and the query of its request.
_Job = tuple["Round", Target, str]


class Round:
    """One round in progress; ``wait()`` returns its report once every result is in."""

    def __init__(self, targets: int, started: float, bucket: int, polled: float) -> None:
        self.bucket = bucket
        self.polled = polled  # the collector's clock when the round started
        self._started = started
        self._targets = targets
        self._counts = {"ok": 0, "failed": 0, "closed": 0, "rows": 0, "samples": 0, "bytes": 0}
        self._cpu = 0.0
        self._pending = 0
        self._skipped = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.report: RoundReport | None = None

    def wait(self, timeout: float | None = None) -> RoundReport:
        """Blocks until every polled target's result is in; returns the report."""
        if not self._done.wait(timeout):
            raise TimeoutError("the poll round is still running")
        assert self.report is not None
        return self.report


class Rounds:
    """Starts poll rounds and turns their results into parts for the writer."""

    def __init__(
        self,
        *,
        poller: Poller,
        writer: Writer,
        store: Store,
        metrics: Metrics,
        limits: Limits,
        bucket_seconds: int,
        poll_interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.poller = poller
        self.writer = writer
        self.store = store
        self.metrics = metrics
        self.limits = limits
        self.bucket_seconds = bucket_seconds
        self.poll_interval = poll_interval
        self.clock = clock
        self.table = StackTable()
        self.states: dict[str, TargetState] = {}
        self.last_round_end: float | None = None
        self._lock = threading.Lock()  # states, the table, the sets below
        self._in_flight: set[str] = set()
        # Targets whose last poll timed out, and when a poll of each last began: those
        # waited longest go first. Their polls running, and those waiting for one to end.
        self._slow: dict[str, float] = {}
        self._slow_polls: set[str] = set()
        self._slow_waiting: deque[_Job] = deque()
        self._reload: set[str] = set()  # targets whose cursor must be re-read from the store
        self._gone: set[str] = set()  # targets that left the fleet: re-read them if they return
        self._cursors_loaded = False
        self._swept_at = _SWEEP_FLOOR

    # Cursors --------------------------------------------------------------------------------

    def load_cursors(self) -> bool:
        """Loads the stored cursors (once, or for targets marked for reload); False if the DB is down."""
        if self._cursors_loaded and not self._reload:
            return True
        try:
            with self.writer.db_lock:
                stored = self.store.load_cursors()
        except StoreError as exc:
            self.metrics.set("fleetflame_collector_database_up", 0)
            log_event(log, logging.WARNING, "cannot load cursors; not polling yet", error=str(exc))
            return False
        self.metrics.set("fleetflame_collector_database_up", 1)
        with self._lock:
            wanted = set(stored) if not self._cursors_loaded else self._reload - self._in_flight
            for target in wanted:
                self.states.pop(target, None)
                cursor = stored.get(target)
                if cursor is not None:
                    self.states[target] = TargetState.from_cursor(cursor, self.table)
            self._reload -= wanted
        if not self._cursors_loaded:
            log_event(log, logging.INFO, "cursors loaded", targets=len(stored))
        self._cursors_loaded = True
        return True

    def forget(self, address: str) -> None:
        """Drops a target's state and queued parts; its cursor is re-read before its next poll."""
        with self._lock:
            self.states.pop(address, None)
            self._reload.add(address)
        self.writer.discard(address)

    # Rounds ---------------------------------------------------------------------------------

    def start(self, targets: Sequence[Target]) -> Round:
        """Starts polling every target not still in flight; returns at once."""
        started = time.monotonic()
        self.metrics.set("fleetflame_collector_targets", len(targets))
        now = self.clock()
        bucket = int(now) - int(now) % self.bucket_seconds
        current = Round(len(targets), started, bucket, now)
        self._tidy({t.address for t in targets})
        if not self.load_cursors():
            current.report = RoundReport(
                len(targets), 0, 0, 0, 0, 0.0, written=False, skipped="no cursors"
            )
            current._done.set()
            return current
        jobs: list[_Job] = []
        slow_jobs: list[_Job] = []
        with self._lock:
            slow = self._slow
            # The slow last, the one waiting longest first among them.
            for target in sorted(
                targets, key=lambda t: (t.address in slow, slow.get(t.address, 0))
            ):
                if target.address in self._in_flight:
                    current._skipped += 1
                    continue
                self._in_flight.add(target.address)
                state = self.states.get(target.address)
                job = (current, target, state.since_query() if state is not None else "")
                (slow_jobs if target.address in slow else jobs).append(job)
            current._pending = len(jobs) + len(slow_jobs) + 1  # +1 until every job is submitted
            # Slow targets' polls hold half the pool at most: the rest wait for one to end.
            self._slow_waiting.extend(slow_jobs)
            room = max(1, self.poller.concurrency // 2) - len(self._slow_polls)
            jobs += self._next_slow(room)
        if current._skipped:
            self._count_and_warn(
                "fleetflame_collector_skipped_polls_total",
                current._skipped,
                "targets still being polled since an earlier round; skipped this round",
                targets=current._skipped,
            )
        for job in jobs:
            self._submit(job)
        self._finished_one(current)
        return current

    def _next_slow(self, room: int) -> list[_Job]:
        """Takes up to ``room`` waiting slow targets' polls to start (under the lock)."""
        taken = []
        while room > 0 and self._slow_waiting:
            job = self._slow_waiting.popleft()
            self._slow_polls.add(job[1].address)
            self._slow[job[1].address] = time.monotonic()
            taken.append(job)
            room -= 1
        return taken

    def _submit(self, job: _Job) -> None:
        """Starts a poll. Its samples count in the bucket of when it starts: a slow target's
        may have waited beyond its round's. A poller closed meanwhile (the collector
        stopping) polls nothing more: the job is over."""
        current, target, query = job
        now = self.clock()
        bucket = int(now) - int(now) % self.bucket_seconds
        try:
            self.poller.submit(
                target, query, lambda r, c=current, b=bucket, t=now: self._handle(c, r, b, t)
            )
        except RuntimeError:  # cannot schedule new futures after shutdown
            self._drop([job])

    def _drop(self, jobs: Sequence[_Job]) -> None:
        """Ends jobs that will not be polled (their rounds count them as done)."""
        with self._lock:
            for _, target, _ in jobs:
                self._in_flight.discard(target.address)
                self._slow_polls.discard(target.address)
        for current, _, _ in jobs:
            self._finished_one(current)

    def close(self) -> None:
        """Ends the slow targets' polls still waiting (the collector is stopping)."""
        with self._lock:
            waiting = list(self._slow_waiting)
            self._slow_waiting.clear()
        self._drop(waiting)

    def _tidy(self, current: set[str]) -> None:
        """Drops the states of targets that left the fleet and sweeps the stack table."""
        with self._lock:
            for address in self._gone & current:
                self._reload.add(address)  # back again: its stored cursor is the truth
            self._gone -= current
            for address in self._slow.keys() - current:
                del self._slow[address]
            # Waiting slow targets that left (a scaled-down pod): not polled after all.
            gone = [job for job in self._slow_waiting if job[1].address not in current]
            if gone:
                self._slow_waiting = deque(j for j in self._slow_waiting if j not in gone)
        if gone:
            self._drop(gone)
        with self._lock:
            for address in set(self.states) - current - self._in_flight:
                del self.states[address]
                self._gone.add(address)
            if len(self.table) > self._swept_at:
                self.table.sweep(sid for state in self.states.values() for sid in state.stack_ids())
                self._swept_at = max(_SWEEP_FLOOR, 2 * len(self.table))

    def _handle(self, current: Round, result: PollResult, bucket: int, polled: float) -> None:
        address = result.target.address
        part = None
        outcome = "failed"
        cpu = time.thread_time()
        try:
            outcome, part = self._consume(result, bucket)
            cpu = time.thread_time() - cpu
            if part is not None:
                self.writer.put(part, polled)
                with self._lock:
                    stale = address in self._reload
                if stale:  # its delta was refused meanwhile: the cursor is re-read first
                    self.writer.discard(address)
        except Exception as exc:  # noqa: BLE001 - a bug must cost one target, not the round
            log_event(log, logging.ERROR, "poll result failed", target=address, error=repr(exc))
            cpu = 0.0
        finally:
            with self._lock:
                self._in_flight.discard(address)
                if result.reason != "timeout":
                    self._slow.pop(address, None)
                elif address not in self._slow:
                    self._slow[address] = current._started
                was_slow = address in self._slow_polls
                self._slow_polls.discard(address)
                following = self._next_slow(1) if was_slow else []
            with current._lock:
                counts = current._counts
                counts[outcome] += 1
                counts["rows"] += part.rows if part is not None else 0
                counts["samples"] += part.samples if part is not None else 0
                counts["bytes"] += result.nbytes
                current._cpu += result.cpu_seconds + cpu
            self._finished_one(current)
            for job in following:  # a slow target's poll ended: the next waiting one starts
                self._submit(job)

    def _finished_one(self, current: Round) -> None:
        with current._lock:
            current._pending -= 1
            if current._pending:
                return
        seconds = time.monotonic() - current._started
        counts = current._counts
        current.report = RoundReport(
            targets=current._targets,
            ok=counts["ok"],
            failed=counts["failed"],
            rows=counts["rows"],
            samples=counts["samples"],
            fetch_seconds=seconds,
            skipped_targets=current._skipped,
            cpu_seconds=current._cpu,
            received_bytes=counts["bytes"],
            closed=counts["closed"],
        )
        self.last_round_end = self.clock()
        self.metrics.observe("fleetflame_collector_poll_cycle_seconds", seconds)
        if seconds > self.poll_interval:
            self._count_and_warn(
                "fleetflame_collector_overruns_total",
                1,
                "poll cycle overran the interval",
                seconds=round(seconds, 3),
                interval=self.poll_interval,
            )
        log_event(
            log,
            logging.INFO,
            "poll cycle done",
            targets=current._targets,
            ok=counts["ok"],
            failed=counts["failed"],
            closed=counts["closed"],
            skipped=current._skipped,
            rows=counts["rows"],
            samples=counts["samples"],
            fetch_s=round(seconds, 3),
            cpu_s=round(current._cpu, 3),
            buffered_rows=self.writer.buffered_rows,
        )
        self.writer.round_done()
        current._done.set()

    # One result -----------------------------------------------------------------------------

    def _consume(self, result: PollResult, bucket: int) -> tuple[str, Part | None]:
        """Turns one target's result into a part to write: (``ok``, ``failed`` or ``closed``,
        the part)."""
        target = result.target
        address = target.address
        self.metrics.observe("fleetflame_collector_fetch_seconds", result.seconds)
        profile, result.profile = result.profile, None  # only this poll held the document
        if profile is None:
            return self._failed(target, result.reason, result.error), None
        with self._lock:
            if address in self._reload:
                return "ok", None  # its cursor is being re-read; the next round polls it
            previous = self.states.get(address)
            old_instance = previous.instance if previous is not None else None
            try:
                delta = compute_delta(
                    address,
                    target.labels,
                    previous,
                    profile,
                    bucket=bucket,
                    table=self.table,
                    max_delta=self.limits.max_delta,
                )
            except DocumentError as exc:
                delta = None
                error = str(exc)
            else:
                self.states[address] = delta.state
        if delta is None:
            return self._failed(target, "invalid", error), None
        self.metrics.inc("fleetflame_collector_polls_total", result="ok")
        self.metrics.set("fleetflame_collector_target_up", 1, target=address)
        if delta.new_instance:
            self.metrics.inc("fleetflame_collector_new_instances_total")
            if old_instance is not None:
                log_event(
                    log,
                    logging.INFO,
                    "target has a new instance; counting from zero",
                    target=address,
                    old_instance=old_instance,
                    instance=profile.instance_id,
                )
        if delta.resets:
            self._count_and_warn(
                "fleetflame_collector_resets_total",
                delta.resets,
                "counts went down for the same instance; treated as resets",
                target=address,
                counters=delta.resets,
            )
        return "ok", delta.part

    def _failed(self, target: Target, reason: str, error: str) -> str:
        """Counts and logs a failed poll: ``failed``, or ``closed`` for a range port that
        refused (a worker that is not running: normal, not a failure)."""
        address = target.address
        self.metrics.set("fleetflame_collector_target_up", 0, target=address)
        if target.optional and reason == "refused":
            log_event(log, logging.DEBUG, "range port closed", target=address)
            return "closed"
        self.metrics.inc("fleetflame_collector_polls_total", result="failed")
        self.metrics.inc(
            "fleetflame_collector_target_failures_total", target=address, reason=reason
        )
        log_event(log, logging.WARNING, "poll failed", target=address, reason=reason, error=error)
        return "failed"

    def _count_and_warn(self, metric: str, amount: int, message: str, **fields: object) -> None:
        self.metrics.inc(metric, amount)
        log_event(log, logging.WARNING, message, **fields)

    def in_flight(self) -> int:
        """Targets being polled now."""
        return len(self._in_flight)
