"""Callables compared beyond noise on a device: rounds in alternating order, looked at as planned, until the
ratio's interval decides, the last look is reached, or the next look would end past a time cap. Two callables are a
paired check (:func:`paired_timing`); several are a contest against a baseline (:func:`contest`), which keeps the
best of them beside the baseline after the first look.

A round times both callables back to back, in alternating order (second then first, then first then second...), so
that both calls of a round share the machine's speed of the moment and whatever favours a position favours each
callable in half the rounds: the first call of a round follows a call of its own callable (the last of the round
before), the second follows the other's. Two calls a round, no untimed ones between: the two schedules of a check
run the same model's weights, so the second call finds the caches as warm as the first, and what it pays for
following the other schedule (its worker threads asleep) each schedule pays in every other round; where that cost
exceeds a real difference, the ratios alternate about 1 and the check says ``within noise`` rather than deciding
wrongly. The statistics (ratios, intervals, the looks and their ranks) are :mod:`ios_ray.paired`'s.

::

    timing = paired_timing(dp_forward, sequential_forward, "cpu", LookPlan.planned(28, 0.999))
    timing.ratio.verdict            # "faster", "slower" or "within noise"; timing.ratio.span: "0.97-1.01"
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator, Mapping

import torch

from ios_ray.paired import (WITHIN_NOISE, ContestTiming, LookPlan, PairedTiming, RatioInterval, median_interval,
                            ratios_of)
from ios_ray.runtime.timing import Sampler, alternating_rounds


def paired_timing(
    first: Callable[[], object], second: Callable[[], object], device: torch.device | str, plan: LookPlan,
    warmup: int = 2, max_seconds: float | None = None, sample: Sampler | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> PairedTiming:
    """Time ``first`` against ``second`` in paired rounds (:func:`~ios_ray.runtime.timing.alternating_rounds`) after
    ``warmup`` untimed calls of each; at each look of ``plan``, stop where the interval of first / second decides,
    and go on only where the next look, at the pace of the rounds so far, ends within ``max_seconds`` of the start
    (None: no cap). The first look is always reached.

    ``sample`` times one call in ms (default: :func:`~ios_ray.runtime.timing.sample_ms` on ``device``) and ``clock``
    reads seconds for the cap; tests pass fakes of both.
    """
    found = contest({"first": first, "second": second}, "second", device, plan, warmup, max_seconds, sample, clock)
    return PairedTiming(found.times_ms["first"], found.times_ms["second"], found.ratios["first"])


def contest(
    callables: Mapping[str, Callable[[], object]], baseline: str, device: torch.device | str, plan: LookPlan,
    warmup: int = 2, max_seconds: float | None = None, sample: Sampler | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ContestTiming:
    """Time every callable in rounds (each round runs each once, in alternating order, after ``warmup`` untimed calls
    of each) against ``baseline``, looking at the intervals of each one's ratio over the baseline as ``plan`` says
    (its confidence must already be shared among the candidates: :func:`~ios_ray.paired.contest_confidence`).

    The untimed calls come first, callable after callable in the given order; a first call may be slow (a schedule's
    regions compiled, its CUDA graph captured). With ``max_seconds``, a candidate whose untimed calls would start
    past :data:`WARMUP_SHARE` of it leaves the contest before it runs (``left_out``), though never the first
    candidate or the baseline: so a contest ends within about its cap however long the candidates take to compile.

    With more than one candidate, the first :data:`SCREEN_ROUNDS` rounds run them all (a candidate that ran at
    least twice the baseline's time in each of its first two rounds leaves them early: :data:`HOPELESS_RATIO`), and
    only the one of the lowest median ratio goes on beside the baseline (the others keep the median of their rounds,
    with no interval: too few rounds for one, so none of them is kept); since the plan's confidence holds for every
    candidate's intervals together, choosing among them costs it nothing. From then on it is the paired check of
    :func:`paired_timing`, those rounds counted: stop at a look where the interval decides, at the last look, or at
    a look where the next one would end past ``max_seconds`` at the pace of the callables still running.
    """
    if baseline not in callables or len(callables) < 2:
        raise ValueError(f"a contest needs the baseline {baseline!r} and at least one candidate, got {list(callables)}")
    if warmup < 0:
        raise ValueError(f"need warmup >= 0, got {warmup}")
    times: dict[str, list[float]] = {name: [] for name in callables}
    ratios: dict[str, RatioInterval] = {}
    started = clock()
    with torch.inference_mode():
        warmed = _warmed(callables, baseline, warmup, None if max_seconds is None else WARMUP_SHARE * max_seconds,
                         lambda: clock() - started)
        rounds = alternating_rounds(warmed, device, 0, sample, rewarm=False)
        running = list(warmed)
        if len(warmed) > 2:
            left = _screen(warmed, rounds, times, baseline, min(SCREEN_ROUNDS, plan.looks[0]), device, sample)
            screened = {name: median_interval(ratios_of(times[name], times[baseline][:len(times[name])]),
                                              plan.confidence)
                        for name in warmed if name != baseline}
            best = min(left, key=lambda name: screened[name].median)  # of those screened whole
            ratios |= {name: dataclasses.replace(found, low=None, high=None) for name, found in screened.items()}
            running = [best, baseline]
            rounds = alternating_rounds({name: callables[name] for name in running}, device, 0, sample, rewarm=False)
        candidate = running[0] if running[0] != baseline else running[1]
        for index, look in enumerate(plan.looks):
            _run_rounds(rounds, times, baseline, look)
            ratios[candidate] = plan.interval(ratios_of(times[candidate], times[baseline]))
            if ratios[candidate].verdict != WITHIN_NOISE or index + 1 == len(plan.looks):
                break
            if max_seconds is not None and _next_look_ends(clock() - started, times, running, look,
                                                           plan.looks[index + 1]) > max_seconds:
                break
    return ContestTiming({name: tuple(found) for name, found in times.items()}, baseline, ratios,
                         left_out=tuple(name for name in callables if name not in warmed))


#: The share of a contest's time cap its untimed first calls may start within: a candidate whose calls would start
#: later leaves the contest (:func:`contest`). On an H200, compiling Inductor's regions of five candidates of
#: Inception V3 took the float16 check 34 s, and the float32 check more than a minute (bench/RESULTS.md).
WARMUP_SHARE = 0.5


def _warmed(callables: Mapping[str, Callable[[], object]], baseline: str, warmup: int, seconds: float | None,
            elapsed: Callable[[], float]) -> dict[str, Callable[[], object]]:
    """The callables that take part, each called ``warmup`` times, in order: all but those candidates, after the
    first, whose calls would start past ``seconds`` of ``elapsed`` (None: none is left out)."""
    first = next(name for name in callables if name != baseline)
    warmed = {}
    for name, fn in callables.items():
        if name not in (baseline, first) and seconds is not None and elapsed() > seconds:
            continue
        for _ in range(warmup):
            fn()
        warmed[name] = fn
    return warmed


#: The rounds a contest of several candidates runs them all before only the best goes on beside the baseline.
SCREEN_ROUNDS = 5
#: A candidate leaves the screening early once its first :data:`HOPELESS_ROUNDS` rounds each ran at least
#: :data:`HOPELESS_RATIO` times the baseline's time: it cannot be kept (that takes a ratio wholly below 1), nor go on
#: beside the baseline (only a candidate screened whole does, :func:`_screen`). On a 2-core CPU the greedy schedule
#: of Inception V3 at batch 1 ran 3.5x sequential, so its 5 rounds cost the check as much as 17 of the others'.
HOPELESS_ROUNDS = 2
HOPELESS_RATIO = 2.0


def _screen(callables: Mapping[str, Callable[[], object]], rounds: Iterator[dict[str, float]],
            times: dict[str, list[float]], baseline: str, until: int, device: torch.device | str,
            sample: Sampler | None) -> list[str]:
    """Run ``until`` rounds of every callable, leaving out from then on a candidate that is hopeless (see
    :data:`HOPELESS_RATIO`; never the last one beside the baseline); return the candidates screened whole. (A
    hopeless one may still have the lowest median: a candidate that ran below twice the baseline's time in one of
    its first rounds stays however slow its others.)"""
    running = dict(callables)
    while len(times[baseline]) < until:
        for name, ms in next(rounds).items():
            times[name].append(ms)
        hopeless = [name for name in running if name != baseline and len(times[name]) == HOPELESS_ROUNDS
                    and all(ms >= HOPELESS_RATIO * base for ms, base in zip(times[name], times[baseline]))]
        hopeless = sorted(hopeless, key=lambda name: -min(times[name]))[:len(running) - 2]  # the fastest one stays
        if hopeless:
            running = {name: fn for name, fn in running.items() if name not in hopeless}
            rounds = alternating_rounds(running, device, 0, sample, rewarm=False)
    return [name for name in running if name != baseline]


def _run_rounds(rounds: Iterator[dict[str, float]], times: dict[str, list[float]], baseline: str, until: int) -> None:
    """Run rounds until the baseline has ``until`` times, adding each callable's time of each round."""
    while len(times[baseline]) < until:
        for name, ms in next(rounds).items():
            times[name].append(ms)


def _next_look_ends(elapsed_s: float, times: Mapping[str, list[float]], running: list[str], look: int,
                    next_look: int) -> float:
    """When the next look would end, in seconds from the start: the time so far and, for each round to go, the
    running callables' mean times so far (those the first look dropped no longer count)."""
    per_round_s = sum(sum(times[name]) / len(times[name]) for name in running) / 1e3
    return elapsed_s + (next_look - look) * per_round_s
