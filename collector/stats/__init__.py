"""Statistics of a comparison of two sides' profiles: which functions' shares changed, by
how much, how sure that is, and how large a change the comparison could see at all.

Pure: data in, data out; no I/O, no clock, no global state (the A/A splits draw from a
generator seeded by ``Options.seed``). Shared by ``fleetflame compare`` (folded files), and
meant for the web UI's compare view and the collector's scheduled comparisons (the store's
(instance, bucket) profiles). numpy and scipy, never in the sampler.

**The replicate, not the sample.** Samples taken from one process in one minute are not
independent draws: the process works through requests, batches and phases, so a function's
share moves from one minute and one instance to the next by more than sample counting
explains (overdispersion). A test that treats samples as independent (a two-proportion z-test
on pooled counts) then finds "significant" changes in comparisons of identical code; with
tens of thousands of samples it finds them almost always (``tests/stats``). The unit here is
the replicate, one profile, and a function's share is tested by how much it varies between
replicates.

**Welch's t on per-replicate shares** (``welch``), weighted by each replicate's samples so
that the change tested is the change of pooled shares that is reported, with each function's
variance moderated across functions (``moderation``: empirical Bayes, as limma's moderated t)
and the Welch-Satterthwaite degrees of freedom. Chosen over a permutation or bootstrap test,
also where replicates are few:

- A permutation test cannot reach the p-values a comparison of hundreds of functions needs
  when replicates are few: with 3 replicates a side there are 20 ways to split 6, so no
  p-value is below 0.1 (two-sided), and Benjamini-Hochberg over 300 functions needs about
  0.05 / 300 to find a single change. Welch's t with few degrees of freedom has heavy tails
  instead: it asks for a large change relative to the spread, and can still find one.
- A bootstrap of few replicates underestimates the spread (it resamples what it saw: its
  variance is ``(n - 1) / n`` of the sample's and its intervals have no t tails), so it finds
  changes in A/A comparisons more often than its level says.
- Plain Welch fails too where one side has few replicates and the other many (3 against 20:
  three A/A comparisons in four report a change): the few replicates' variance is often far
  too small, and the degrees of freedom computed from it then grow as well. Moderation draws
  each variance toward the dispersion all functions show together, which few replicates of
  150 functions do estimate well; with many replicates it changes next to nothing.
- Per-replicate shares are means of thousands of samples, close enough to normal for the t
  test for every function judged; rare functions, whose shares are skewed sums of a few
  samples, are not judged (``Options.min_samples``, ``Options.min_replicates``). Seeded A/A
  comparisons of overdispersed synthetic fleets hold the nominal rate from 2 to 60
  replicates a side, balanced or not (``tests/stats/test_stats_calibration.py``).
- Closed form: thousands of functions over thousands of replicates in milliseconds, A/A
  splits included (``bench/bench_compare.py``).

**Benjamini-Hochberg** (``fdr``) over every hypothesis judged (self and total shares
together): a change is significant when its q-value is at most ``Options.fdr``.

**The noise floor** (``NoiseFloor``): A/A splits of the replicates, each half holding half of
each side, show how large a change looks by chance here; the minimal detectable change at
``Options.power`` says how small a change the comparison could have found.

Modules: ``replicates`` (profiles as per-function count matrices), ``welch``,
``moderation``, ``fdr``, ``options`` (the settings, declared once), ``comparison`` (the
findings, ranked, and the noise floor).
"""

from __future__ import annotations

from .comparison import (
    SELF,
    TOTAL,
    Comparison,
    ComparisonError,
    Finding,
    NoiseFloor,
    compare,
    compare_replicates,
)
from .fdr import benjamini_hochberg
from .moderation import Prior, fit_prior, moderate
from .options import ENV_PREFIX, SETTINGS, Options
from .replicates import Replicates, replicates_of
from .welch import Welch, minimal_detectable_change, pooled_share, welch

__all__ = [
    "ENV_PREFIX",
    "SELF",
    "SETTINGS",
    "TOTAL",
    "Comparison",
    "ComparisonError",
    "Finding",
    "NoiseFloor",
    "Options",
    "Prior",
    "Replicates",
    "Welch",
    "benjamini_hochberg",
    "compare",
    "compare_replicates",
    "fit_prior",
    "minimal_detectable_change",
    "moderate",
    "pooled_share",
    "replicates_of",
    "welch",
]
