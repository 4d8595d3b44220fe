"""Telling two timed callables apart beyond noise: paired per-round ratios, a distribution-free confidence interval
for their median, and the planned looks of a check that stops once that interval decides.

Words (docs/DESIGN.md, "The end-to-end check"):

* A **round** times both callables once, back to back, the order alternating from round to round; its **ratio** is
  the first's time over the second's. Pairing cancels what slows both alike (this kind of machine drifts by 5-25%
  over seconds, and both calls of a round share the drift); alternating cancels what favours a position.
* The **interval** of n ratios is ``[r_(k), r_(n-k+1)]``, the k-th smallest and k-th largest ratio: the exact
  order-statistic (sign-test) interval for their median. Where rounds are independent and the median ratio is m,
  how many ratios fall below m is Binomial(n, 1/2) whatever their distribution, so the chance that the interval
  misses m is a binomial tail, computed exactly: no resampling, the same answer every time, and a wild ratio from a
  burst of load counts as one sign, never as a magnitude. The rank k is the largest whose miss chance stays within
  1 - confidence; ``k = 0`` means too few rounds for any interval at that confidence (unbounded).
* A ratio interval's **verdict**: ``faster`` where the whole interval lies below 1, ``slower`` where it lies above 1,
  else ``within noise``.
* A **check** looks at its interval at a few planned rounds (:class:`LookPlan`), never after every round: each look
  is one more chance for noise to make an interval miss. The ranks of all looks are chosen together, on the exact
  binomial walk of the signs, so that the chance that *any* look's interval misses the median is at most
  1 - confidence (that budget spent over the looks as ``(1 - confidence) * (n / last look) ** 2``: little at the
  early looks, which have few rounds, most at the last). The intervals are so simultaneous: whichever look a check
  stops at (decided, the last one, or out of time), its interval holds at the confidence, and where the two
  callables are the same a check reports a win for either with a chance of at most 1 - confidence.

::

    plan = LookPlan.planned(max_rounds=28, confidence=0.999)   # looks at rounds 9, 19, 28
    interval = plan.interval(ratios[:19])                       # at a look: RatioInterval, .verdict
    median_interval(ratios, 0.95)                               # one look at a fixed number of rounds (reports)
    summary_ms(samples)                                         # one callable's (median, p10, p90)
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from ios_ray.vocabulary import DEFAULT_CHECK_CONFIDENCE

#: The confidence of the intervals a report (``ios-ray bench``, ``bench/``) gives beside each speedup.
REPORT_CONFIDENCE = 0.95
#: How many looks a check plans, evenly spaced up to its last round; and the power of its alpha-spending curve.
LOOKS = 3
SPENDING_POWER = 2

FASTER, SLOWER, WITHIN_NOISE = "faster", "slower", "within noise"


@dataclass(frozen=True)
class RatioInterval:
    """The median of ``rounds`` per-round ratios and its confidence interval; ``low``/``high`` None: unbounded (too
    few rounds for the confidence)."""

    median: float
    low: float | None
    high: float | None
    confidence: float
    rounds: int

    @property
    def verdict(self) -> str:
        """``faster`` (the whole interval below 1), ``slower`` (above 1) or ``within noise``."""
        if self.high is not None and self.high < 1:
            return FASTER
        if self.low is not None and self.low > 1:
            return SLOWER
        return WITHIN_NOISE

    @property
    def span(self) -> str:
        """The interval in words: ``0.98-1.03``, or ``no interval`` where it is unbounded."""
        if self.low is None or self.high is None:
            return "no interval"
        return f"{self.low:.2f}-{self.high:.2f}"


@dataclass(frozen=True)
class PairedTiming:
    """Two callables timed in paired rounds: each one's ms per round, and the ratio first / second with its
    interval."""

    first_ms: tuple[float, ...]
    second_ms: tuple[float, ...]
    ratio: RatioInterval

    @property
    def rounds(self) -> int:
        """How many rounds ran."""
        return len(self.first_ms)


@dataclass(frozen=True)
class CompiledAhead:
    """What a device compiled before a contest's rounds (:func:`~ios_ray.runtime.ahead.compile_ahead`): ``regions``
    traced, ``by_workers`` of them compiled by ``workers`` worker processes and read from Inductor's cache by the
    device's own process (which compiled the others), ``missed`` more that a worker compiled but the device's process
    compiled again (its read missed the cache: the two keyed the compile otherwise), ``left`` left to compile at
    their first calls (past the time given), in ``seconds``."""

    workers: int
    regions: int
    by_workers: int
    left: int
    seconds: float
    missed: int = 0

    def summary(self) -> str:
        """``75 regions compiled ahead in 16.3 s, 22 by 1 worker`` (and how many of the workers' missed the cache,
        and how many were left to their first calls)."""
        missed = f" ({self.missed} more missed the cache and compiled again)" if self.missed else ""
        left = f", {self.left} left to their first calls" if self.left else ""
        return (f"{self.regions} region{'s' if self.regions != 1 else ''} compiled ahead in {self.seconds:.1f} s, "
                f"{self.by_workers} by {self.workers} worker{'s' if self.workers != 1 else ''}{missed}{left}")


@dataclass(frozen=True)
class ContestTiming:
    """Several callables timed in rounds against a baseline (:func:`~ios_ray.runtime.compare.contest`): each one's ms
    per round it ran (one dropped at the first look stops there), and each candidate's ratio over the baseline, at
    the rounds both ran, with its interval; and where it was timed after them, the candidate kept against the model
    as is (``as_is``: kept first, the model second). ``left_out``: the candidates that never ran, their first calls
    due past the share of the time cap those may take (:data:`~ios_ray.runtime.compare.WARMUP_SHARE`). ``compiled``:
    what the device compiled before the rounds, where it did."""

    times_ms: dict[str, tuple[float, ...]]
    baseline: str
    ratios: dict[str, RatioInterval]
    as_is: PairedTiming | None = None
    left_out: tuple[str, ...] = ()
    compiled: CompiledAhead | None = None

    @property
    def rounds(self) -> int:
        """How many rounds the baseline ran (the most any callable ran)."""
        return len(self.times_ms[self.baseline])

    @property
    def kept(self) -> str:
        """The candidate kept: of those faster than the baseline beyond noise, the one of the lowest median ratio;
        the baseline where none is."""
        faster = [name for name, ratio in self.ratios.items() if ratio.verdict == FASTER]
        return min(faster, key=lambda name: self.ratios[name].median) if faster else self.baseline


def contest_confidence(confidence: float, candidates: int) -> float:
    """The confidence of each of ``candidates`` intervals against one baseline such that all of them hold together
    at ``confidence`` (Bonferroni): a contest may keep any of them, so each chance to miss must be shared."""
    return 1 - (1 - confidence) / max(candidates, 1)


def percent(confidence: float) -> str:
    """A confidence in words: ``99.9%``, ``95%``."""
    return f"{confidence * 100:.4g}%"


def ratios_of(first_ms: Sequence[float], second_ms: Sequence[float]) -> list[float]:
    """Per round, the first time over the second (the two paired by round)."""
    if len(first_ms) != len(second_ms) or not first_ms:
        raise ValueError(f"need as many rounds of each, at least one: got {len(first_ms)} and {len(second_ms)}")
    return [a / b for a, b in zip(first_ms, second_ms)]


def summary_ms(samples: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of samples, interpolating linearly between neighbours."""
    ordered = sorted(samples)
    return statistics.median(ordered), percentile(ordered, 0.1), percentile(ordered, 0.9)


