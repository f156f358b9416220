"""The sampler's logger, "sampler", imported on first use: logging costs ~8 ms at import."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    import logging


class _Logger:
    """Stands for ``logging.getLogger("sampler")`` until something is logged."""

    def __getattr__(self, name: str) -> object:
        import logging

        return getattr(logging.getLogger("sampler"), name)


log: logging.Logger = _Logger()  # type: ignore[assignment]
