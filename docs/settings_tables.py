"""Writes the settings tables of docs/sampler.md, docs/collector.md and docs/webui.md from the
declarations (``sampler.settings``); with ``--check``, says which differ and exits 1.

    python docs/settings_tables.py            # rewrite the tables in place
    python docs/settings_tables.py --check    # what tests/test_settings_docs.py checks

Only a table's lines change: it is found by its header line and ends at the first line that
is not a table row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def tables() -> dict[Path, str]:
    """Each doc and the table its settings render to."""
    from collector import settings as collector_settings
    from sampler import SETTINGS
    from sampler.settings import markdown_table
    from webui import settings as web_settings

    docs = ROOT / "docs"
    return {
        docs / "sampler.md": markdown_table(SETTINGS, meaning="what it does"),
        docs / "collector.md": collector_settings.markdown_table(),
        docs / "webui.md": web_settings.markdown_table(),
    }


def with_table(text: str, table: str) -> str:
    """Returns ``text`` with the table that has ``table``'s header replaced by ``table``."""
    header = table.splitlines()[0]
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == header]
    if len(starts) != 1:
        raise ValueError(f"expected one table headed {header!r}, found {len(starts)}")
    end = starts[0]
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "".join(lines[: starts[0]]) + table + "".join(lines[end:])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which tables differ")
    args = parser.parse_args()
    stale = []
    for path, table in tables().items():
        text = path.read_text()
        new = with_table(text, table)
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new)
    verb = "differs from its declarations" if args.check else "rewritten"
    for path in stale:
        print(f"{path}: settings table {verb}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
