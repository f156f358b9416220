"""``python -m sampler trace [options] script.py args`` (or ``-m module``): an exact timeline.

The program runs as ``__main__`` with its own arguments, as under ``python -m sampler run``,
while every call and return of every thread is recorded; the file is written when the program
exits (after its other threads have ended), or when ``--seconds`` have passed, and then the
program goes on untraced.
"""

from __future__ import annotations

import argparse
import atexit
import os
import runpy
import sys

from ._run_end import RunEnd
from ._trace import DEFAULT_MAX_EVENTS, Trace, TraceError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sampler trace",
        description="Record every call and return of a Python program, in every thread, as a "
        "Trace Event file that Perfetto (ui.perfetto.dev) and chrome://tracing open. "
        "Tracing slows the program down; the trace reports by how much.",
    )
    parser.add_argument(
        "-o",
        "--output",
        default="trace.json",
        help="the trace file (default: trace.json; a name ending in .gz is written gzipped)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        metavar="SECONDS",
        help="stop recording this long after the start and write the file; the program goes "
        "on untraced (default: record until the program exits)",
    )
    parser.add_argument(
        "--max-events",
        type=int,
        default=DEFAULT_MAX_EVENTS,
        metavar="N",
        help="stop recording after this many calls and returns (16 bytes each in memory, "
        f"~88 in the file; default: {DEFAULT_MAX_EVENTS:,})",
    )
    parser.add_argument(
        "-m", dest="module", action="store_true", help="run the target as a module (like python -m)"
    )
    parser.add_argument("target", help="script path, or module name with -m")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the program described by ``argv`` traced; returns its exit status."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        _parser().print_help()
        return 2
    options = _parser().parse_args(args)
    from .__main__ import _target_problem  # run's check, so both refuse the same targets

    problem = _target_problem(options.target, options.module)
    if problem:  # before anything is recorded or written over
        print(f"python -m sampler trace: {problem}", file=sys.stderr)
        return 2
    try:
        tracer = Trace(
            options.output,
            seconds=options.seconds,
            max_events=options.max_events,
            main_file=_main_file(options.target, options.module),
            process_name=" ".join([options.target, *options.args]),
        )
    except ValueError as exc:
        print(f"python -m sampler trace: {exc}", file=sys.stderr)
        return 2
    sys.argv = [options.target, *options.args]
    if not options.module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(options.target)))
    # At exit, after the interpreter has waited for the program's other threads.
    atexit.register(tracer.close)
    try:
        tracer.start()
    except TraceError as exc:
        print(f"python -m sampler trace: {exc}", file=sys.stderr)
        return 2
    RunEnd(tracer.close).install()  # at os._exit, the file is written first
    try:
        if options.module:
            runpy.run_module(options.target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(options.target, run_name="__main__")
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # as Python says sys.exit("why")'s why
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _main_file(target: str, module: bool) -> str | None:
    """Returns the source file that will run as ``__main__``, so its functions are named so."""
    if not module:
        import pkgutil

        # A directory or zip is run as its __main__.py, found as runpy finds it; a script is
        # compiled under the path as given.
        importer = pkgutil.get_importer(target)
        if importer is None or not hasattr(importer, "find_spec"):
            return target
        try:
            found = importer.find_spec("__main__")
        except (ImportError, ValueError, OSError):
            return None
        return found.origin if found is not None else None
    import importlib.util

    try:
        spec = importlib.util.find_spec(target)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(target + ".__main__")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None
