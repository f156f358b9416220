"""Starts the demo's processes in their own process groups and stops them without orphans.

Every child gets a new session (so Ctrl-C in the terminal reaches only the orchestrator, which
then stops the children in order) and an environment variable naming the run, which lets a
later run find and end whatever a killed run left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

RUN_ENV = "FLEETFLAME_DEMO_RUN"


@dataclass
class Child:
    """One started process (and its process group), with the log it writes to."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid


def group_alive(pgid: int) -> bool:
    """Tells whether any process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie leader still counts for killpg; we reap our own children, so look at members.
    return any(_pgid_of(pid) == pgid and not _is_zombie(pid) for pid in _all_pids())


def _all_pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def _pgid_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def _is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


def parent_pid(pid: int) -> int | None:
    """Returns the parent of ``pid``, or None when it is gone."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def pids_of_run(run_id: str) -> list[int]:
    """Returns live processes whose environment names demo run ``run_id``."""
    marker = f"{RUN_ENV}={run_id}".encode()
    found = []
    for pid in _all_pids():
        if pid == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if not _is_zombie(pid):
                    found.append(pid)
    return found


class Supervisor:
    """Owns the demo's child processes: starts them, and stops them all, group by group."""

    def __init__(
        self, run_id: str, log_dir: Path, base_env: Mapping[str, str] | None = None
    ) -> None:
        self.run_id = run_id
        self.log_dir = log_dir
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.children: list[Child] = []

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None
    ) -> Child:
        """Starts ``argv`` in a new session with its output in ``<log_dir>/<name>.log``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        full_env = {**self.base_env, **env, RUN_ENV: self.run_id}
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                list(argv),
                env=full_env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        child = Child(name, popen, log_path)
        self.children.append(child)
        return child

    def stop(self, child: Child, timeout: float = 10.0) -> bool:
        """Sends SIGTERM to the child's group, then SIGKILL after ``timeout``; True if graceful."""
        graceful = _signal_group_and_wait(child, signal.SIGTERM, timeout)
        if not graceful:
            _signal_group_and_wait(child, signal.SIGKILL, 5.0)
        if child in self.children:
            self.children.remove(child)
        return graceful

    def stop_all(self, timeout: float = 10.0) -> list[str]:
        """Stops every child, newest first; returns the names that had to be killed."""
        killed = []
        for child in reversed(list(self.children)):
            if not self.stop(child, timeout):
                killed.append(child.name)
        return killed

    def exited(self) -> list[Child]:
        """Returns the children that exited on their own."""
        return [c for c in self.children if c.popen.poll() is not None]


def _signal_group_and_wait(child: Child, signum: int, timeout: float) -> bool:
    pgid = child.pid  # start_new_session made the child its group's leader
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        child.popen.poll()
        if child.popen.returncode is not None and not group_alive(pgid):
            return True
        time.sleep(0.1)
    return False


def kill_leftovers(run_id: str) -> list[int]:
    """Ends every process left by an earlier run ``run_id`` (its orchestrator was killed)."""
    pids = pids_of_run(run_id)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and pids_of_run(run_id):
        time.sleep(0.2)
    for pid in pids_of_run(run_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids
