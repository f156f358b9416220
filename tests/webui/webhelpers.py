"""Shared data of the web UI tests: a small fleet profile and the counts it should give."""

from __future__ import annotations

from collector.store import SampleRow

T0 = 1_700_000_000 // 86400 * 86400  # a UTC midnight: every tier boundary falls on it
XSS = "<img src=x onerror=alert(1)>"

# (service, host, version) -> {stack: count per minute}
FLEET = {
    ("api", "web-1", "1.4.1"): {
        "__main__:<module>;app:serve;app:handle;json:dumps": 6,
        "__main__:<module>;app:serve;app:handle;app:render": 3,
        f"__main__:<module>;app:serve;{XSS}": 1,
    },
    ("api", "web-2", "1.4.2"): {
        "__main__:<module>;app:serve;app:handle;json:dumps": 2,
        "__main__:<module>;app:serve;app:handle;app:render": 8,
        "__main__:<module>;app:serve;m:semi%3Bcolon": 1,
    },
    ("worker", "job-1", "1.4.2"): {"__main__:<module>;jobs:run;jobs:resize": 5},
}
MINUTES = 60


def fleet_rows(minutes: int = MINUTES, start: int = T0) -> list[SampleRow]:
    """Returns one row per (minute, series, stack) of FLEET."""
    rows = []
    for minute in range(minutes):
        for (service, host, version), stacks in FLEET.items():
            for stack, count in stacks.items():
                rows.append(
                    SampleRow(
                        start + 60 * minute,
                        "cpu",
                        service,
                        host,
                        f"{host}-i",
                        {"version": version, "route": '/up"load'},
                        stack,
                        count,
                    )
                )
    return rows


def expected(minutes: int = MINUTES, **match: str) -> dict[str, int]:
    """The merged folded counts of FLEET over ``minutes`` for series matching ``match``."""
    out: dict[str, int] = {}
    for (service, host, version), stacks in FLEET.items():
        series = {"service": service, "host": host, "version": version}
        if any(series[k] != v for k, v in match.items()):
            continue
        for stack, count in stacks.items():
            out[stack] = out.get(stack, 0) + count * minutes
    return out
