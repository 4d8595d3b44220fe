"""Which kernels each setting of a search runs its stages with (:mod:`~ios_ray.runtime.kernels`): the request's, or,
with ``kernels="auto"`` (the default), the faster as the model runs whole on the device.

On a measured device ``auto`` times the sequential schedule whole, as deployed, in paired rounds on an actor of the
device (the end-to-end check's protocol: :func:`~ios_ray.runtime.compare.paired_timing`, :mod:`ios_ray.paired`),
before anything is measured, in turns: ``fused`` against ``eager``, then ``inductor`` (its regions compiled at the
untimed warm-up) against the one kept; a challenger is kept only where the interval of its ratio over the kept one
lies wholly below 1, as the check keeps the IOS schedule: kernels that are not faster beyond noise are not worth a
change of layout, nor a compile of seconds at every deployment and every candidate of the check. Units alone would
not answer it: what fused kernels save or cost is mostly in the layout between units (a transpose, a reorder of the
weights), and what Inductor saves is in fusing units, so it shows in the whole pass. On ``sim:`` devices ``auto`` is
``eager``: the sim model prices no kernels.

The choice decides the device identity every stage of the setting is looked up and measured under
(:meth:`~ios_ray.profiler.DeviceIdentity.running`): a stage run with other kernels is another measurement. So a
choice, once made, stands: where the store already holds more of the model's units measured alone on the device (at
that batch and dtype; every search measures them first) with one kernels than with any other, ``auto`` takes those
kernels again without timing (the choice of the search that measured them), and a search run twice measures nothing
twice. Counting the units alone needs nothing planned, so a search can plan its candidate stages meanwhile.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.paired import WITHIN_NOISE, CompiledAhead, RatioInterval
from ios_ray.profiler import CheckJob, DevicePool, ModelSource
from ios_ray.scheduler import baseline_schedule
from ios_ray.vocabulary import DEFAULT_CHECK_ROUNDS, EAGER_KERNELS, KERNEL_CHOICES, KERNEL_NAMES


@dataclass(frozen=True)
class Contest:
    """One turn of the choice: the sequential schedule with ``kernels`` against it with ``versus``, whole; both
    medians in ms and the ratio kernels / versus with its interval; with ``inductor`` kernels, what the device
    compiled before the rounds (its regions: the kernel choice's share of a search's compile time)."""

    kernels: str
    versus: str
    kernels_ms: float
    versus_ms: float
    ratio: RatioInterval
    compiled: CompiledAhead | None = None

    @property
    def text(self) -> str:
        """``fused / eager 0.52 (0.50-0.55, 19 rounds): faster beyond noise``."""
        ratio = self.ratio
        verdict = ratio.verdict if ratio.verdict == WITHIN_NOISE else f"{ratio.verdict} beyond noise"
        return f"{self.kernels} / {self.versus} {ratio.median:.2f} ({ratio.span}, {ratio.rounds} rounds): {verdict}"

    def to_json(self) -> dict[str, Any]:
        """What ``params.kernels.timed`` records of it."""
        ratio = self.ratio
        found = {"kernels": self.kernels, "versus": self.versus, "kernels_ms": self.kernels_ms,
                 "versus_ms": self.versus_ms, "ratio": ratio.median, "ratio_low": ratio.low, "ratio_high": ratio.high,
                 "confidence": ratio.confidence, "rounds": ratio.rounds}
        if self.compiled is not None:
            found["compiled"] = dataclasses.asdict(self.compiled)  # as the file's end_to_end.compiled holds it
        return found


@dataclass(frozen=True)
class KernelChoice:
    """The kernels a setting runs with and how they were chosen: ``given`` (the request named them), ``simulated``
    (``auto`` on a sim device) or ``measured`` (``auto``: its :class:`Contest` turns, in order)."""

    kernels: str
    how: str
    timed: tuple[Contest, ...] = ()

    @property
    def decision(self) -> str:
        """The choice in words: ``fused kernels: measured; fused / eager 0.52 (0.50-0.55, 19 rounds): faster beyond
        noise, inductor / fused 0.97 (0.93-1.01, 28 rounds): within noise``."""
        if not self.timed:
            return f"{self.kernels} kernels: {self.how}"
        return f"{self.kernels} kernels: {self.how}; {', '.join(turn.text for turn in self.timed)}"

    def to_json(self) -> dict[str, Any]:
        """What a schedule file's ``params.kernels`` records: the kernels, how and why, and each turn timed."""
        found: dict[str, Any] = {"kernels": self.kernels, "how": self.how, "decision": self.decision}
        if self.timed:
            found["timed"] = [turn.to_json() for turn in self.timed]
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
    """The kernels an earlier search chose, from how many of the model's units the store holds measured alone with
    each on this device, batch and dtype: the kernels of the most, where one holds more than the other; else None."""
    ranked = sorted(stored.items(), key=lambda item: -item[1])
    if not ranked or ranked[0][1] == 0 or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    kernels, count = ranked[0]
    return KernelChoice(kernels, f"as before: the store holds {count} of the model's units measured alone with them")


def measured_kernels(pool: DevicePool, source: ModelSource, graph: Graph, label: str, batch: int, dtype: str,
                     confidence: float, max_seconds: float | None) -> KernelChoice:
    """Time the sequential schedule whole on an actor of ``label`` with each kernels against the ones kept so far, in
    :data:`~ios_ray.vocabulary.KERNEL_NAMES` order (eager first); keep the challenger only where it is faster beyond
    noise."""
    kept, timed = KERNEL_NAMES[0], []
    for challenger in KERNEL_NAMES[1:]:
        schedules = {kernels: baseline_schedule(graph, device=label, batch=batch, dtype=dtype, kernels=kernels)
                     for kernels in (challenger, kept)}
        job = CheckJob(source, graph, schedules, kept, batch, DEFAULT_CHECK_ROUNDS, dtype=dtype,
                       confidence=confidence, max_seconds=max_seconds)
        timing = pool.time_schedules(label, job)
        timed.append(Contest(challenger, kept, statistics.median(timing.times_ms[challenger]),
                             statistics.median(timing.times_ms[kept]), timing.ratios[challenger], timing.compiled))
        kept = timing.kept
    return KernelChoice(kept, "measured", tuple(timed))
