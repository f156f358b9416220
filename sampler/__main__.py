"""``python -m sampler run [options] script.py args`` (or ``-m module``): run a program sampled.

Like ``python -m cProfile``: the program runs as ``__main__`` with its own arguments, and
``--output`` / ``--svg`` write the profile when it exits. ``--port`` also serves the endpoint
while it runs.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import tempfile
from typing import Any

from . import _svg
from ._core import start, stop
from ._settings import SETTINGS, ConfigError
from .profile import format_folded

# Settings that the run command exposes as options, besides --output/--svg.
_OPTIONS = (
    "port",
    "host",
    "token",
    "interval",
    "mode",
    "driver",
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
    )
    for setting in SETTINGS:
        if setting.name in _OPTIONS:
            flag = "--" + setting.name.replace("_", "-")
            default = "none (no endpoint)" if setting.name == "port" else setting.default
            parser.add_argument(
                flag, dest=setting.name, default=None, help=f"{setting.help} Default: {default}."
            )
    parser.add_argument("-o", "--output", help="write folded stacks here when the program exits")
    parser.add_argument("--svg", help="write an SVG flamegraph here when the program exits")
    parser.add_argument(
        "-m", dest="module", action="store_true", help="run the target as a module (like python -m)"
    )
    parser.add_argument("target", help="script path, or module name with -m")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program")
    return parser


def _write_atomically(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".fleetflame-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def run(argv: list[str]) -> int:
    """Runs the program described by ``argv`` under the sampler; returns its exit status."""
    options = _parser().parse_args(argv)
    overrides: dict[str, Any] = {name: getattr(options, name) for name in _OPTIONS}
    if overrides["port"] is None:
        overrides["port"] = "none"
    if overrides["service"] is None:
        overrides["service"] = os.path.basename(options.target).removesuffix(".py")
    sys.argv = [options.target, *options.args]
    try:
        sampler = start(**overrides)
    except ConfigError as exc:
        print(f"python -m sampler run: {exc}", file=sys.stderr)
        return 2
    if sampler.url:
        print(f"fleetflame: sampling, curl {sampler.url}/stacks", file=sys.stderr)
    status = 0
    try:
        if options.module:
            runpy.run_module(options.target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(options.target)))
            runpy.run_path(options.target, run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        stop()
        counts = sampler.folded()
        if options.output:
            _write_atomically(options.output, format_folded(counts))
        if options.svg:
            title = f"{sampler.labels['service']} ({sampler.mode})"
            _write_atomically(
                options.svg,
                _svg.render(counts, title=title, unit_seconds=sampler.interval, mode=sampler.mode),
            )
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m sampler``: only the ``run`` subcommand exists."""
    args = sys.argv[1:] if argv is None else argv
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
