"""The profile core every room shares: frames, folded stacks, profiles, call trees, the
wire-format document, and time buckets and windows.

Standard library only, and pure: nothing here does I/O, keeps global state or reads a clock,
so the sampler (inside someone else's process), the collector and the web UI all import it.
The modules, each one concept (docs/architecture.md, "The profile core"):

- ``frames``: frame names, their escaping, and stacks as lists of frames;
- ``folded``: folded-stack text, parsed and printed;
- ``counts``: counts per stack, merged, subtracted, filtered;
- ``profiles``: ``Profile``, counts with the sampling interval that makes them seconds;
- ``tree``: ``Node``, the call tree; ``pruning``: bounded trees of large profiles;
- ``document``: the ``/profile.json`` document, built and validated, with its limits;
- ``windows``: bucket alignment, half-open time windows, the times people type.
"""

from __future__ import annotations

from . import frames
from .frames import *  # noqa: F403

# The sampler imports this package at start-up and needs only frames there; the other
# modules (~3 ms of imports with heapq, bisect, array and math) load on first use, in this
# order when a name is looked for.
_LAZY = ("folded", "counts", "tree", "profiles", "document", "windows", "pruning")

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from .counts import *  # noqa: F403
    from .document import *  # noqa: F403
    from .folded import *  # noqa: F403
    from .profiles import *  # noqa: F403
    from .pruning import *  # noqa: F403
    from .tree import *  # noqa: F403
    from .windows import *  # noqa: F403
else:

    def __getattr__(name: str) -> object:
        """Loads the module of a name not loaded yet (PEP 562); ``__all__`` loads them all."""
        from importlib import import_module

        public = list(frames.__all__)
        for module_name in _LAZY:
            module = import_module(f"{__name__}.{module_name}")
            if name in module.__all__:
                value = getattr(module, name)
                globals()[name] = value
                return value
            public += module.__all__
        if name == "__all__":
            return public
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*globals(), *__getattr__("__all__")})
