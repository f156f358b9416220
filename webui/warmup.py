"""Warming the stack index after a start, so the first views are as fast as later ones.

A process's stack index is empty when it starts, and the first view of a window of many
distinct stacks then reads and sorts all their text (a second or more for 200,000 stacks).
A Warmer, on a daemon thread, first loads the index a process saved earlier, if there is a
file of it (webui.indexfile: requests lacking stacks wait for that load); then reads the
stacks sampled in the last hours into the index: an hour at a time, newest first, each hour
one short read, until 80% of the index's bound is used; then the same stacks' functions into
the function index (webui.functable), so the first function table is as fast too. It works
only while no request is served, nor was for half a second (webui.db's QUIET_SECONDS): a
request learns what it lacks itself, and faster without warming beside it. With a file, it then saves the index whenever it has learned more, at
most every SAVE_EVERY seconds, while no request is served (a save stops between its pieces
while one is); after a save that failed, less often each time (up to an hour), until one
succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from collector.query import Query
from collector.store import StoreError
from webui import indexfile
from webui.functable import FunctionIndex
from webui.functable_saved import SavedFunctions
from webui.model import StackIndex

__all__ = ["Warmer"]

THREAD_NAME = "fleetflame-web-warmup"
HOUR = 3600
CHUNK = 50_000  # stacks learned at a time: a request needing the index waits for one at most
FUNCTION_CHUNK = 5_000  # stacks whose functions are numbered at a time (~20 ms)
IDLE_WAIT = 0.05  # seconds between looks for a moment without requests
# The longest a save waits in all for moments without requests, then it goes on beside them:
# a busy server would otherwise keep its copy of the index (100 MB for 200,000 stacks) and a
# temporary file that a sibling removes as stale (indexfile.STALE_TEMPORARY).
SAVE_PATIENCE = 60.0
# Of the index's bound: the rest is room for windows older than the warm-up's.
SHARE = 0.8
SAVE_EVERY = 300.0  # seconds between looks at whether the index has learned stacks to save
RETRY_CEILING = 3600.0  # the longest wait before trying again after saves failed
_log = logging.getLogger(__name__)


class _Stopped(Exception):
    """Warming was stopped in the middle of a save: it is given up, the old file kept."""


def save_wait(save_every: float, failures: int) -> float:
    """Seconds before the next look at saving, after ``failures`` saves failed in a row: twice
    as long after each, up to RETRY_CEILING (or save_every, if that is longer)."""
    return min(save_every * 2**failures, max(RETRY_CEILING, save_every))


class Warmer:
    """Reads the stacks of the last ``hours`` into a stack index on a daemon thread."""

    def __init__(
        self,
        query: Query,
        index: StackIndex,
        *,
        hours: float,
        bucket_seconds: int,
        functions: FunctionIndex | None = None,
        clock: Callable[[], float] = time.time,
        idle: Callable[[], bool] = lambda: True,
        index_file: Path | None = None,
        functions_file: Path | None = None,
        save_every: float = SAVE_EVERY,
    ) -> None:
        self.query = query
        self.index = index
        self.functions = functions
        self.idle = idle  # whether no request is being served
        self.hours = hours
        self.bucket_seconds = bucket_seconds
        self.clock = clock
        self.learned = 0
        self.functions_learned = 0
        self.index_file = index_file
        self.functions_file = functions_file if functions is not None else None
        self.save_every = save_every
        self.loaded = 0  # stacks loaded from the index file
        self.saves = 0  # times the index was saved to its file
        self.function_saves = 0
        self._saved_generation = index.generation
        self._saved_functions = functions.generation if functions is not None else 0
        # Files that could not be read: replaced at the next save, however many they hold.
        self._unreadable: set[Path] = set()
        self._failing: set[Path] = set()  # files whose last save failed (warned of once)
        self._save_until = 0.0  # the monotonic time a save stops waiting for requests
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> None:
        """Starts warming in the background (first loading the index file, if any)."""
        # Before the thread starts: a request may come first, and waits for the loads
        # rather than read and number every stack itself.
        if self.index_file is not None:
            self.index.loading()
        if self.functions is not None and self.functions_file is not None:
            # Loaded by the first table or by warming, whichever comes first.
            self.functions.defer_load(self._read_functions, SHARE)
        try:
            self._thread.start()
        except BaseException:
            self.index.loaded()
            raise

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until warming has ended (done, failed or stopped); tells whether it has."""
        return self._done.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Asks the thread to stop after the hour or chunk it is reading, and waits for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                _log.warning("stack index warm-up still running %g s after it was stopped", timeout)

    def _run(self) -> None:
        for path in (self.index_file, self.functions_file):
            if path is not None:
                indexfile.remove_stale_temporaries(path)
        if self.index_file is not None:
            self._load(self.index_file)
        began = time.monotonic()
        try:
            if self.hours > 0:
                self._warm()
            _log.info(
                "stack index warmed with %d stacks of the last %g hours in %.1f s "
                "(their functions: %d)",
                self.learned,
                self.hours,
                time.monotonic() - began,
                self.functions_learned,
            )
        except StoreError as exc:
            # Not fatal: requests read what they need when they need it.
            _log.warning("could not warm the stack index: %s", exc)
        except Exception:
            _log.exception("could not warm the stack index")
        finally:
            self._done.set()
        if self.index_file is not None:
            self._keep_saved()

    def _paused_or_stopped(self, until: float = float("inf")) -> bool:
        """Waits while a request is being served (up to the monotonic time ``until``); tells
        whether warming was stopped."""
        while not self.idle() and time.monotonic() < until and not self._stop.wait(IDLE_WAIT):
            pass
        return self._stop.is_set()

    def _pause(self) -> None:
        """Between pieces of a save: waits while a request is served (a save of 200,000
        stacks takes ~1 s of the interpreter), SAVE_PATIENCE seconds at most in all for the
        save; raises _Stopped when warming was stopped."""
        if self._paused_or_stopped(self._save_until):
            raise _Stopped

    def _load(self, path: Path) -> None:
        """Loads the index a process saved earlier into the (empty) index."""
        began = time.monotonic()
        try:
            keys, ids = indexfile.load(path, max_chars=SHARE * self.index.max_bytes)
            self.loaded = self.index.load(keys, ids, share=SHARE)
            self._saved_generation = self.index.generation
            _log.info(
                "stack index loaded with %d stacks from %s in %.2f s",
                self.loaded,
                path,
                time.monotonic() - began,
            )
        except FileNotFoundError:
            pass  # nothing saved yet
        except (OSError, indexfile.IndexFileError) as exc:
            _log.warning("could not load the saved stack index (warming without it): %s", exc)
            self._unreadable.add(path)
        except Exception:
            _log.exception("could not load the saved stack index")
            self._unreadable.add(path)
        finally:
            self.index.loaded()

    def _read_functions(self) -> SavedFunctions | None:
        """Reads the function index a process saved earlier (for FunctionIndex.defer_load);
        None if there is none it can read."""
        assert self.functions_file is not None
        began = time.monotonic()
        try:
            saved = indexfile.load_functions(self.functions_file)
        except FileNotFoundError:
            return None
        except (OSError, indexfile.IndexFileError) as exc:
            _log.warning("could not load the saved function index (numbering anew): %s", exc)
            self._unreadable.add(self.functions_file)
            return None
        _log.info(
            "function index read with the functions of %d stacks from %s in %.2f s",
            len(saved.ids),
            self.functions_file,
            time.monotonic() - began,
        )
        return saved

    def _keep_saved(self) -> None:
        """Saves the indexes when they have learned stacks since they were loaded or saved:
        now, then every save_every seconds while no request is served, until stopped. After a
        save that failed (a full disk, a directory it cannot write) it waits twice as long
        before each try, up to RETRY_CEILING."""
        wait, failures = 0.0, 0
        while not self._stop.wait(wait):
            stacks = self.index.generation != self._saved_generation
            functions = (
                self.functions is not None
                and self.functions_file is not None
                and self.functions.generation != self._saved_functions
            )
            if stacks or functions:
                assert self.index_file is not None
                self._save_until = time.monotonic() + SAVE_PATIENCE
                try:
                    self._pause()
                    saved = not stacks or self._save(self.index_file)
                    if saved and functions and self.functions_file is not None:
                        saved = self._save_functions(self.functions_file)
                except _Stopped:
                    return
                failures = 0 if saved else min(failures + 1, 30)
            wait = save_wait(self.save_every, failures)

    def _save_functions(self, path: Path) -> bool:
        """Saves the function index; tells whether it is saved (or needed no saving)."""
        assert self.functions is not None
        generation = self.functions.generation
        if self._holds_as_many(path, len(self.functions)):
            # As after taking in this very file: nothing to write, and no copy of the index to
            # make for nothing (~0.7 s for 200,000 stacks, shared with any request meanwhile).
            self._saved_functions = generation
            return True
        self._pause()
        saved = self.functions.saved_form()
        done = self._write(
            path,
            "function index",
            len(saved.ids),
            partial(indexfile.save_functions, path, saved, pause=self._pause),
        )
        if done is not False:
            self._saved_functions = generation
            self.function_saves += bool(done)
        return done is not False

    def _save(self, path: Path) -> bool:
        """Saves the stack index; tells whether it is saved (or needed no saving)."""
        generation = self.index.generation
        keys, ids = self.index.saved_form()
        write = partial(indexfile.save, path, keys, ids, pause=self._pause)
        done = self._write(path, "stack index", len(ids), write)
        if done is not False:
            self._saved_generation = generation
            self.saves += bool(done)
        return done is not False

    def _write(self, path: Path, what: str, stacks: int, write: Callable[[], int]) -> bool | None:
        """Writes an index of ``stacks`` stacks to ``path`` with ``write()``, unless the file
        holds as many already: by this process's start, or by a sibling worker warmed as far
        (each would otherwise write the same file in turn). Returns True when written, None
        when not needed, False when it could not be written (a warning; a debug line when the
        file's last save failed too)."""
        if self._holds_as_many(path, stacks):
            return None
        began = time.monotonic()
        try:
            written = write()
        except OSError as exc:
            level = logging.DEBUG if path in self._failing else logging.WARNING
            _log.log(level, "could not save the %s (will try again, less often): %s", what, exc)
            self._failing.add(path)
            return False
        self._failing.discard(path)
        self._unreadable.discard(path)
        _log.info(
            "%s saved with %d stacks to %s (%.0f MB) in %.2f s",
            what,
            stacks,
            path,
            written / 1e6,
            time.monotonic() - began,
        )
        return True

    def _holds_as_many(self, path: Path, stacks: int) -> bool:
        """Tells whether the file at ``path`` can be read and holds ``stacks`` stacks or more."""
        saved = None if path in self._unreadable else indexfile.count_in(path)
        return saved is not None and saved >= stacks

    def _learn_functions(self, ids: list[int]) -> None:
        """Numbers the functions of the stacks warmed, most recent first, as far as the
        function index holds them without starting over; in small chunks, so that requests
        meanwhile wait little for the interpreter."""
        assert self.functions is not None
        for i in range(0, len(ids), FUNCTION_CHUNK):
            # Only while no request is served: a first view must not share the interpreter
            # with this (it draws without the function table).
            if self._paused_or_stopped():
                return
            if not self.functions.warm(ids[i : i + FUNCTION_CHUNK], share=SHARE):
                return
            self.functions_learned = min(len(ids), i + FUNCTION_CHUNK)

    def _warm(self) -> None:
        now = int(self.clock())
        end = now + self.bucket_seconds  # the bucket being written counts too
        oldest = now - int(self.hours * HOUR)
        warmed = self._warm_stacks(end, oldest)
        # Functions second: a view's tree needs the stack index, its table comes after it.
        if self.functions is not None:
            self._learn_functions(warmed)

    def _warm_stacks(self, end: int, oldest: int) -> list[int]:
        """Learns the stacks of [oldest, end), an hour at a time, newest first; returns the
        ids learned (or offered to the index), in that order."""
        seen: set[int] = set()
        batch: list[int] = []
        warmed: list[int] = []
        for hour_end in range(end, oldest, -HOUR):
            # Between requests: one learns what it lacks itself, faster without this beside it.
            if self._paused_or_stopped():
                break
            ids = self.query.recent_stacks(max(hour_end - HOUR, oldest), hour_end)
            batch += [sid for sid in ids if sid not in seen]
            seen.update(ids)
            last = hour_end - HOUR <= oldest
            if len(batch) >= CHUNK or (last and batch):
                learned, room = self.index.warm(
                    batch, share=SHARE, chunk=CHUNK, stop=self._paused_or_stopped
                )
                self.learned += learned
                warmed += batch
                batch = []
                if not room:
                    break
        return warmed
