"""``python -m sampler run [options] script.py args`` (or ``-m module``): run a program sampled.

Like ``python -m cProfile``: the program runs as ``__main__`` with its own arguments, and
``--output`` / ``--svg`` write the profile when it exits. ``--port`` also serves the endpoint
while it runs. With ``--every SECONDS``, ``--output`` is a directory that gets one folded file
per period, holding that period's samples only (``fleetflame compare`` takes each file as a
replicate).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import re
import runpy
import sys
import threading
import time
from types import CodeType
from typing import Any

from . import _svg
from ._core import Sampler, SamplerError
from ._engine_native import NativeEngine
from ._engine_native import unavailable as native_unavailable
from ._files import write_text_atomically
from ._process import start, stop
from ._run_end import RunEnd
from ._settings import SETTINGS, ConfigError
from ._stack_walk import HIDDEN_CODE_IDS, hide_code
from ._trace_write import output_problem
from .profile import format_folded, subtract

# Settings that the run command exposes as options, besides --output/--svg.
_OPTIONS = (
    "port",
    "host",
    "token",
    "interval",
    "mode",
    "driver",
    "engine",
    "service",
    "labels",
    "max_depth",
    "max_stacks",
    "overhead_budget",
    "lineno",
    "thread_frames",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sampler run",
        description="Run a Python program under the fleetflame sampler.",
        epilog="Give --output, --svg or --port, or nothing is kept. The other command: "
        "python -m sampler trace --help (every call and return of a short run, for Perfetto).",
    )
    for setting in SETTINGS:
        if setting.name in _OPTIONS:
            flag = "--" + setting.name.replace("_", "-")
            default = "none (no endpoint)" if setting.name == "port" else setting.default
            # A switch (lineno, thread_frames) is on given alone, or takes a value (=0 for off).
            switch = {"nargs": "?", "const": "1"} if isinstance(setting.default, bool) else {}
            parser.add_argument(
                flag,
                dest=setting.name,
                default=None,
                help=f"{setting.help} Default: {default}.",
                **switch,  # type: ignore[arg-type]
            )
    parser.add_argument(
        "-o",
        "--output",
        help="write folded stacks here when the program exits (with --every: a directory)",
    )
    parser.add_argument(
        "--every",
        type=float,
        metavar="SECONDS",
        help="write one folded file per period of SECONDS into the --output directory, each "
        "with that period's samples only, and the last partial period at exit",
    )
    parser.add_argument("--svg", help="write an SVG flamegraph here when the program exits")
    parser.add_argument(
        "-m", dest="module", action="store_true", help="run the target as a module (like python -m)"
    )
    parser.add_argument("target", help="script path, or module name with -m")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program")
    return parser


class _Periods:
    """Writes each period's samples (the difference of the cumulative counts) to a folded
    file of its own, named by the period's start so that the files sort in time."""

    def __init__(self, sampler: Sampler, folder: str, every: float) -> None:
        self._sampler = sampler
        self._folder = folder
        self._every = every
        self._last: dict[str, int] = {}
        self._start = time.time()
        self._sequence = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleetflame-periods", daemon=True)

    def start(self) -> None:
        """Starts the daemon thread that writes a file at the end of every period."""
        self._thread.start()

    def finish(self) -> None:
        """Stops that thread and writes the last, partial period."""
        self._done.set()
        self._thread.join()
        self._write()

    def _run(self) -> None:
        deadline = time.monotonic() + self._every
        while not self._done.wait(max(0.0, deadline - time.monotonic())):
            self._write()
            # Periods keep their length on average; after a stall (a suspended machine) the
            # next one starts now rather than several being written at once.
            deadline = max(deadline + self._every, time.monotonic())

    def _write(self) -> None:
        now = time.time()
        counts = _program_counts(self._sampler.folded())
        start = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self._start))
        millis = int(self._start % 1 * 1000)
        name = f"{start}.{millis:03d}Z-p{os.getpid()}-{self._sequence:06d}.folded"
        try:
            write_text_atomically(
                os.path.join(self._folder, name), format_folded(subtract(counts, self._last))
            )
        except OSError as exc:
            print(f"fleetflame: could not write {name}: {exc.strerror}", file=sys.stderr)
        self._last, self._start, self._sequence = counts, now, self._sequence + 1


