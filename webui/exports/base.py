"""What every export format is given and gives back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Export", "ExportInfo"]


@dataclass(frozen=True)
class ExportInfo:
    """Where a profile comes from: its window, mode and what one sample stands for."""

    start: int  # epoch seconds, window start (inclusive)
    end: int  # epoch seconds, window end (exclusive)
    mode: str = "cpu"  # "cpu" or "wall"
    interval: float = 0.01  # seconds one sample stands for
    title: str = "fleetflame"  # a human name for the profile (service and filters)


@dataclass(frozen=True)
class Export:
    """An export format: its name, HTTP content type, file extension and renderer."""

    name: str
    content_type: str
    extension: str
    render: Callable[[Mapping[str, int], ExportInfo], bytes]
    content_encoding: str | None = None
