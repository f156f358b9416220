"""``fleetflame collect``: runs the collector from a TOML config, env vars and options."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from collector.logs import log_event, setup_logging
from collector.settings import SettingsError, add_arguments, load_settings

__all__ = ["main"]

log = logging.getLogger("collector.cli")


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser of ``fleetflame collect``."""
    parser = argparse.ArgumentParser(
        prog="fleetflame collect",
        description="Poll every sampler in the fleet and store time-bucketed profiles.",
        epilog="Every setting can also be set in the config file or as FLEETFLAME_COLLECTOR_<NAME>; "
        "see docs/collector.md.",
    )
    parser.add_argument("--config", "-c", help="TOML config file (see deploy/collector.toml)")
    parser.add_argument(
        "--once",
        action="store_true",
        help="poll every target once, write, and exit (status 1 if the write failed)",
    )
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the collector until SIGTERM or SIGINT; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config, overrides=args)
    except SettingsError as exc:
        print(f"fleetflame collect: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_format)

    from collector.service import Collector
    from collector.store import StoreError, StoreUnavailable

    try:
        collector = Collector(settings)
    except StoreError as exc:
        log_event(log, logging.ERROR, "cannot open the store", error=str(exc))
        return 2
    if args.once:
        try:
            collector.migrate(wait=False)
            report = collector.poll_cycle()
        except StoreError as exc:  # unreachable (1: try again), or not a database of ours (2)
            log_event(log, logging.ERROR, "cannot open the store", error=str(exc))
            return 1 if isinstance(exc, StoreUnavailable) else 2
        finally:
            collector.stop()
        return 0 if report.written and not report.skipped else 1

    def on_signal(signum: int, _frame: Any) -> None:
        log_event(log, logging.INFO, "stopping", signal=signal.Signals(signum).name)
        collector.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        collector.start()
        collector.wait()
    except StoreError as exc:  # a file that is not a database, a schema it cannot migrate
        log_event(log, logging.ERROR, "cannot open the store", error=str(exc))
        return 2
    except SettingsError as exc:  # found at start: health_listen taken, or not an address here
        print(f"fleetflame collect: {exc}", file=sys.stderr)
        return 2
    finally:
        collector.stop()
    return 0