def run(argv: list[str]) -> int:
    """Runs the program described by ``argv`` under the sampler; returns its exit status."""
    options = _parser().parse_args(argv)
    if options.every is not None:
        problem = _periods_problem(options.output, options.every)
        if problem:
            print(f"python -m sampler run: {problem}", file=sys.stderr)
            return 2
    problem = _target_problem(options.target, options.module) or next(
        (
            found
            for path in (options.output if options.every is None else None, options.svg)
            if path and (found := output_problem(path))
        ),
        None,
    )
    if problem:
        print(f"python -m sampler run: {problem}", file=sys.stderr)
        return 2
    # Where the checks above found them: the program may change its working directory.
    for name in ("output", "svg"):
        if getattr(options, name):
            setattr(options, name, os.path.abspath(getattr(options, name)))
    overrides: dict[str, Any] = {name: getattr(options, name) for name in _OPTIONS}
    if overrides["port"] is None:
        overrides["port"] = "none"
    if overrides["service"] is None:
        overrides["service"] = os.path.basename(options.target).removesuffix(".py")
    sys.argv = [options.target, *options.args]
    # Hidden before sampling starts, from both engines' walks (either may run): what start()
    # does after that is then rooted in it, and left out of the files (_program_counts).
    _hide_launcher("native" if native_unavailable() is None else "python")
    try:
        sampler = start(**overrides)
    except (ConfigError, SamplerError) as exc:  # a bad setting, a port taken
        print(f"python -m sampler run: {exc}", file=sys.stderr)
        return 2
    if sampler.url:
        print(f"fleetflame: sampling, curl {sampler.url}/stacks", file=sys.stderr)
    elif not (options.output or options.svg):
        print("fleetflame: no --output, --svg or --port: this run keeps nothing", file=sys.stderr)
    periods = None
    if options.every is not None:
        periods = _Periods(sampler, options.output, options.every)
        periods.start()
    status = 0
    error: BaseException | None = None
    end = RunEnd(lambda: _write_outputs(sampler, options, periods))
    end.install()
    try:
        try:
            _run_program(options, sampler)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)  # as Python says sys.exit("why")'s why
        except BaseException as exc:  # noqa: BLE001 - told here, as the interpreter tells it
            # Python tells an uncaught exception before it waits for the threads.
            _tell(exc)
            status, error = 1, exc
        try:
            _wait_for_threads()
        except KeyboardInterrupt as exc:  # Ctrl-C while waiting: keep what was sampled, end
            error = error or exc
            # Python waits for the threads once, and a Ctrl-C ends that wait; the interpreter's
            # exit would wait again (a Ctrl-C during threading's atexit calls, before the wait
            # marks itself done, hung the run for a thread sleeping 60 s).
            threading._shutdown = _waited  # type: ignore[attr-defined]
    finally:
        stop()
        end.write()  # unless an early end wrote them; not in a child the program forked
        end.uninstall()
    if isinstance(error, KeyboardInterrupt):
        # Raised again so that the interpreter ends as Python does on Ctrl-C (killed by
        # SIGINT, after its atexit calls); told already, so not told twice.
        sys.excepthook = lambda *args: None
        raise error
    return status


def _run_program(options: argparse.Namespace, sampler: Sampler) -> None:
    """Runs the program as ``__main__``, as python runs a script, a directory or zip with a
    ``__main__.py``, or with ``-m`` a module."""
    run_code = runpy._run_code  # type: ignore[attr-defined]
    runpy._run_code = functools.partial(_run_main_code, sampler, run_code)  # type: ignore[attr-defined]
    try:
        if options.module:
            runpy.run_module(options.target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(options.target)))
            runpy.run_path(options.target, run_name="__main__")
    finally:
        runpy._run_code = run_code  # type: ignore[attr-defined]


def _run_main_code(sampler: Sampler, run_code: Any, code: CodeType, *args: Any, **kw: Any) -> Any:
    """Runs runpy's ``_run_code`` for the program's code, naming that code ``__main__``'s for
    the native engine first: runpy takes the program's module out of sys.modules when it ends,
    and the engine named the module's code drained after that (a short program's, all of it)
    by its file, or ``__mp_main__`` once multiprocessing was imported."""
    # Once: what the program runs with runpy itself is named as runpy names it.
    runpy._run_code = run_code  # type: ignore[attr-defined]
    if isinstance(sampler.engine, NativeEngine):
        sampler.engine.name_file(code.co_filename, "__main__")
    return run_code(code, *args, **kw)


def _waited() -> None:
    """threading._shutdown once the wait for the program's threads was ended by Ctrl-C."""


