"""py-spy, as ``fleetflame attach`` uses it: its raw output in the wire format's frame names,
which permission it lacks when it cannot attach, and finding the process to read.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from collector.logs import log_event
from sampler.profile import escape_frame

__all__ = [
    "EXIT_DENIED",
    "EXIT_GONE",
    "AttachError",
    "convert_frame",
    "convert_raw",
    "find_process",
    "is_python",
    "main_files_of",
    "permission_help",
    "process_start_time",
]

log = logging.getLogger("attach")

EXIT_DENIED = 3
EXIT_GONE = 4

_PYSPY_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


class AttachError(Exception):
    """py-spy could not profile the process; ``exit_code`` says why (3: denied, 4: gone)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _module_of(filename: str) -> str:
    """Turns py-spy's short filename (``json/encoder.py``) into a module name (``json.encoder``)."""
    name = filename.replace("\\", "/")
    for suffix in (".py", ".pyx", ".pyc"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    name = name.strip("/").replace("/", ".")
    if name.endswith(".__init__"):
        name = name[: -len(".__init__")]
    return name or "?"


def convert_frame(frame: str, main_files: frozenset[str] = frozenset()) -> str:
    """Converts a py-spy frame ``qualname (file.py:12)`` to the wire format's ``module:qualname``;
    frames of ``main_files`` (see main_files_of) are the ``__main__`` module's, as the sampler
    names them."""
    match = _PYSPY_FRAME.match(frame)
    if match is None:
        return escape_frame(frame)  # "process 12:..." and native frames: kept as they are
    module = "__main__" if match["file"] in main_files else _module_of(match["file"])
    return escape_frame(f"{module}:{match['name']}")


def convert_raw(text: str, main_files: frozenset[str] = frozenset()) -> dict[str, int]:
    """Parses py-spy's raw (folded) output into folded counts in the wire format's frame names."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        stack, sep, count_text = line.strip().rpartition(" ")
        if not sep or not stack or not count_text.isdigit():
            continue
        folded = ";".join(convert_frame(frame, main_files) for frame in stack.split(";"))
        counts[folded] = counts.get(folded, 0) + int(count_text)
    return counts


# The interpreter's options that take a value (``-W error``, or ``-Werror`` joined).
_VALUE_OPTIONS = frozenset("WX")
_LONG_VALUE_OPTIONS = frozenset({"--check-hash-based-pycs"})


def main_files_of(pid: int) -> frozenset[str]:
    """Returns the names py-spy gives the file of the process's ``__main__`` module: the script
    its command line runs, or the module of ``-m`` (py-spy names a file by its path below the
    highest package holding it, ``app.py`` or ``pkg/mod.py``). Empty when there is none or it
    cannot tell (``-c``, standard input, a process it cannot read)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return frozenset()
    words = [os.fsdecode(arg) for arg in args[1:] if arg]
    i = 0
    while i < len(words):
        word = words[i]
        if word in _LONG_VALUE_OPTIONS:
            i += 2
            continue
        if word == "-" or not word.startswith("-"):
            return _script_names(pid, word) if word != "-" else frozenset()
        if word.startswith("--"):
            i += 1
            continue
        for j, letter in enumerate(word[1:], 1):
            value = word[j + 1 :] or (words[i + 1] if i + 1 < len(words) else "")
            if letter == "c":
                return frozenset()
            if letter == "m":
                return _module_names(pid, value.replace(".", "/"))
            if letter in _VALUE_OPTIONS:
                i += 0 if word[j + 1 :] else 1
                break
        i += 1
    return frozenset()


def _module_names(pid: int, module: str) -> frozenset[str]:
    """py-spy's name of the file of ``-m`` a module (``pkg/mod``): found below the process's
    working directory, sys.path's first entry, it is a script's (a namespace package's has no
    __init__.py, so py-spy names it ``mod.py``); elsewhere (installed), its path as given."""
    root = Path(f"/proc/{pid}/root")
    for name in (f"{module}.py", f"{module}/__main__.py"):
        path = _in_process(pid, name)
        if (root / path.relative_to("/")).is_file():
            return _script_names(pid, name)
    return frozenset({f"{module}.py", f"{module}/__main__.py"})


def _in_process(pid: int, name: str) -> Path:
    """``name`` as the process finds it: below its working directory unless absolute."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = "/"
    return Path(os.path.normpath(os.path.join(cwd, name)))


def _script_names(pid: int, script: str) -> frozenset[str]:
    """py-spy's name of a script's file: its path below the highest package above it."""
    path = _in_process(pid, script)
    root = Path(f"/proc/{pid}/root")  # the process's own view of files (containers)
    top = path.parent
    while top.parent != top and (root / top.relative_to("/") / "__init__.py").exists():
        top = top.parent
    return frozenset({str(path.relative_to(top))})


def _ptrace_scope() -> str | None:
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return None


def permission_help(pid: int, stderr: str = "") -> str:
    """Explains which permission py-spy lacks to read ``pid`` and how to grant it."""
    scope = _ptrace_scope()
    scope_text = {
        None: "the Yama LSM is not enabled",
        "0": "kernel.yama.ptrace_scope = 0 (any process of the same user)",
        "1": "kernel.yama.ptrace_scope = 1 (only descendants, unless CAP_SYS_PTRACE)",
        "2": "kernel.yama.ptrace_scope = 2 (only with CAP_SYS_PTRACE)",
        "3": "kernel.yama.ptrace_scope = 3 (ptrace disabled entirely, until reboot)",
    }.get(scope, f"kernel.yama.ptrace_scope = {scope}")
    detail = stderr.strip().splitlines()[0] if stderr.strip() else ""
    return (
        f"permission denied: py-spy cannot read process {pid} ({detail or 'ptrace refused'}). "
        "py-spy uses ptrace, which needs one of: running as root; the CAP_SYS_PTRACE capability "
        "(docker run --cap-add SYS_PTRACE; Kubernetes securityContext.capabilities.add: "
        '["SYS_PTRACE"]); or running as the same user as the process with '
        f"kernel.yama.ptrace_scope = 0 (sysctl -w kernel.yama.ptrace_scope=0). Here: {scope_text}, "
        f"running as uid {os.getuid()}."
    )


def find_process(
    pattern: str, *, exclude: Iterable[int] = (), told: set[int] | None = None
) -> int | None:
    """Returns the oldest Python process whose command line matches ``pattern`` (a regex), if
    any. Matches that are not Python (a shell wrapper, an editor, ``tail`` of its log) are
    skipped and logged; with ``told``, each once: it keeps the pids said already."""
    regex = re.compile(pattern)
    skip = {os.getpid(), os.getppid(), *exclude}
    found: list[tuple[int, int]] = []
    others: list[tuple[int, str]] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            raw = Path(entry.path, "cmdline").read_bytes()
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        cmdline = raw.replace(b"\x00", b" ").decode("utf-8", "replace").strip()
        if not cmdline or "py-spy" in cmdline or not regex.search(cmdline):
            continue
        if is_python(int(entry.name)) is False:
            others.append((int(entry.name), cmdline))
            continue
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        found.append((start_ticks, int(entry.name)))
    new = [(pid, cmdline) for pid, cmdline in others if told is None or pid not in told]
    if new:
        log_event(
            log,
            logging.WARNING,
            "skipping matching processes that are not Python",
            pattern=pattern,
            pids=",".join(str(pid) for pid, _ in new),
            commands=" | ".join(cmdline[:80] for _, cmdline in new),
        )
        if told is not None:
            told.update(pid for pid, _ in new)
    if len(found) > 1:
        log_event(
            log,
            logging.WARNING,
            "several Python processes match; attaching to the oldest",
            pattern=pattern,
            pids=",".join(str(pid) for _, pid in sorted(found)),
        )
    return min(found)[1] if found else None


def is_python(pid: int) -> bool | None:
    """Whether process ``pid`` runs a Python interpreter: its executable's name says python
    (``python3.11``, a venv's python resolved), it maps a libpython (uwsgi, embedders), or
    its executable holds the interpreter itself (Debian's static python3 copied under another
    name, PyOxidizer-style apps); None when it cannot tell (a process of another user)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    if "python" in os.path.basename(exe).lower():
        return True
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            if any(b"libpython" in line for line in maps):
                return True
        status = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return None
    return _holds_interpreter(f"/proc/{pid}/exe", status.st_dev, status.st_ino, status.st_mtime)


# The name of the interpreter's runtime state, in the symbols of any executable that has it.
_RUNTIME_SYMBOL = b"_PyRuntime"


@functools.lru_cache(maxsize=256)
def _holds_interpreter(path: str, device: int, inode: int, mtime: float) -> bool | None:
    """Whether the executable (one file, by device, inode and time) holds the interpreter;
    read once a file, in pieces."""
    chunk, tail = 1 << 20, len(_RUNTIME_SYMBOL) - 1
    try:
        with open(path, "rb") as exe:
            carried = b""
            while piece := exe.read(chunk):
                if _RUNTIME_SYMBOL in carried + piece:
                    return True
                carried = piece[-tail:]
    except OSError:
        return None
    return False


def process_start_time(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return time.time()
