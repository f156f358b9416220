"""``fleetflame attach``: profile a process that cannot import the sampler, with py-spy."""

from __future__ import annotations

import argparse
import logging
import math
import re
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attach.agent import Attacher, serve
from attach.pyspy import EXIT_GONE
from collector.logs import log_event, setup_logging
from sampler.settings import is_loopback, port
from sampler.settings import labels as parse_labels

__all__ = ["build_parser", "main"]

log = logging.getLogger("attach")


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser of ``fleetflame attach``."""
    parser = argparse.ArgumentParser(
        prog="fleetflame attach",
        description="Profile a running Python process with py-spy and serve the sampler's "
        "endpoints for the collector.",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int, help="process id to profile")
    target.add_argument(
        "--match",
        type=_regex,
        help="regex on process command lines; the oldest Python process that matches (others "
        "are skipped, and logged), re-resolved when it exits",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on [127.0.0.1]")
    parser.add_argument(
        "--port", type=port, default=8050, help="port to serve on, 0 for any [8050]"
    )
    parser.add_argument(
        "--window", type=_positive_seconds, default=10.0, help="seconds per py-spy run [10]"
    )
    parser.add_argument(
        "--rate", type=_positive_int, default=100, help="samples per second, 1 or more [100]"
    )
    parser.add_argument("--idle", action="store_true", help="wall mode: include idle threads")
    parser.add_argument(
        "--nonblocking",
        action="store_true",
        help="never pause the process to read a stack (py-spy --nonblocking): no pauses, but "
        "a few percent of stacks come out torn (read while they changed)",
    )
    parser.add_argument("--service", help="service label (default: the process name)")
    parser.add_argument("--labels", default="", help="more labels as key=value,key=value")
    parser.add_argument("--token", default=None, help="bearer token required by the endpoint")
    parser.add_argument("--py-spy", default=None, help="py-spy command (default: found on PATH)")
    parser.add_argument("--log-format", default="kv", choices=("kv", "json"))
    return parser


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {exc}") from None
    return text


def _positive(convert: Callable[[str], Any], expected: str, bound: str) -> Callable[[str], Any]:
    """Returns an argparse type: ``convert``'s value of the text, finite and above 0."""

    # ArgumentTypeError, not ValueError: argparse prints its message as it is.
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not 0 < value < math.inf:  # inf and nan too: a window must end
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse


_positive_int = _positive(int, "a whole number", "1 or more")
_positive_seconds = _positive(float, "seconds", "a positive number of seconds")


def _default_py_spy() -> str:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else (shutil.which("py-spy") or "py-spy")


def main(argv: list[str] | None = None) -> int:
    """Runs ``fleetflame attach`` until SIGTERM/SIGINT or until the process cannot be profiled."""
    args = build_parser().parse_args(argv)
    setup_logging("info", args.log_format)
    try:
        labels = parse_labels(args.labels)  # as the sampler reads FLEETFLAME_LABELS
    except ValueError as exc:
        print(f"fleetflame attach: --labels: {exc}", file=sys.stderr)
        return 2
    if args.pid is not None and not Path(f"/proc/{args.pid}").exists():
        print(f"fleetflame attach: no process {args.pid}", file=sys.stderr)
        return EXIT_GONE
    attacher = Attacher(
        pid=args.pid,
        match=args.match,
        window=args.window,
        rate=args.rate,
        idle=args.idle,
        service=args.service,
        labels=labels,
        py_spy=args.py_spy or _default_py_spy(),
        nonblocking=args.nonblocking,
    )
    if not is_loopback(args.host) and not args.token:
        print(
            "fleetflame attach: serving stack traces beyond localhost needs --token",
            file=sys.stderr,
        )
        return 2
    try:
        server = serve(attacher, args.host, args.port, args.token)
    except OSError as exc:
        print(f"fleetflame attach: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    # The port goes to stdout first, so scripts (and tests) can read where it serves.
    print(server.port, flush=True)
    log_event(log, logging.INFO, "serving", url=server.url)

    def on_signal(signum: int, _frame: Any) -> None:
        attacher.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        attacher.run()
    finally:
        server.stop()
    if attacher.error is not None:
        print(f"fleetflame attach: {attacher.error}", file=sys.stderr)
        return attacher.error.exit_code
    return 0
