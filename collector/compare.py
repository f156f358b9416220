"""``fleetflame compare``: which functions got slower between two sets of folded files, judged
with their noise; a CI gate.

    fleetflame compare A_FILES_OR_DIRS... --vs B_FILES_OR_DIRS... [--fail-above 2] [--json]
    fleetflame compare --database-url URL --service S --a-label k:v --b-label k:v [--from --to]

Each folded file is one replicate (a directory means every ``*.folded`` file in it): write
them with ``python -m sampler run --output DIR --every 60 prog.py``. Prints the findings
ranked (``--json``: one JSON object) and exits 1 when a significant change raises a
function's self or total share by more than ``--fail-above`` points, 0 when none does, 2 on
bad input. The statistics are ``collector.stats``'s; docs/regressions.md tells how to read
them. This module does the I/O: files in, text out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sampler.profile import FoldedFormatError, merge, parse_folded
from sampler.settings import SettingsError, add_arguments, option_values, text_values

from .compare_db import SideError, read_sides
from .stats import ENV_PREFIX, SETTINGS, Comparison, ComparisonError, Finding, Options, compare

__all__ = ["main"]

# The database forms (collector/compare_db.py): flag -> help.
_DATABASE = {
    "--database-url": "read both sides from the collector's store at this URL",
    "--service": "the service both sides are read from (with --database-url)",
    "--a-label": "side A's samples: key:value (e.g. version:1.4.1)",
    "--b-label": "side B's samples: key:value (e.g. version:1.4.2)",
    "--from": "the window of both sides [default: -1h]",
    "--to": "[default: now]",
    "--a-from": "side A's own window start",
    "--a-to": "side A's own window end",
    "--b-from": "side B's own window start",
    "--b-to": "side B's own window end",
}


_WINDOW_OPTIONS = frozenset(flag for flag in _DATABASE if flag.endswith(("-from", "-to")))


class InputError(Exception):
    """The files given cannot be compared; the message says which and why."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetflame compare",
        description="Compare two sets of folded files (one file a replicate: an instance's "
        "minute, say) function by function, with confidence intervals and a false discovery "
        "rate; exit 1 when a significant regression is found, 0 when none is, 2 on bad input.",
    )
    parser.add_argument("a", nargs="*", metavar="A", help="side A: folded files or directories")
    parser.add_argument(
        "--vs", nargs="+", default=[], metavar="B", help="side B: folded files or directories"
    )
    parser.add_argument(
        "--per-directory",
        action="store_true",
        help="one replicate per directory given, its *.folded files merged (give each "
        "process, or each run of a benchmark, a directory: where processes differ for good, "
        "their files are not independent replicates)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--top", type=int, default=20, help="rows of the printed table [default: 20]"
    )
    add_arguments(parser, SETTINGS, "comparison (also FLEETFLAME_COMPARE_<NAME>)")
    database = parser.add_argument_group(
        "from a database (instead of files): one replicate per instance and bucket"
    )
    for flag, text in _DATABASE.items():
        database.add_argument(flag, dest="db_" + flag[2:].replace("-", "_"), help=text)
    return parser


