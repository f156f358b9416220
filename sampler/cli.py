"""The ``fleetflame`` command: dispatches to the sampler, collector and web UI subcommands.

Subcommands import their package lazily, so the sampler stays free of third-party imports.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with a main(argv) function, one-line help)
SUBCOMMANDS = {
    "run": ("sampler.__main__", "run a Python program under the sampler"),
    "trace": ("sampler._trace_cli", "record every call of a short run, for Perfetto"),
    "collect": ("collector.cli", "poll the fleet and store profiles"),
    "attach": ("attach.cli", "profile a process that cannot import the sampler (py-spy)"),
    "web": ("webui.cli", "serve the web UI"),
    "compare": ("collector.compare", "compare two sets of folded files, judged with their noise"),
}


def main(argv: list[str] | None = None) -> int:
    """Runs ``fleetflame SUBCOMMAND ...`` and returns its exit status."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in SUBCOMMANDS:
        width = max(map(len, SUBCOMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
        print("usage: fleetflame SUBCOMMAND [options]\n\nsubcommands:\n" + "\n".join(lines))
        return 0 if args and args[0] in ("-h", "--help") else 2
    module_name, _ = SUBCOMMANDS[args[0]]
    module = importlib.import_module(module_name)
    return int(module.main(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
