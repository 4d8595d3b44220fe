"""Which kernels each setting of a search runs its stages with (:mod:`~ios_ray.runtime.kernels`): the request's, or,
with ``kernels="auto"`` (the default), the faster as the model runs whole on the device.

On a measured device ``auto`` times the sequential schedule with ``fused`` and with ``inductor`` kernels against
the same schedule with ``eager`` ones, whole, as deployed (``inductor``'s compiled at its first call, untimed), in
rounds on an actor of the device (the end-to-end check's contest: :func:`~ios_ray.runtime.compare.contest`,
:mod:`ios_ray.paired`), before anything is measured, and keeps another than ``eager`` only where the interval of its
ratio over eager lies wholly below 1 (of two such, the lower median), as the check keeps the IOS schedule: kernels
that are not faster beyond noise are not worth a change of layout or a compile. Units alone would not answer it: what
fused kernels save or cost is mostly in the layout between units (a transpose, a reorder of the weights), and what
Inductor saves is in fusing units, so it shows in the whole pass. On ``sim:`` devices ``auto`` is ``eager``: the sim
model prices no kernels.

The choice decides the device identity every stage of the setting is looked up and measured under
(:meth:`~ios_ray.profiler.DeviceIdentity.running`): a stage run with other kernels is another measurement. So a
choice, once made, stands: where the store already holds more of the model's stages measured on the device (at that
batch and dtype) with one kernels than with any other, ``auto`` takes those kernels again without timing (the
choice of the search that measured them), and a search run twice measures nothing twice.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.paired import RatioInterval
from ios_ray.profiler import CheckJob, DevicePool, ModelSource
from ios_ray.scheduler import baseline_schedule
from ios_ray.vocabulary import DEFAULT_CHECK_ROUNDS, EAGER_KERNELS, KERNEL_CHOICES, KERNEL_NAMES


@dataclass(frozen=True)
class KernelChoice:
    """The kernels a setting runs with and how they were chosen: ``given`` (the request named them), ``simulated``
    (``auto`` on a sim device) or ``measured`` (``auto``: the sequential schedule timed whole with each kernels, their
    medians in ms by name, and each other's ratio over eager with its interval)."""

    kernels: str
    how: str
    times_ms: Mapping[str, float] = field(default_factory=dict)
    ratios: Mapping[str, RatioInterval] = field(default_factory=dict)

    @property
    def decision(self) -> str:
        """The choice in words: ``fused kernels: faster beyond noise; fused / eager 0.52 (0.50-0.55), inductor /
        eager 0.61 (0.58-0.66, 20 rounds)``."""
        if not self.ratios:
            return f"{self.kernels} kernels: {self.how}"
        reason = "faster beyond noise" if self.kernels != EAGER_KERNELS else "no other faster beyond noise"
        ratios = ", ".join(f"{name} / {EAGER_KERNELS} {ratio.median:.2f} ({ratio.span}, {ratio.rounds} rounds)"
                           for name, ratio in self.ratios.items())
        return f"{self.kernels} kernels: {reason}; {ratios}"

    def to_json(self) -> dict[str, Any]:
        """What a schedule file's ``params.kernels`` records: the kernels, how and why, and where they were timed
        each one's median (``fused_ms``...) and each ratio over eager (``fused_ratio``, ``fused_ratio_low``...)."""
        found: dict[str, Any] = {"kernels": self.kernels, "how": self.how, "decision": self.decision}
        found |= {f"{name}_ms": ms for name, ms in self.times_ms.items()}
        for name, ratio in self.ratios.items():
            found |= {f"{name}_ratio": ratio.median, f"{name}_ratio_low": ratio.low,
                      f"{name}_ratio_high": ratio.high, "confidence": ratio.confidence}
        if self.ratios:
            found["rounds"] = max(ratio.rounds for ratio in self.ratios.values())
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
    """Time the sequential schedule with each kernels, whole, on an actor of ``label`` (a contest against eager's);
    keep eager unless another is faster beyond noise, then the fastest of those."""
    schedules = {kernels: baseline_schedule(graph, device=label, batch=batch, dtype=dtype, kernels=kernels)
                 for kernels in (*(k for k in KERNEL_NAMES if k != EAGER_KERNELS), EAGER_KERNELS)}
    job = CheckJob(source, graph, schedules, EAGER_KERNELS, batch, DEFAULT_CHECK_ROUNDS, dtype=dtype,
                   confidence=confidence, max_seconds=max_seconds)
    timing = pool.time_schedules(label, job)
    return KernelChoice(timing.kept, "measured",
                        {name: statistics.median(times) for name, times in timing.times_ms.items()}, timing.ratios)
