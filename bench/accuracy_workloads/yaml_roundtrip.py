"""PyYAML loads and dumps a sizable document with its pure-Python SafeLoader and SafeDumper.

The pure-Python loader allocates many small objects, so the garbage collector runs often.
"""

from __future__ import annotations

import random
import time

import _common

deadline = _common.start_script()

import yaml  # noqa: E402 - the sampler starts first, as in a service


def make_document(services: int) -> dict:
    rng = random.Random(2)
    return {
        "version": 3,
        "services": {
            f"service-{i}": {
                "image": f"registry.example/team/app-{i}:{rng.randint(1, 99)}.{rng.randint(0, 9)}",
                "replicas": rng.randint(1, 12),
                "env": {
                    f"VAR_{j}": rng.choice(["on", "off", "1.5", "yes", "x y z"]) for j in range(8)
                },
                "ports": [{"port": 8000 + j, "protocol": "tcp"} for j in range(3)],
                "healthcheck": {"path": "/health", "interval": "10s", "retries": 3},
                "labels": [f"team-{rng.randint(1, 20)}", "tier: backend", "multi\nline"],
            }
            for i in range(services)
        },
    }


TEXT = yaml.dump(make_document(150), Dumper=yaml.SafeDumper)


def load_document() -> dict:
    return yaml.load(TEXT, Loader=yaml.SafeLoader)


def dump_document(document: dict) -> str:
    return yaml.dump(document, Dumper=yaml.SafeDumper)


def roundtrip_once() -> None:
    dump_document(load_document())


_common.add_extra(lambda: {"yaml_lines": TEXT.count("\n"), "libyaml_used": False})
_common.write_module_map()
while time.monotonic() < deadline:
    roundtrip_once()