def _wait_for_threads() -> None:
    """Waits for the program's non-daemon threads as the interpreter does before it exits
    (threading's own shutdown: its atexit calls, which end executors' idle workers, then a
    join of each), so that what they do after the main module returns is sampled too."""
    threading._shutdown()  # type: ignore[attr-defined]


def _tell(exc: BaseException) -> None:
    """Prints an uncaught exception's traceback through sys.excepthook, from the program's
    own frames on (the launcher's, hidden from its stacks, left out of it too)."""
    tb = exc.__traceback__
    while tb is not None and id(tb.tb_frame.f_code) in HIDDEN_CODE_IDS:
        tb = tb.tb_next
    if tb is not None:  # the default hook prints the exception's own traceback, not its tb
        exc.__traceback__ = tb
    sys.excepthook(type(exc), exc, exc.__traceback__)


def _write_outputs(sampler: Sampler, options: argparse.Namespace, periods: _Periods | None) -> None:
    counts = _program_counts(sampler.folded())
    if periods is not None:
        periods.finish()
    elif options.output:
        _write(options.output, format_folded(counts))
    if options.svg:
        title = f"{sampler.labels['service']} ({sampler.mode})"
        _write(
            options.svg,
            _svg.render(counts, title=title, unit_seconds=sampler.interval, mode=sampler.mode),
        )


def _write(path: str, text: str) -> None:
    """Writes one output file; a failure is said on stderr, the program's exit status kept."""
    try:
        write_text_atomically(path, text)
    except OSError as exc:
        print(f"fleetflame: could not write {path}: {exc.strerror or exc}", file=sys.stderr)


# The sampler's start() and stop() on the main thread, sampled before the program began and
# after it ended: rooted there (below a thread's frame) once the launcher's frames are hidden.
_LAUNCHER_STACK = re.compile(r"(\[thread:[^;]*\];)?sampler\._process:(start|stop)(:\d+)?(;|$)")


def _program_counts(counts: dict[str, int]) -> dict[str, int]:
    """Returns the program's folded counts: without the launcher's own start and stop."""
    return {stack: n for stack, n in counts.items() if not _LAUNCHER_STACK.match(stack)}


def _hide_launcher(engine: str) -> None:
    """Leaves this launcher's frames out of the program's stacks, which then start at its own
    ``__main__:<module>``: every frame above run(), runpy's functions that run the target, and
    the launcher's own work at the program's end (the wait for its threads, the traceback)."""
    frame: Any = sys._getframe(0)
    while frame is not None:
        hide_code(frame.f_code, engine)
        frame = frame.f_back
    for function in (runpy.run_path, runpy.run_module, runpy._run_module_code, runpy._run_code):  # type: ignore[attr-defined]
        hide_code(function.__code__, engine)
    for function in (_run_program, _run_main_code, _wait_for_threads, _tell):
        hide_code(function.__code__, engine)


def _target_problem(target: str, module: bool) -> str | None:
    """Says what is wrong with the program to run, before the sampler starts for it."""
    if module:
        # Only the top-level package: finding a submodule would import its package before
        # the sampler starts (its import unsampled, its failure told twice).
        top = target.partition(".")[0]
        if not top:
            return f"cannot find module {target!r}: not an absolute module name"
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError) as exc:
            return f"cannot find module {target!r}: {exc}"
        return None if found is not None else f"no module named {top!r}"
    if not os.path.exists(target):
        return f"no such file: {target!r} (a script, a directory or zip with __main__.py; -m MODULE for a module)"
    return None


def _periods_problem(output: str | None, every: float) -> str | None:
    """Says what is wrong with ``--every`` and its directory, or makes the directory."""
    if not 0 < every < float("inf"):
        return f"--every must be a positive number of seconds, got {every}"
    if not output:
        return "--every needs --output DIR, the directory that gets one file per period"
    try:
        os.makedirs(output, exist_ok=True)
    except OSError as exc:
        return f"--output {output}: cannot make that directory: {exc.strerror}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m sampler``: ``run``, and ``trace`` (sampler/_trace_cli.py)."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "trace":
        from ._trace_cli import main as trace

        return trace(args[1:])
    if args and args[0] == "run":
        args = args[1:]
    elif args and args[0] not in ("-h", "--help"):
        # `fleetflame run ...` arrives here without the word "run".
        pass
    if not args or args[0] in ("-h", "--help"):
        _parser().print_help()
        return 0 if args else 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
