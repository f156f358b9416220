"""The configuration files the demo writes for the collector and the web UI, under var/demo."""

from __future__ import annotations

import json
import os
from pathlib import Path

from demoshop import ports


def database_url(var: Path) -> str:
    """The SQLAlchemy URL of the demo's profile store: a SQLite file in the var folder."""
    return f"sqlite:///{var / 'fleetflame.db'}"


def _toml_str(value: str) -> str:
    # A JSON string is also a valid TOML basic string (same escapes).
    return json.dumps(value)


def write_atomically(path: Path, text: str) -> Path:
    """Writes ``text`` to ``path`` through a rename: a reader sees the old file or the new."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_collector_config(var: Path, plan: ports.PortPlan, poll_interval: float) -> Path:
    """Writes var/demo/collector.toml: poll every sampler port of the demo, store in SQLite."""
    text = f"""# Written by the demo (deploy/demo): see deploy/collector.toml for a documented example.
database_url = {_toml_str(database_url(var))}
poll_interval = {poll_interval}
targets = [{_toml_str(f"{ports.HOST}:{plan.sampler_range}")}]
target_labels = {{ environment = "demo" }}
health_listen = {_toml_str(f"{ports.HOST}:{plan.collector_health}")}
# The planted regression found by itself: the job compares every 10 s (the default is 60 s).
findings_interval = 10.0
# Stalls and request figures every 10 s too (the default is 30 s).
worst_interval = 10.0
web_url = {_toml_str(f"http://{ports.HOST}:{plan.web_ui}")}
"""
    return write_atomically(var / "collector.toml", text)


def write_web_config(var: Path) -> Path:
    """Writes var/demo/webui.toml: read the demo's store (host and port go on the command line)
    and keep the saved stack indexes beside it."""
    text = f"""# Written by the demo (deploy/demo).
database_url = {_toml_str(database_url(var))}
title = "fleetflame demo"
index_dir = {_toml_str(str(var / "index"))}
"""
    return write_atomically(var / "webui.toml", text)
