"""Two callables compared beyond noise on a device: paired rounds in alternating order, looked at as planned, until
the ratio's interval decides, the last look is reached, or the next look would end past a time cap.

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

import time
from typing import Callable

import torch

from ios_ray.paired import WITHIN_NOISE, LookPlan, PairedTiming, ratios_of
from ios_ray.runtime.timing import Sampler, alternating_rounds


def paired_timing(
    first: Callable[[], object], second: Callable[[], object], device: torch.device | str, plan: LookPlan,
    warmup: int = 2, max_seconds: float | None = None, sample: Sampler | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> PairedTiming:
    """Time ``first`` against ``second`` in paired rounds (:func:`~ios_ray.runtime.timing.alternating_rounds`) after
    ``warmup`` untimed calls of each; at each look of ``plan``, stop where the interval of first / second decides,
    and go on only where the next look, at the pace so far (warm-up included), ends within ``max_seconds`` of the
    start (None: no cap). The first look is always reached.

    ``sample`` times one call in ms (default: :func:`~ios_ray.runtime.timing.sample_ms` on ``device``) and ``clock``
    reads seconds for the cap; tests pass fakes of both.
    """
    times: tuple[list[float], list[float]] = ([], [])
    started = clock()
    with torch.inference_mode():
        rounds = alternating_rounds({"first": first, "second": second}, device, warmup, sample, rewarm=False)
        for index, look in enumerate(plan.looks):
            while len(times[0]) < look:
                found = next(rounds)
                times[0].append(found["first"])
                times[1].append(found["second"])
            interval = plan.interval(ratios_of(*times))
            if interval.verdict != WITHIN_NOISE or index + 1 == len(plan.looks):
                break
            elapsed = clock() - started
            if max_seconds is not None and elapsed * plan.looks[index + 1] / look > max_seconds:
                break
    return PairedTiming(tuple(times[0]), tuple(times[1]), interval)
