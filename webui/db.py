"""The web UI's only door to the database: a read-only store, its query object, a cache.

One ``Database`` per app holds the collector's ``Store`` (its connection pool) and ``Query``
(which caches stack names), opened on first use with a read-only URL (webui.readonly): SQLite
in ``mode=ro``, PostgreSQL with ``default_transaction_read_only``.

Three caches: the last merged profile read (one page view asks for the same window several
times: graph, table, export), reused for a few seconds or for as long as its window has
settled; an LRU of results derived from settled windows (pruned trees, tables), which cannot
change any more; and the sort order of every stack read so far (webui.model.StackIndex, the
one that takes memory: the stacks' text, once), so a window's stacks are sorted as integers.
Opening the store starts warming that index with the stacks of the last hours (webui.warmup).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from flask import Flask, current_app, g, request

from collector.query import Filters, Query, StackCounts
from collector.store import Store, StoreError, StoreUnavailable
from collector.store.engines.base import translate_errors
from sampler.profile import Profile, is_settled, rescale
from webui import indexfile
from webui.functable import FunctionIndex
from webui.model import FunctionSamples, SortedStacks, StackIndex
from webui.params import Selection
from webui.readonly import read_only_sessions, readonly_url
from webui.warmup import SAVE_EVERY, Warmer

__all__ = ["Database", "get_db", "init_app", "mark_unavailable"]

_EXTENSION = "fleetflame_db"
# How long the last profile of a window still receiving samples is reused.
_FRESH_SECONDS = 10.0
# Background work (warming, saves) waits for this long without requests: a page's requests (its
# HTML, its files, then its data) come with gaps of milliseconds between them, which are no
# moment to start a chunk of warming (~0.1 s of the CPU) in. A server busy without such a pause
# for QUIET_PATIENCE seconds uses the gaps between its requests.
QUIET_SECONDS = 0.5
QUIET_PATIENCE = 60.0


def filters_of(selection: Selection) -> Filters:
    """Returns the collector's query filters for a selection."""
    return Filters(
        mode=selection.mode,
        services=selection.services,
        hosts=selection.hosts,
        instances=selection.instances,
        labels=selection.labels,
    )


