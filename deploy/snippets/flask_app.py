"""A Flask app instrumented with fleetflame: one line to start, one call to label routes.

Under gunicorn with ``deploy/gunicorn.conf.py`` the ``post_fork`` hook starts the sampler and
the ``start_from_env()`` line below is a no-op (a second start is harmless); under uWSGI
``lazy-apps``, ``flask run`` or any server that imports this module in each worker, it is what
starts the sampler. Either way nothing runs unless ``FLEETFLAME_PORT`` (or
``FLEETFLAME_ENABLE``) is set in the environment.
"""

from __future__ import annotations

from flask import Flask

import sampler

sampler.start_from_env()

app = Flask(__name__)


@app.get("/hello/<name>")
def hello(name: str) -> str:
    return f"hello {name}\n"


def label_routes(flask_app: Flask) -> None:
    """Makes every view's samples carry ``route=<URL rule>``; call it once all routes exist.

    Why wrap the views: a label applies to the samples taken while the frame that set it is on
    the stack, so it must be set by a frame that encloses the view (a before_request hook
    returns before the view runs).
    """
    rules: dict[str, list[str]] = {}
    for rule in flask_app.url_map.iter_rules():
        rules.setdefault(rule.endpoint, []).append(rule.rule)
    for endpoint, view in list(flask_app.view_functions.items()):
        paths = rules.get(endpoint, [endpoint])
        route = paths[0] if len(paths) == 1 else endpoint  # few distinct values, not raw paths
        flask_app.view_functions[endpoint] = sampler.tagged(route=route)(view)


label_routes(app)
