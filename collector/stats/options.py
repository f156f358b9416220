"""The settings of a comparison, declared once (``sampler.settings``): they feed ``Options``,
the ``fleetflame compare`` options and environment variables, and the table in
docs/regressions.md."""

from __future__ import annotations

from dataclasses import dataclass

from sampler.settings import Setting, SettingsError, declare, integer, number

__all__ = ["ENV_PREFIX", "SETTINGS", "Options"]

ENV_PREFIX = "FLEETFLAME_COMPARE_"

SETTINGS: tuple[Setting, ...] = declare(
    ENV_PREFIX,
    Setting(
        "fdr",
        number,
        0.05,
        "False discovery rate kept over the functions judged (Benjamini-Hochberg): a change is "
        "significant when its q-value is at most this.",
    ),
    Setting(
        "fail_above",
        number,
        2.0,
        "A regression is a significant change that raises a function's self or total share by "
        "more than this many points.",
    ),
    Setting("confidence", number, 0.95, "Level of each change's confidence interval."),
    Setting(
        "min_samples",
        integer,
        30,
        "A function is judged only when, were its share the same on both sides, the side "
        "with fewer samples would hold at least this many of its samples.",
    ),
    Setting(
        "min_replicates",
        integer,
        3,
        "A function is judged only when at least this many replicates hold it, both sides "
        "together.",
    ),
    Setting("power", number, 0.8, "Power of the minimal detectable change."),
    Setting(
        "splits",
        integer,
        20,
        "A/A splits of the replicates that measure the comparison's noise floor (0: none).",
    ),
    Setting("seed", integer, 0, "Seed of the A/A splits: the same input gives the same report."),
)
_DEFAULTS = {setting.name: setting.default for setting in SETTINGS}


@dataclass(frozen=True)
class Options:
    """The settings of one comparison, each defaulting to its declaration in SETTINGS."""

    fdr: float = _DEFAULTS["fdr"]
    fail_above: float = _DEFAULTS["fail_above"]
    confidence: float = _DEFAULTS["confidence"]
    min_samples: int = _DEFAULTS["min_samples"]
    min_replicates: int = _DEFAULTS["min_replicates"]
    power: float = _DEFAULTS["power"]
    splits: int = _DEFAULTS["splits"]
    seed: int = _DEFAULTS["seed"]

    def __post_init__(self) -> None:
        for name in ("fdr", "confidence", "power"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise SettingsError(f"{name} must be between 0 and 1 (exclusive), got {value}")
        if self.fail_above < 0:
            raise SettingsError(f"fail_above must be 0 points or more, got {self.fail_above}")
        for name, low in (("min_samples", 1), ("min_replicates", 1), ("splits", 0)):
            if getattr(self, name) < low:
                raise SettingsError(f"{name} must be {low} or more, got {getattr(self, name)}")