class Database:
    """The store and query object of one app, opened on first use, with a profile cache."""

    def __init__(
        self,
        url: str,
        *,
        bucket_seconds: int = 60,
        cache_entries: int = 16,
        stack_index_mb: int = 300,
        warm_hours: float = 24,
        index_dir: str = "",
        save_every: float = SAVE_EVERY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.bucket_seconds = bucket_seconds
        self.cache_entries = cache_entries
        self.stack_index_mb = stack_index_mb
        self.warm_hours = warm_hours
        self.index_file: Path | None = None
        self.functions_file: Path | None = None
        if index_dir:
            directory = os.path.expanduser(index_dir)
            try:
                self.index_file = indexfile.path_for(directory, url)
                self.functions_file = indexfile.path_for(directory, url, "functions")
            except sa.exc.ArgumentError:
                pass  # not a database URL: said when the store is opened
        self.save_every = save_every
        self.clock = clock
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._query: Query | None = None
        self._index: StackIndex | None = None
        self._functions: FunctionIndex | None = None
        self.warmer: Warmer | None = None
        self._last: tuple[Selection, float, StackCounts] | None = None
        self._results: OrderedDict[Hashable, Any] = OrderedDict()
        self._in_flight = 0
        self._last_served = -QUIET_SECONDS  # time.monotonic() as the last request ended
        self._last_quiet = time.monotonic()  # the last time idle() found a pause
        _databases.add(self)

    @property
    def query(self) -> Query:
        """The query object, opening the store on first use."""
        return self._open()[0]

    @property
    def index(self) -> StackIndex:
        """The sort order of the stacks read so far, opening the store on first use."""
        return self._open()[1]

    @property
    def functions(self) -> FunctionIndex:
        """The functions of the stacks read so far, opening the store on first use."""
        self._open()
        assert self._functions is not None
        return self._functions

    def open(self) -> None:
        """Opens the store now rather than on first use, which starts warming the index."""
        self._open()

    def _open(self) -> tuple[Query, StackIndex]:
        with self._lock:
            if self._query is None or self._index is None:
                store = Store(readonly_url(self.url), bucket_seconds=self.bucket_seconds)
                if store.dialect == "postgresql":
                    read_only_sessions(store.engine.sa_engine)
                try:  # a width the collector does not write would read only part of the data
                    store.check_bucket_seconds()
                except StoreUnavailable:
                    pass  # an outage: the requests and the warming say so, and go on
                except StoreError:
                    store.close()
                    raise
                query = Query(store)
                self._store, self._query = store, query
                self._index = StackIndex(
                    query.stack_lines,
                    max_bytes=self.stack_index_mb * 1_000_000,
                )
                # About 250 bytes a stack, against the stack index's 400 and its text.
                self._functions = FunctionIndex(
                    query.stack_lines,
                    max_bytes=self.stack_index_mb * 1_000_000 // 2,
                    known_keys=self._index.keys_of,
                )
                if self.warm_hours > 0 or self.index_file is not None:
                    self.warmer = Warmer(
                        query,
                        self._index,
                        functions=self._functions,
                        hours=self.warm_hours,
                        bucket_seconds=self.bucket_seconds,
                        clock=self.clock,
                        idle=self.idle,
                        index_file=self.index_file,
                        functions_file=self.functions_file,
                        save_every=self.save_every,
                    )
                    self.warmer.start()
            return self._query, self._index

    def serving(self, delta: int) -> None:
        """Counts requests in flight (+1 as one starts, -1 as it ends)."""
        with self._lock:
            self._in_flight += delta
            if delta < 0:
                self._last_served = time.monotonic()

    def idle(self) -> bool:
        """Tells whether no request is being served, nor was for QUIET_SECONDS, or for a
        server without such a pause for QUIET_PATIENCE, none is being served (background work
        may use the CPU)."""
        if self._in_flight > 0:
            return False
        now = time.monotonic()
        if now - self._last_served >= QUIET_SECONDS:
            self._last_quiet = now
            return True
        return now - self._last_quiet >= QUIET_PATIENCE

    def settled(self, *selections: Selection) -> bool:
        """Tells whether the windows ended long enough ago to get no more samples."""
        now = self.clock()
        return all(is_settled(s.end, now, self.bucket_seconds) for s in selections)

    def stack_counts(self, selection: Selection) -> StackCounts:
        """Returns the merged counts by stack id of a selection and their sampling interval
        (do not modify them)."""
        now = self.clock()
        with self._lock:
            last = self._last
        if last is not None and last[0] == selection:
            if now - last[1] <= _FRESH_SECONDS or self.settled(selection):
                return last[2]
        counts = self.query.stack_counts(selection.start, selection.end, filters_of(selection))
        with self._lock:
            self._last = (selection, now, counts)
        return counts

    def profile_ids(self, selection: Selection) -> dict[int, int]:
        """Returns the merged counts by stack id of a selection (do not modify them)."""
        return self.stack_counts(selection).counts

    def profile(self, selection: Selection) -> dict[str, int]:
        """Returns the merged folded counts of a selection."""
        return self.index.folded(self.profile_ids(selection))

    def read(self, selection: Selection) -> Profile:
        """Returns the merged profile of a selection: folded counts and their interval."""
        counts = self.stack_counts(selection)
        return Profile(
            self.index.folded(counts.counts), interval=counts.interval, mode=selection.mode
        )

    def function_samples(
        self,
        selection: Selection,
        *,
        limit: int | None = None,
        match: Callable[[str], bool] | None = None,
    ) -> tuple[FunctionSamples, float]:
        """Returns each frame's self and total samples in a selection, and their interval;
        with a ``limit``, totals only of the functions that can rank among the top ``limit``
        by self then total samples; with ``match``, only the frames it accepts (see
        FunctionIndex.table)."""
        counts = self.stack_counts(selection)
        return self.functions.table(counts.counts, limit=limit, match=match), counts.interval

    def sorted_stacks(self, selection: Selection) -> tuple[SortedStacks, float]:
        """Returns the stacks of a selection in sort order with their counts, and their
        interval."""
        counts = self.stack_counts(selection)
        return self.index.arrange([counts.counts]), counts.interval

    def compared(self, a: Selection, b: Selection) -> tuple[dict[int, int], dict[int, int], float]:
        """Returns the counts of two selections at one interval (the finer of theirs: the
        other side's counts are scaled to it), and that interval."""
        sides = [self.stack_counts(a), self.stack_counts(b)]
        interval = min(side.interval for side in sides)
        counts = [
            side.counts
            if side.interval == interval
            else rescale(side.counts, side.interval / interval)  # type: ignore[arg-type]
            for side in sides
        ]
        return counts[0], counts[1], interval  # type: ignore[return-value]

    def cached(self, key: Hashable, settled: bool, compute: Callable[[], Any]) -> Any:
        """Returns ``compute()``, kept in the LRU when ``settled`` (the data cannot change)."""
        if not settled or not self.cache_entries:
            return compute()
        with self._lock:
            if key in self._results:
                self._results.move_to_end(key)
                return self._results[key]
        value = compute()
        with self._lock:
            self._results[key] = value
            while len(self._results) > self.cache_entries:
                self._results.popitem(last=False)
        return value

    def reset_connections(self) -> None:
        """Drops pooled connections, so the next request reconnects (after a lost server)."""
        with self._lock:
            if self._store is not None:
                self._store.engine.dispose()

    def close(self) -> None:
        """Stops warming and closes the store; the next use opens it again."""
        with self._lock:
            warmer, store = self.warmer, self._store
            self._store = self._query = self._index = self._last = self.warmer = None
            self._functions = None
            self._results.clear()
        if warmer is not None:
            warmer.stop()
        if store is not None:
            store.close()

    def _forget_after_fork(self) -> None:
        """Drops what a forked child must not share with its parent: the pool's connections,
        the warming thread (not in the child), and the locks (which it may have held)."""
        self._lock = threading.Lock()
        self._in_flight = 0  # the parent's requests are not served here
        if self._store is not None:
            self._store.engine.sa_engine.dispose(close=False)
        self._store = self._query = self._index = self._last = self.warmer = None
        self._functions = None
        self._results = OrderedDict()


_databases: weakref.WeakSet[Database] = weakref.WeakSet()


@contextmanager
def read_connection(action: str) -> Iterator[sa.Connection]:
    """A connection in one read transaction of the app's store; errors as the store's."""
    with translate_errors(action), get_db().query.store.engine.read_transaction() as conn:
        yield conn


def _after_fork_in_child() -> None:
    for database in list(_databases):
        database._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def init_app(app: Flask) -> None:
    """Attaches a Database built from the app's config, and its per-request teardown."""
    app.extensions[_EXTENSION] = Database(
        app.config["DATABASE_URL"],
        bucket_seconds=app.config["BUCKET_SECONDS"],
        cache_entries=app.config["CACHE_ENTRIES"],
        stack_index_mb=app.config["STACK_INDEX_MB"],
        warm_hours=app.config["WARM_HOURS"],
        index_dir=app.config["INDEX_DIR"],
    )
    app.before_request(_started)
    app.teardown_request(_ended)
    app.teardown_appcontext(_teardown)


def _started() -> None:
    if request.endpoint == "pages.healthz":
        return  # a load balancer's, every few seconds: no visitor's, and it costs little
    get_db().serving(+1)
    g.fleetflame_serving = True


def _ended(exc: BaseException | None) -> None:
    if g.pop("fleetflame_serving", False):
        get_db().serving(-1)


def get_db() -> Database:
    """Returns the current app's Database."""
    db: Database = current_app.extensions[_EXTENSION]
    return db


def mark_unavailable() -> None:
    """Notes that this request found the database unavailable (see the teardown)."""
    g.fleetflame_db_unavailable = True


def _teardown(exc: BaseException | None) -> None:
    # Connections go back to the pool after each query already; a request that failed because
    # the server went away leaves the pool full of dead ones, so drop them.
    if isinstance(exc, StoreUnavailable) or g.pop("fleetflame_db_unavailable", False):
        get_db().reset_connections()
