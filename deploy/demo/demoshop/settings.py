"""The demo's settings, declared once: they feed ``run.py``'s options, environment variables
(``FLEETFLAME_DEMO_<NAME>``) and the table in docs/demo.md (a test checks it lists them all)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sampler.settings import boolean

ENV_PREFIX = "FLEETFLAME_DEMO_"


@dataclass(frozen=True)
class Setting:
    """One demo setting: its name, type, default and one-line help."""

    name: str
    type: type
    default: Any
    help: str

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "duration",
        float,
        0.0,
        "Stop by itself after this many seconds (headless, as the tests run it); "
        "0 runs until Ctrl-C.",
    ),
    Setting(
        "deploy_after",
        float,
        60.0,
        "Seconds after the start at which version 1.4.2, with its planted regression, "
        "replaces 1.4.1 in a rolling deploy; a negative value never deploys.",
    ),
    Setting(
        "base_port",
        str,
        "8000",
        "First port of the demo on 127.0.0.1: web UI on it, the shop's sync and gthread pools "
        "on +1 and +2, the collector's health on +3, the samplers on +21 to +40; "
        "auto picks a free block.",
    ),
    Setting(
        "var_dir",
        str,
        "var/demo",
        "Folder for the SQLite files, logs, generated configs and fleet.json (kept across runs).",
    ),
    Setting("rate", float, 12.0, "Requests per second the load generator sends (at most 100)."),
    Setting(
        "poll_interval", float, 2.0, "Seconds between two polls of the fleet by the collector."
    ),
    Setting(
        "fresh", bool, False, "Delete the profiles and the shop database of earlier runs first."
    ),
)


def parse_args(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> argparse.Namespace:
    """Returns the settings: command-line options over environment variables over defaults."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="make demo  (or: python deploy/demo/run.py)",
        description="Runs fleetflame's demo fleet, collector and web UI on 127.0.0.1.",
    )
    for setting in SETTINGS:
        default = setting.default
        if setting.env_var in environ:
            raw = environ[setting.env_var]
            try:
                default = boolean(raw) if setting.type is bool else setting.type(raw)
            except ValueError:
                parser.error(f"{setting.env_var}={raw!r}: expected a {setting.type.__name__}")
        if setting.type is bool:
            parser.add_argument(
                setting.flag,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=setting.help,
            )
        else:
            parser.add_argument(
                setting.flag, type=setting.type, default=default, help=f"{setting.help} [{default}]"
            )
    args = parser.parse_args(argv)
    if args.duration < 0:
        parser.error("--duration must be 0 (run until Ctrl-C) or a number of seconds")
    if not 0 < args.rate <= 100:
        parser.error("--rate must be above 0 and at most 100 requests/s")
    if not 0.2 <= args.poll_interval <= 60:
        parser.error("--poll-interval must be from 0.2 to 60 seconds")
    if args.base_port != "auto":
        try:
            base = int(args.base_port)
        except ValueError:
            parser.error(f"--base-port must be a port number or auto, not {args.base_port!r}")
        if not 1024 <= base <= 65535 - 40:
            parser.error(f"--base-port must be from 1024 to {65535 - 40}, not {base}")
    return args


def markdown_table() -> str:
    """Renders the settings as the Markdown table docs/demo.md shows."""
    rows = [
        "| option | environment variable | default | what it does |",
        "| --- | --- | --- | --- |",
    ]
    for s in SETTINGS:
        rows.append(f"| `{s.flag}` | `{s.env_var}` | `{s.default}` | {s.help} |")
    return "\n".join(rows)
