"""Differences judged against seed noise: a paired comparison over the seeds two runs share.

Two method rows run with the same seeds on the same task, so each seed gives one difference (same data
order, same head initialisation); the mean of those differences and its standard error (sample standard
deviation / sqrt(n)) give an interval, mean +- ``K_SE`` standard errors. A rule then *holds* when the
interval lies where the claim says, *fails* when it lies where the claim says it should not, and is
*undecided* otherwise: with two or three seeds the interval is wide, and saying so is the honest verdict.

``K_SE = 2`` is a screen, not a significance test: with n = 2 or 3 seeds a 95% t-interval would need
12.7 or 4.3 standard errors. It still separates a difference that every seed shows from one that a
seed's luck could make.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

__all__ = [
    "K_SE",
    "MIN_SEEDS",
    "HOLDS",
    "FAILS",
    "UNDECIDED",
    "NOISE_RULE",
    "Paired",
    "paired",
    "by_seed",
    "exceeds",
    "at_most",
    "within",
]

#: The interval is mean +- K_SE standard errors of the per-seed differences.
K_SE = 2.0
#: At least this many shared seeds: one seed has no noise estimate.
MIN_SEEDS = 2

HOLDS = "holds"
FAILS = "fails"
UNDECIDED = "undecided"

NOISE_RULE = (
    f"seed noise: each comparison pairs the two runs seed by seed (same task, same seed) and takes the mean "
    f"difference ± {K_SE:g} standard errors (SE = standard deviation of the per-seed differences / √n, n ≥ "
    f"{MIN_SEEDS} shared seeds); a part of a claim holds when that interval lies where the claim says, fails when it "
    f"lies where the claim says it should not, and is undecided otherwise (k = {K_SE:g} is a screen: with 2-3 seeds "
    "a 95% t-interval would need 12.7 / 4.3 standard errors)"
)


@dataclass(frozen=True)
class Paired:
    """Per-seed differences ``a - b`` over the seeds both runs finished."""

    seeds: Tuple[int, ...]
    differences: Tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.differences)

    @property
    def se(self) -> float:
        return statistics.stdev(self.differences) / math.sqrt(self.n) if self.n > 1 else math.inf

    @property
    def low(self) -> float:
        return self.mean - K_SE * self.se

    @property
    def high(self) -> float:
        return self.mean + K_SE * self.se

    def text(self) -> str:
        return f"{self.mean:+.2f} ± {K_SE * self.se:.2f} (n={self.n})"

    def to_dict(self) -> Dict[str, Any]:
        return {"seeds": list(self.seeds), "differences": list(self.differences), "mean": self.mean, "se": self.se,
                "low": self.low, "high": self.high}


def by_seed(runs: Sequence[Mapping[str, Any]], field: str = "score") -> Dict[int, float]:
    """``{seed: value}`` of the finished runs (``{"seed", field}`` dictionaries) that have ``field``."""
    return {int(r["seed"]): float(r[field]) for r in runs if r.get(field) is not None}


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> Optional[Paired]:
    """``a - b`` on the seeds both have (``None`` below ``MIN_SEEDS`` of them)."""
    seeds = tuple(sorted(set(a) & set(b)))
    if len(seeds) < MIN_SEEDS:
        return None
    return Paired(seeds, tuple(a[s] - b[s] for s in seeds))


def exceeds(p: Paired, delta: float) -> str:
    """"a is better than b by at least ``delta``": the mean reaches ``delta`` and the interval excludes 0;
    it fails when the interval lies below ``delta`` (or at or below 0: no advantage at all)."""
    if p.mean >= delta and p.low > 0:
        return HOLDS
    if p.high < delta or p.high <= 0:
        return FAILS
    return UNDECIDED


def at_most(p: Paired, delta: float) -> str:
    """"a exceeds b by at most ``delta``" (b is nearly as good as a): the whole interval at or below ``delta``;
    fails when the whole interval is above it."""
    if p.high <= delta:
        return HOLDS
    if p.low > delta:
        return FAILS
    return UNDECIDED


def within(p: Paired, margin: float) -> str:
    """Equivalence, two-sided: the whole interval inside ``[-margin, margin]``; fails when the whole interval
    is outside it (on either side)."""
    if p.low >= -margin and p.high <= margin:
        return HOLDS
    if p.low > margin or p.high < -margin:
        return FAILS
    return UNDECIDED