def _times_joined(argv: list[str]) -> list[str]:
    """Joins a window option to a relative time after it (``--from -2h`` as ``--from=-2h``):
    argparse takes ``-2h`` for an option and says the window option lacks its value."""
    joined: list[str] = []
    words = iter(argv)
    for word in words:
        if word in _WINDOW_OPTIONS:
            value = next(words, None)
            if value is not None and value.startswith("-") and not value.startswith("--"):
                joined.append(f"{word}={value}")
                continue
            joined.append(word)
            if value is not None:
                joined.append(value)
            continue
        joined.append(word)
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``fleetflame compare``; returns 1 on a significant regression, 0 on none, 2 on bad
    input."""
    parser = _parser()
    args = parser.parse_args(_times_joined(sys.argv[1:] if argv is None else list(argv)))
    try:
        # Defaults, then the environment, then the options.
        values = text_values(SETTINGS, os.environ, env_prefix=ENV_PREFIX)
        options = Options(**(values | option_values(SETTINGS, args)))
        if args.db_database_url is not None:
            a_groups, b_groups, comparison = _compare_database(args, options)
        else:
            a_groups, b_groups, comparison = _compare_files(args, options)
    except (InputError, SideError, SettingsError, ComparisonError) as exc:
        print(f"fleetflame compare: {exc}", file=sys.stderr)
        return 2
    regressions = comparison.regressions()
    if args.json:
        document = comparison.to_dict()
        document["regressions"] = [f.to_dict() for f in regressions]
        document["files"] = {"a": [n for n, _ in a_groups], "b": [n for n, _ in b_groups]}
        print(json.dumps(document, indent=1, allow_nan=False))
    else:
        print(_report(comparison, regressions, len(a_groups), len(b_groups), args.top))
    return 1 if regressions else 0


def _compare_files(args: argparse.Namespace, options: Options) -> tuple[list, list, Comparison]:
    given = [flag for flag in _DATABASE if getattr(args, "db_" + flag[2:].replace("-", "_"))]
    if given:
        raise InputError(f"{', '.join(given)} need --database-url (or give folded files)")
    if not args.a or not args.vs:
        raise InputError("give both sides: fleetflame compare A_FILES... --vs B_FILES...")
    a_groups = _replicates(args.a, "A", args.per_directory)
    b_groups = _replicates(args.vs, "B", args.per_directory)
    a_files = {path.resolve() for _, files in a_groups for path in files}
    both = a_files & {path.resolve() for _, files in b_groups for path in files}
    if both:
        raise InputError(f"{sorted(both)[0]} is on both sides: give each file to one side")
    return a_groups, b_groups, compare(_read(a_groups), _read(b_groups), options)


def _compare_database(args: argparse.Namespace, options: Options) -> tuple[list, list, Comparison]:
    if args.a or args.vs:
        raise InputError("give folded files or --database-url, not both")
    if not args.db_service:
        raise InputError("--database-url needs --service (the service both sides come from)")
    a_label, b_label = args.db_a_label, args.db_b_label
    own_windows = any((args.db_a_from, args.db_a_to, args.db_b_from, args.db_b_to))
    if not own_windows and not (a_label and b_label):
        raise InputError(
            "say what differs: --a-label and --b-label (two versions), or each side's window "
            "(--a-from --a-to --b-from --b-to)"
        )
    a, b, side_a, side_b = read_sides(
        args.db_database_url,
        args.db_service,
        windows={"a": (args.db_a_from, args.db_a_to), "b": (args.db_b_from, args.db_b_to)},
        labels={"a": a_label, "b": b_label},
        shared=(args.db_from or "-1h", args.db_to or "now"),
    )
    for name, replicates in (("A", a), ("B", b)):
        if not replicates:
            raise InputError(f"side {name} has no samples of {args.db_service} in its window")
    groups_a = [(name, []) for name in side_a.names]
    groups_b = [(name, []) for name in side_b.names]
    return groups_a, groups_b, compare(a, b, options)


def _replicates(
    arguments: Sequence[str], side: str, per_directory: bool
) -> list[tuple[str, list[Path]]]:
    """Returns each replicate's name and files: a file each, or a directory each."""
    replicates: list[tuple[str, list[Path]]] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            found = sorted(
                p
                for p in path.iterdir()
                if p.suffix == ".folded" and not p.name.startswith(".") and p.is_file()
            )
            if not found:
                raise InputError(f"side {side}: directory {path} holds no *.folded file")
            if per_directory:
                replicates.append((str(path), found))
            else:
                replicates += [(str(p), [p]) for p in found]
        elif per_directory:
            raise InputError(f"side {side}: {path} is no directory (--per-directory)")
        elif path.is_file():
            replicates.append((str(path), [path]))
        else:
            raise InputError(f"side {side}: {path} is no file or directory")
    return replicates


