"""The statistics of the end-to-end check: paired ratios, the order-statistic interval of their median, and the
planned looks whose intervals hold together (pure: no device, no clock)."""

from __future__ import annotations

import itertools
import math

import pytest

from bench.verdict import clears, inverted
from ios_ray.paired import (FASTER, SLOWER, WITHIN_NOISE, LookPlan, RatioInterval, least_rounds, median_interval,
                            percent, rank, ratios_of)


def brute_miss(looks: tuple[int, ...], ranks: tuple[int, ...]) -> float:
    """The chance that some look's interval misses the median, by enumerating every sequence of signs (each ratio
    below the median with chance 1/2, independently)."""
    n = looks[-1]
    missed = 0
    for signs in itertools.product((0, 1), repeat=n):
        for look, k in zip(looks, ranks):
            below = sum(signs[:look])
            if k and (below <= k - 1 or below >= look - k + 1):
                missed += 1
                break
    return missed / 2**n


@pytest.mark.parametrize("rounds, confidence", [(8, 0.99), (12, 0.95), (14, 0.99), (16, 0.9)])
def test_a_plans_intervals_miss_the_median_together_no_more_often_than_its_confidence_allows(
    rounds: int, confidence: float
) -> None:
    plan = LookPlan.planned(rounds, confidence)
    assert plan.looks[-1] == rounds and len(plan.looks) == 3 and list(plan.looks) == sorted(set(plan.looks))
    assert plan.miss == pytest.approx(brute_miss(plan.looks, plan.ranks))
    assert plan.miss <= 1 - confidence
    # and the ranks are the largest the budget allows: one more at the last look would overspend it
    wider = (*plan.ranks[:-1], plan.ranks[-1] + 1)
    assert brute_miss(plan.looks, wider) > 1 - confidence


def test_the_rank_of_a_single_look_is_the_largest_within_the_binomial_tail() -> None:
    for n, confidence in ((10, 0.95), (20, 0.95), (20, 0.99), (5, 0.95), (30, 0.9)):
        k = rank(n, confidence)
        tail = lambda k: 2 * sum(math.comb(n, i) for i in range(k)) / 2**n  # noqa: E731
        assert (k == 0 or tail(k) <= 1 - confidence) and tail(k + 1) > 1 - confidence
    assert rank(5, 0.95) == 0  # five rounds: even all five below cannot make a 95% interval (2/32 > 5%)


def test_the_fewest_rounds_are_those_of_the_first_plan_that_can_decide() -> None:
    for confidence in (0.9, 0.95, 0.99):
        least = least_rounds(confidence)
        assert LookPlan.planned(least, confidence).decisive and not LookPlan.planned(least - 1, confidence).decisive


def test_the_interval_is_the_kth_smallest_and_kth_largest_ratio() -> None:
    ratios = [1.10, 0.90, 1.00, 1.05, 0.95, 1.20, 0.80, 1.02, 0.98, 1.01]
    found = median_interval(ratios, 0.95)
    assert rank(10, 0.95) == 2 and (found.low, found.high) == (0.90, 1.10)
    assert found.median == pytest.approx(1.005) and found.rounds == 10 and found.verdict == WITHIN_NOISE
    assert found.span == "0.90-1.10"
    few = median_interval(ratios[:4], 0.95)
    assert (few.low, few.high, few.span, few.verdict) == (None, None, "no interval", WITHIN_NOISE)


def test_a_verdict_needs_the_whole_interval_on_one_side_of_one() -> None:
    assert RatioInterval(0.95, 0.93, 0.99, 0.99, 18).verdict == FASTER
    assert RatioInterval(1.08, 1.01, 1.12, 0.99, 18).verdict == SLOWER
    assert RatioInterval(0.97, 0.93, 1.0, 0.99, 18).verdict == WITHIN_NOISE  # touching 1 is not beyond it
    assert RatioInterval(0.5, None, None, 0.99, 2).verdict == WITHIN_NOISE


def test_a_target_is_cleared_only_by_the_whole_interval_and_speedups_invert_times() -> None:
    speedup = inverted(RatioInterval(0.8, 0.75, 0.9, 0.95, 10))
    assert speedup.median == pytest.approx(1.25) and speedup.low == pytest.approx(1 / 0.9)
    assert speedup.high == pytest.approx(1 / 0.75)
    assert clears(speedup, least=1.1) and not clears(speedup, least=1.2)  # the median alone clears 1.2
    assert clears(RatioInterval(1.0, 0.97, 1.04, 0.95, 10), most=1.05)
    assert not clears(RatioInterval(1.0, 0.97, 1.06, 0.95, 10), most=1.05)
    assert not clears(RatioInterval(1.0, None, None, 0.95, 2), most=100)


def test_ratios_pair_by_round_and_a_plan_looks_only_where_planned() -> None:
    assert ratios_of([2.0, 3.0], [4.0, 3.0]) == [0.5, 1.0]
    assert (percent(0.999), percent(0.95)) == ("99.9%", "95%")
    with pytest.raises(ValueError):
        ratios_of([1.0], [1.0, 2.0])
    plan = LookPlan.planned(18, 0.99)
    with pytest.raises(ValueError, match="not a look"):
        plan.interval([1.0] * 5)
    assert plan.interval([0.9] * plan.max_rounds).verdict == FASTER
    with pytest.raises(ValueError, match="confidence"):
        LookPlan.planned(18, 1.0)
