"""Structured log lines: an event message plus key=value fields, rendered as logfmt or JSON."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["JSONFormatter", "KeyValueFormatter", "log_event", "setup_logging"]


def log_event(logger: logging.Logger, level: int, message: str, **fields: Any) -> None:
    """Logs ``message`` with structured fields that the formatters render as key=value pairs."""
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={"fields": fields}, stacklevel=2)


def _quote(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\\\n\t') and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + (
        f".{int(record.msecs):03d}Z"
    )


class KeyValueFormatter(logging.Formatter):
    """Renders ``ts=... level=... logger=... msg="..." key=value ...`` (logfmt) lines."""

    def format(self, record: logging.LogRecord) -> str:
        parts = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        parts.update(getattr(record, "fields", {}))
        line = " ".join(f"{key}={_quote(value)}" for key, value in parts.items())
        if record.exc_info:
            line += " exc=" + _quote(self.formatException(record.exc_info))
        return line


class JSONFormatter(logging.Formatter):
    """Renders each record as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        data.update(getattr(record, "fields", {}))
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


def setup_logging(level: str = "info", fmt: str = "kv") -> None:
    """Sends the collector's logs to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # APScheduler logs every job run at INFO; keep its warnings (skipped runs) only. Alembic
    # names each of its plugins at INFO at every start; its migrations stay told.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