def _read(replicates: Sequence[tuple[str, list[Path]]]) -> list[dict[str, int]]:
    return [merge(map(_read_file, files)) for _, files in replicates]


def _read_file(path: Path) -> dict[str, int]:
    try:
        return parse_folded(path.read_text(encoding="utf-8"))
    except FoldedFormatError as exc:
        raise InputError(f"{path}: {exc} (expected folded stacks: 'frame;frame count')") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text, so no folded stacks") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None


def _report(
    comparison: Comparison, regressions: list[Finding], a_files: int, b_files: int, top: int
) -> str:
    options = comparison.options
    floor = comparison.noise_floor
    lines = []
    for side, replicates, samples, files in (
        ("A", comparison.a_replicates, comparison.a_samples, a_files),
        ("B", comparison.b_replicates, comparison.b_samples, b_files),
    ):
        empty = f" ({files - replicates} empty ones left out)" if files > replicates else ""
        lines.append(f"{side}: {replicates} replicates, {samples:,} samples{empty}")
    if floor.largest_change is not None:
        lines.append(
            f"noise floor: A/A splits of these replicates show changes up to "
            f"{floor.largest_change:.2f} points (median of {floor.splits} splits; "
            f"{floor.significant_splits} of them found a significant one)"
        )
    if floor.mde is not None:
        vary = (
            f"; shares vary {floor.dispersion:.1f}x more between replicates than sample "
            "counting explains"
            if floor.dispersion is not None
            else ""
        )
        # Each function's own depends on how much its share varies between replicates: the
        # median alone read as a contradiction beside smaller changes found significant.
        spread = (
            f"{floor.mde_low:.2f} to {floor.mde_high:.2f}; " if floor.mde_low is not None else ""
        )
        lines.append(
            f"smallest detectable change: median {floor.mde:.2f} points over the "
            f"{floor.mde_functions} judged self shares that vary ({spread}"
            f"{options.power:.0%} power){vary}"
        )
    judged = [f for f in comparison.findings if f.judged]
    ci = f"{options.confidence:.0%} CI"
    lines += ["", f"{'change':>7}  {ci:^17}  {'A %':>6}  {'B %':>6}  {'q':>7}  kind   function"]
    for f in judged[:top]:
        mark = "  significant" if f.significant else ""
        lines.append(
            f"{f.change:>+7.2f}  [{f.ci_low:+6.2f}, {f.ci_high:+6.2f}]  {f.a_share:6.2f}  "
            f"{f.b_share:6.2f}  {_q(f.q):>7}  {f.kind:<5}  {f.function}{mark}"
        )
    hidden = sum(f.significant for f in judged[top:])
    if hidden:
        lines.append(f"... and {hidden} more significant changes (--top, or --json for all)")
    rare = [f for f in comparison.findings if not f.judged]
    if rare:
        lines.append(
            f"{len(rare)} too rare to judge (fewer than {options.min_samples} samples on the "
            f"smaller side were its share the same, or in fewer than {options.min_replicates} "
            "replicates): listed in --json"
        )
    lines.append("")
    significant = sum(f.significant for f in judged)
    if regressions:
        worst = ", ".join(f"{f.function} ({f.kind}) {f.change:+.2f}" for f in regressions[:5])
        lines.append(
            f"FAIL: {len(regressions)} significant regression(s) above {options.fail_above:g} "
            f"points at FDR {options.fdr:g}: {worst}"
        )
    else:
        lines.append(
            f"OK: no significant regression above {options.fail_above:g} points at FDR "
            f"{options.fdr:g} ({significant} significant change(s) in all)"
        )
    return "\n".join(lines)


def _q(q: float | None) -> str:
    if q is None:
        return ""
    return "<0.0001" if q < 1e-4 else f"{q:.4f}"
