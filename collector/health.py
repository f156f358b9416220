"""The collector's own health: /healthz and Prometheus text-format /metrics on a small HTTP port."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from sampler.serving import Environ, Server, StartResponse

__all__ = ["HealthServer", "Metrics", "METRICS"]

# name -> (type, help): every metric the collector exports, declared once.
METRICS: dict[str, tuple[str, str]] = {
    "fleetflame_collector_polls_total": ("counter", "Target fetches by result (ok or failed)."),
    "fleetflame_collector_target_failures_total": (
        "counter",
        "Failed fetches per target and reason (refused, timeout, dns, http, too_large, invalid).",
    ),
    "fleetflame_collector_target_up": ("gauge", "1 if the target's last poll succeeded, else 0."),
    "fleetflame_collector_targets": ("gauge", "Targets this collector polls (after sharding)."),
    "fleetflame_collector_fetch_seconds": ("histogram", "Time to fetch and validate one target."),
    "fleetflame_collector_poll_cycle_seconds": ("summary", "Duration of whole poll cycles."),
    "fleetflame_collector_overruns_total": (
        "counter",
        "Poll rounds whose last result came later than poll_interval after their start.",
    ),
    "fleetflame_collector_skipped_polls_total": (
        "counter",
        "Polls of a target skipped because its previous poll was still in flight.",
    ),
    "fleetflame_collector_rows_written_total": ("counter", "Sample rows committed to the store."),
    "fleetflame_collector_samples_written_total": ("counter", "Samples committed to the store."),
    "fleetflame_collector_write_seconds": ("summary", "Duration of store writes."),
    "fleetflame_collector_buffered_rows": (
        "gauge",
        "Sample rows waiting in memory for the database.",
    ),
    "fleetflame_collector_dropped_rows_total": (
        "counter",
        "Sample rows dropped because the in-memory buffer was full.",
    ),
    "fleetflame_collector_lag_seconds": (
        "gauge",
        "Age of the oldest delta not yet written to the database (0 when none).",
    ),
    "fleetflame_collector_database_up": ("gauge", "1 if the last database operation succeeded."),
    "fleetflame_collector_resets_total": (
        "counter",
        "Counters that went down for the same instance (treated as restarts from zero).",
    ),
    "fleetflame_collector_new_instances_total": (
        "counter",
        "New instance ids seen (worker starts, restarts and forks).",
    ),
}

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

LabelKey = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels_text(labels: LabelKey, extra: str = "") -> str:
    parts = [f'{key}="{_escape(value)}"' for key, value in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Metrics:
    """Thread-safe counters, gauges, summaries and histograms rendered in Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[LabelKey, float]] = {name: {} for name in METRICS}
        self._observations: dict[str, dict[LabelKey, list[float]]] = {}

    @staticmethod
    def _key(labels: Mapping[str, str] | None) -> LabelKey:
        return tuple(sorted((labels or {}).items()))

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        """Adds ``amount`` to a counter."""
        key = self._key(labels)
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        """Sets a gauge."""
        with self._lock:
            self._values[name][self._key(labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Records one observation of a summary or histogram."""
        key = self._key(labels)
        kind = METRICS[name][0]
        with self._lock:
            state = self._observations.setdefault(name, {}).setdefault(
                key, [0.0, 0.0] + ([0.0] * len(_BUCKETS) if kind == "histogram" else [])
            )
            state[0] += 1
            state[1] += value
            if kind == "histogram":
                for i, bound in enumerate(_BUCKETS):
                    if value <= bound:
                        state[2 + i] += 1

    def get(self, name: str, **labels: str) -> float:
        """Returns a counter's or gauge's current value (0 if never set)."""
        with self._lock:
            return self._values[name].get(self._key(labels), 0)

    def render(self) -> str:
        """Renders every metric in the Prometheus text exposition format (version 0.0.4)."""
        lines: list[str] = []
        with self._lock:
            for name, (kind, help_) in METRICS.items():
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
                if kind in ("counter", "gauge"):
                    series = self._values[name] or ({(): 0.0} if not name.endswith("up") else {})
                    for key, value in sorted(series.items()):
                        lines.append(f"{name}{_labels_text(key)} {value:g}")
                    continue
                for key, state in sorted(self._observations.get(name, {}).items()):
                    if kind == "histogram":
                        for i, bound in enumerate(_BUCKETS):
                            le = _labels_text(key, f'le="{bound}"')
                            lines.append(f"{name}_bucket{le} {state[2 + i]:g}")
                        inf = _labels_text(key, 'le="+Inf"')
                        lines.append(f"{name}_bucket{inf} {state[0]:g}")
                    lines.append(f"{name}_count{_labels_text(key)} {state[0]:g}")
                    lines.append(f"{name}_sum{_labels_text(key)} {state[1]:g}")
        return "\n".join(lines) + "\n"


class HealthServer:
    """Serves /healthz and /metrics on daemon threads (the sampler's HTTP server) until ``stop()``."""

    def __init__(
        self,
        listen: str,
        metrics: Metrics,
        status: Callable[[], tuple[bool, dict[str, Any]]],
    ) -> None:
        host, _, port = listen.rpartition(":")
        self._metrics = metrics
        self._status = status
        self._server = Server(
            self._app,
            host.strip("[]") or "127.0.0.1",
            int(port),
            name="fleetflame-health",
            workers=2,
        )
        self.port: int = self._server.port
        self.url = f"http://{host or '127.0.0.1'}:{self.port}"

    def _app(self, environ: Environ, start_response: StartResponse) -> list[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            status, kind, body = (
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                self._metrics.render(),
            )
        elif path == "/healthz":
            healthy, detail = self._status()
            state = {"status": "ok" if healthy else "unhealthy", **detail}
            status, kind = (200 if healthy else 503), "application/json"
            body = json.dumps(state, indent=1) + "\n"
        else:
            status, kind, body = 404, "text/plain; charset=utf-8", "try /healthz or /metrics\n"
        data = body.encode("utf-8")
        reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
        start_response(
            f"{status} {reason}", [("Content-Type", kind), ("Content-Length", str(len(data)))]
        )
        return [data]

    def stop(self) -> None:
        """Stops serving and releases the port."""
        self._server.stop()
