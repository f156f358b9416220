"""``import sampler`` stays cheap: the HTTP server, the SVG renderer and json load when used.

A deterministic check of what a fresh interpreter has imported, not a timing (the figure is
in bench/bench_endpoint.py).
"""

import pytest
from samplerhelpers import run_python

# Which modules are loaded, not how long they take: runs beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

SERVER_CODE = ("http.server", "wsgiref", "email", "json", "xml", "socketserver", "sampler._server")
# Costly modules the sampler imports only where it uses them (each ~2-8 ms at import).
LAZY = ("logging", "inspect", "dataclasses", "secrets", "socket", "typing", "random")

LOADED = """
import sys
{code}
wanted = {wanted!r}
print(*(m for m in sys.modules if m in wanted or m.startswith(tuple(w + "." for w in wanted))))
"""


def loaded_after(code, wanted=SERVER_CODE):
    """Returns the modules of ``wanted`` a fresh interpreter has loaded after running ``code``."""
    return set(run_python("-c", LOADED.format(code=code, wanted=wanted)).stdout.split())


def test_the_interpreter_alone_loads_none_of_them():
    assert not loaded_after("pass")


def test_import_sampler_loads_no_server_code():
    assert not loaded_after("import sampler")


def test_import_sampler_loads_none_of_the_costly_modules_it_can_do_without():
    assert not loaded_after("pass", LAZY)  # the interpreter alone does not either
    assert not loaded_after("import sampler", LAZY)


def test_start_from_env_when_not_asked_loads_no_server_code():
    assert not loaded_after("import sampler; assert sampler.start_from_env() is None")


def test_make_wsgi_app_loads_the_server_when_called():
    code = "import sampler; sampler.start(port='none', driver='thread'); sampler.make_wsgi_app()"
    assert "sampler._server" in loaded_after(code + "; sampler.stop()")
