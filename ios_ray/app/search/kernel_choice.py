"""Which kernels each setting of a search runs its stages with (:mod:`~ios_ray.runtime.kernels`): the request's, or,
with ``kernels="auto"`` (the default), the faster as the model runs whole on the device.

On a measured device ``auto`` times the sequential schedule with ``fused`` kernels against the same schedule with
``eager`` ones, whole, as deployed, in paired rounds on an actor of the device (the end-to-end check's protocol:
:func:`~ios_ray.runtime.compare.paired_timing`, :mod:`ios_ray.paired`), before anything is measured, and keeps
``fused`` only where the interval of fused / eager lies wholly below 1, as the check keeps the IOS schedule: kernels
that are not faster beyond noise are not worth a change of layout. Units alone would not answer it: what fused
kernels save or cost is mostly in the layout between units (a transpose, a reorder of the weights), so it shows in
the whole pass. On ``sim:`` devices ``auto`` is ``eager``: the sim model prices no kernels.

The choice decides the device identity every stage of the setting is looked up and measured under
(:meth:`~ios_ray.profiler.DeviceIdentity.running`): a stage run with other kernels is another measurement. So a
choice, once made, stands: where the store already holds more of the model's stages measured on the device (at that
batch and dtype) with one kernels than with the other, ``auto`` takes those kernels again without timing (the
choice of the search that measured them), and a search run twice measures nothing twice.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.paired import FASTER, SLOWER, WITHIN_NOISE, RatioInterval
from ios_ray.profiler import CheckJob, DevicePool, ModelSource
from ios_ray.scheduler import baseline_schedule
from ios_ray.vocabulary import DEFAULT_CHECK_ROUNDS, EAGER_KERNELS, FUSED_KERNELS, KERNEL_CHOICES


@dataclass(frozen=True)
class KernelChoice:
    """The kernels a setting runs with and how they were chosen: ``given`` (the request named them), ``simulated``
    (``auto`` on a sim device) or ``measured`` (``auto``: the sequential schedule timed whole with each, medians in
    ms, and the ratio fused / eager with its interval)."""

    kernels: str
    how: str
    fused_ms: float | None = None
    eager_ms: float | None = None
    ratio: RatioInterval | None = None

    @property
    def decision(self) -> str:
        """The choice in words: ``fused kernels: faster beyond noise, fused / eager 0.52 (0.50-0.55)``."""
        if self.ratio is None:
            return f"{self.kernels} kernels: {self.how}"
        reason = {FASTER: "faster beyond noise", SLOWER: "fused slower beyond noise",
                  WITHIN_NOISE: "within noise"}[self.ratio.verdict]
        return (f"{self.kernels} kernels: {reason}, fused / eager {self.ratio.median:.2f} ({self.ratio.span}, "
                f"{self.ratio.rounds} rounds)")

    def to_json(self) -> dict[str, Any]:
        """What a schedule file's ``params.kernels`` records."""
        found: dict[str, Any] = {"kernels": self.kernels, "how": self.how, "decision": self.decision}
        if self.ratio is not None:
            found |= {"fused_ms": self.fused_ms, "eager_ms": self.eager_ms, "ratio": self.ratio.median,
                      "ratio_low": self.ratio.low, "ratio_high": self.ratio.high,
                      "confidence": self.ratio.confidence, "rounds": self.ratio.rounds}
        return found


def checked_kernel_choice(choice: str) -> str:
    """The request's kernels; UserError where they are not one of :data:`~ios_ray.vocabulary.KERNEL_CHOICES`."""
    if choice not in KERNEL_CHOICES:
        raise UserError(f"kernels must be one of {', '.join(KERNEL_CHOICES)}, not {choice!r}.")
    return choice


def given_kernels(choice: str, simulated: bool) -> KernelChoice | None:
    """The choice where no timing is needed (kernels named, or ``auto`` on a sim device), else None."""
    if choice != "auto":
        return KernelChoice(choice, "given")
    return KernelChoice(EAGER_KERNELS, "simulated") if simulated else None


def stored_kernels(stored: dict[str, int]) -> KernelChoice | None:
    """The kernels an earlier search chose, from how many of the model's stages the store holds measured with each
    on this device, batch and dtype: the kernels of the most, where one holds more than the other; else None."""
    ranked = sorted(stored.items(), key=lambda item: -item[1])
    if not ranked or ranked[0][1] == 0 or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    kernels, count = ranked[0]
    return KernelChoice(kernels, f"as before: the store holds {count} of the model's stages measured with them")


def measured_kernels(pool: DevicePool, source: ModelSource, graph: Graph, label: str, batch: int, dtype: str,
                     confidence: float, max_seconds: float | None) -> KernelChoice:
    """Time the sequential schedule with fused kernels against eager ones, whole, on an actor of ``label``; keep
    fused only where it is faster beyond noise."""
    schedules = {kernels: baseline_schedule(graph, device=label, batch=batch, dtype=dtype, kernels=kernels)
                 for kernels in (FUSED_KERNELS, EAGER_KERNELS)}
    job = CheckJob(source, graph, schedules, EAGER_KERNELS, batch, DEFAULT_CHECK_ROUNDS, dtype=dtype,
                   confidence=confidence, max_seconds=max_seconds)
    timing = pool.time_schedules(label, job)
    ratio = timing.ratios[FUSED_KERNELS]
    return KernelChoice(timing.kept, "measured", statistics.median(timing.times_ms[FUSED_KERNELS]),
                        statistics.median(timing.times_ms[EAGER_KERNELS]), ratio)