def percentile(ordered: list[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, interpolating linearly between neighbours."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median_interval(ratios: Sequence[float], confidence: float = REPORT_CONFIDENCE) -> RatioInterval:
    """The median of the ratios and its exact order-statistic interval at ``confidence``, for one look at a fixed
    number of rounds."""
    n = len(ratios)
    return _interval(ratios, rank(n, confidence), confidence)


def rank(n: int, confidence: float) -> int:
    """The largest k whose interval ``[r_(k), r_(n-k+1)]`` of n ratios misses the median with a chance of at most
    ``1 - confidence`` (0 where no k does)."""
    _check_confidence(confidence)
    tail, best = 0.0, 0
    for k in range(1, (n + 1) // 2 + 1):
        tail += math.comb(n, k - 1) / 2**n
        if 2 * tail > 1 - confidence + 1e-12:
            break
        best = k
    return best


@dataclass(frozen=True)
class LookPlan:
    """The rounds at which a check looks at its interval, and the rank of the interval at each look (0: none yet),
    such that all its intervals hold together at ``confidence``."""

    looks: tuple[int, ...]
    ranks: tuple[int, ...]
    confidence: float
    miss: float

    @classmethod
    def planned(cls, max_rounds: int, confidence: float = DEFAULT_CHECK_CONFIDENCE, looks: int = LOOKS) -> "LookPlan":
        """``looks`` looks evenly spaced up to ``max_rounds``, with the largest ranks whose chance that any look's
        interval misses the median (``miss``, exact) stays within the alpha spent by each look."""
        _check_confidence(confidence)
        if max_rounds < 1 or looks < 1:
            raise ValueError(f"need max_rounds >= 1 and looks >= 1, got {max_rounds} and {looks}")
        at = tuple(sorted({max(1, round(max_rounds * j / looks)) for j in range(1, looks + 1)}))
        alpha = 1 - confidence
        walk = [1.0]  # chance of each count of ratios below the median, on paths no look has stopped
        spent, done, ranks = 0.0, 0, []
        for n in at:
            walk = _advance(walk, n - done)
            budget = alpha * (n / max_rounds) ** SPENDING_POWER
            k = 0
            while k + 1 <= (n + 1) // 2 and spent + _outside(walk, n, k + 1) <= budget + 1e-12:
                k += 1
            spent += _outside(walk, n, k)
            walk = [0.0 if k and (s <= k - 1 or s >= n - k + 1) else p for s, p in enumerate(walk)]
            ranks.append(k)
            done = n
        return cls(at, tuple(ranks), confidence, spent)

    @property
    def max_rounds(self) -> int:
        """The rounds of the last look."""
        return self.looks[-1]

    @property
    def decisive(self) -> bool:
        """Whether some look has an interval, so that the check can decide at all."""
        return any(self.ranks)

    def interval(self, ratios: Sequence[float]) -> RatioInterval:
        """The interval at the look of ``len(ratios)`` rounds."""
        if len(ratios) not in self.looks:
            raise ValueError(f"{len(ratios)} rounds is not a look of this plan ({self.looks})")
        return _interval(ratios, self.ranks[self.looks.index(len(ratios))], self.confidence)


def least_rounds(confidence: float = DEFAULT_CHECK_CONFIDENCE) -> int:
    """The fewest rounds a check at ``confidence`` needs to be able to decide at all."""
    n = 1
    while not LookPlan.planned(n, confidence).decisive:
        n += 1
    return n


def _interval(ratios: Sequence[float], k: int, confidence: float) -> RatioInterval:
    """The median of the ratios and their interval of rank ``k`` (0: unbounded)."""
    if not ratios:
        raise ValueError("need at least one ratio")
    ordered = sorted(ratios)
    low, high = (ordered[k - 1], ordered[-k]) if k else (None, None)
    return RatioInterval(statistics.median(ordered), low, high, confidence, len(ordered))


def _advance(walk: list[float], rounds: int) -> list[float]:
    """The walk of counts below the median after ``rounds`` more rounds, each below with chance 1/2."""
    step = [math.comb(rounds, d) / 2**rounds for d in range(rounds + 1)]
    out = [0.0] * (len(walk) + rounds)
    for s, p in enumerate(walk):
        if p:
            for d, q in enumerate(step):
                out[s + d] += p * q
    return out


def _outside(walk: list[float], n: int, k: int) -> float:
    """The chance, on the walk at ``n`` rounds, that the interval of rank ``k`` misses the median."""
    if k == 0:
        return 0.0
    return sum(p for s, p in enumerate(walk) if s <= k - 1 or s >= n - k + 1)


def valid_confidence(confidence: float) -> bool:
    """Whether a confidence is one an interval here can have: at least 0.5 and below 1."""
    return 0.5 <= confidence < 1


def _check_confidence(confidence: float) -> None:
    if not valid_confidence(confidence):
        raise ValueError(f"confidence must be at least 0.5 and below 1, got {confidence}")
