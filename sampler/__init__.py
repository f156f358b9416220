"""fleetflame's in-process sampler: import it, call ``start()``, curl the endpoint.

    import sampler
    sampler.start(service="api")          # http://127.0.0.1:8021/stacks

Standard library only. See docs/sampler.md.
"""

from __future__ import annotations

from ._core import Sampler, SamplerError, running, start, start_from_env, stop
from ._labels import current_labels, tag, tagged
from ._server import make_wsgi_app
from ._settings import SETTINGS, ConfigError

__version__ = "0.1.0"

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
]
