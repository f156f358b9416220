"""One module per database engine: what SQLAlchemy cannot say the same way on both."""

from __future__ import annotations

from collector.store.engines.base import Engine, for_url

__all__ = ["Engine", "for_url"]
