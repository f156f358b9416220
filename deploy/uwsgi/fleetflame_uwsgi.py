"""A uWSGI post-fork hook that starts fleetflame's sampler in every worker.

Imported by ``deploy/uwsgi/uwsgi.ini`` (``import = fleetflame_uwsgi``). The sampler starts only
when ``FLEETFLAME_PORT`` or ``FLEETFLAME_ENABLE`` is set in the environment.
"""

from __future__ import annotations

from uwsgidecorators import postfork

import sampler


@postfork
def start_fleetflame() -> None:
    """Starts this worker's sampler, on the first free port of FLEETFLAME_PORT's range."""
    sampler.start_from_env()
