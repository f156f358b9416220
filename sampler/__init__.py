"""fleetflame's in-process sampler: import it, call ``start()``, curl the endpoint.

    import sampler
    sampler.start(service="api")          # http://127.0.0.1:8021/stacks

Standard library only. See docs/sampler.md.
"""

from __future__ import annotations

from ._core import Sampler, SamplerError
from ._labels import current_labels, tag, tagged
from ._process import running, start, start_from_env, stop
from ._settings import SETTINGS, ConfigError

# Not typing.TYPE_CHECKING: importing typing is a cost of its own; type checkers treat any
# name TYPE_CHECKING this way.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._server import ProfileSource, SamplerApp
    from ._trace import Trace

__version__ = "0.1.0"


def make_wsgi_app(sampler: ProfileSource | None = None, token: str | None = None) -> SamplerApp:
    """Returns a WSGI app serving the running (or given) sampler, to mount in your own server."""
    # Imported on call: the HTTP code costs an import of its own that most hosts never need.
    from ._server import make_wsgi_app

    return make_wsgi_app(sampler, token)


def trace(
    output: str = "trace.json", seconds: float | None = None, max_events: int | None = None
) -> Trace:
    """Returns a context manager recording every call and return of every thread into a
    Trace Event file for Perfetto; see docs/trace.md.

        with sampler.trace("run.json"):
            main()
    """
    # Imported on call: tracing is for short runs on a developer's machine, never on by default.
    from ._trace import Trace

    return Trace(output, seconds=seconds, max_events=max_events)


__all__ = [
    "SETTINGS",
    "ConfigError",
    "Sampler",
    "SamplerError",
    "__version__",
    "current_labels",
    "make_wsgi_app",
    "running",
    "start",
    "start_from_env",
    "stop",
    "tag",
    "tagged",
    "trace",
]
