"""fleetflame: an always-on sampling profiler for Python fleets."""

import importlib.util
import platform
import sys
from pathlib import Path

from setuptools import Extension, find_namespace_packages, setup
from setuptools.command.build_py import build_py


class BuildPyWithAssets(build_py):
    """Copies the web UI's JavaScript from node_modules into the package before building."""

    def run(self):
        path = Path(__file__).resolve().parent / "webui" / "build_assets.py"
        spec = importlib.util.spec_from_file_location("_fleetflame_build_assets", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        try:
            module.build_assets()
        except Exception as exc:  # noqa: BLE001 - an editable install can go on without them
            if not getattr(self, "editable_mode", False):
                raise
            print(f"warning: web UI assets not built: {exc}")
        super().run()


def native_extensions() -> list[Extension]:
    """The sampler's native engine: built for CPython 3.11 on Linux, the only frame layout it
    knows and is tested on. Optional: without a compiler the pure-Python engine runs."""
    if not (
        sys.platform.startswith("linux")
        and platform.python_implementation() == "CPython"
        and sys.version_info[:2] == (3, 11)
    ):
        return []
    parts = [
        "module",
        "engine",
        "engine_status",
        "drain",
        "drain_stacks",
        "walk",
        "ring",
        "guard",
        "freed",
        "thread_slots",
        "thread_timers",
        "known_threads",
        "wall",
        "codemap",
        "count",
        "waits",
        "gil",
        "tags",
        "middleware",
        "route_tag",
        "wsgi_wrapper",
        "wsgi_request",
        "wsgi_recorder",
        "flask_routing",
        "counting",
        "watch",
        "asgi",
        "asgi_await",
        "asgi_request",
        "asgi_route",
        "timed",
        "running_calls",
        "function_numbers",
        "function_files",
        "line_sort",
    ]
    return [
        Extension(
            "sampler._native",
            sources=[f"sampler/_native_src/{part}.c" for part in parts],
            depends=[
                f"sampler/_native_src/{header}.h"
                for header in ("native", "module", "middleware", "threads", "asgi")
            ],
            extra_compile_args=[
                "-std=gnu11",
                # Only PyInit__native is exported: a host binary defining the same names
                # (uWSGI exports a function called stats) must not take our globals.
                "-fvisibility=hidden",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Wno-unused-parameter",
            ],
            libraries=["rt"],
            optional=True,
        )
    ]


COLLECTOR = [
    "SQLAlchemy>=2.0,<3",
    "alembic>=1.12",
    "APScheduler>=3.10,<4",
    "requests>=2.31",
    "psycopg[binary]>=3.1",
    "numpy>=1.24",
    "scipy>=1.10",
]
WEB = COLLECTOR + ["Flask>=3.0"]
DEV = WEB + [
    "pytest>=8",
    "pytest-timeout>=2.3",
    "pytest-xdist>=3.6",  # make test: most tests on two processes at once
    "playwright>=1.45",
    "py-spy>=0.3.14",
    "gunicorn>=22",
    "uWSGI>=2.0.22",
    "PyYAML>=6",
    "hypothesis>=6",
    "black>=24",  # bench/accuracy.py: a mypyc-compiled workload
    "Django>=4.2",
    # the request middleware's tests: FastAPI/Starlette under uvicorn, in-process via httpx
    "starlette>=0.40",
    "fastapi>=0.110",
    "uvicorn>=0.30",
    "httpx>=0.27",
    "ruff>=0.5",
    "mypy>=1.10",
]

# The web UI's vendored JavaScript is copied in by BuildPyWithAssets, after the packages were
# found: its folder made now is found as the package of those files (a fresh clone has none,
# and setuptools then warned that the package would be ignored).
try:
    (Path(__file__).resolve().parent / "webui" / "static" / "vendor").mkdir(exist_ok=True)
except OSError:  # a read-only tree (a container layer): the warning, not a failed build
    pass

setup(
    name="fleetflame",
    version="0.1.0",
    description="Always-on production sampling profiler for Python fleets",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # Namespace packages too: the folders that hold only data (the native engine's sources,
    # the web UI's static files and templates) are declared as what setuptools sees them as.
    packages=find_namespace_packages(
        include=[
            "sampler",
            "sampler.*",
            "collector",
            "collector.*",
            "webui",
            "webui.*",
            "attach",
            "attach.*",
        ]
    ),
    include_package_data=True,
    package_data={
        "sampler": ["py.typed", "_native.pyi"],
        "collector": [
            "py.typed",
            "migrations/*.ini",
            "migrations/*.py",
            "migrations/*.mako",
            "migrations/versions/*.py",
        ],
        "webui": ["py.typed", "templates/*", "static/*", "static/**/*"],
    },
    install_requires=[],
    extras_require={"collector": COLLECTOR, "web": WEB, "dev": DEV},
    ext_modules=native_extensions(),
    entry_points={"console_scripts": ["fleetflame = sampler.cli:main"]},
    cmdclass={"build_py": BuildPyWithAssets},
)
