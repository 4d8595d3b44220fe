"""The parts of a schedule (:class:`~ios_ray.schedule.graph_schedule.Schedule`): each block's stages
(:class:`BlockSchedule`), the end-to-end check that chose it (:class:`EndToEnd`, with each :class:`CandidateRun` and
the model as is: :class:`ModelAsIs`)
and its peak memory (:class:`PeakMemory`). Their file form is :mod:`ios_ray.schedule.format`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ios_ray.paired import FASTER, SLOWER, WITHIN_NOISE, CompiledAhead, RatioInterval, percent
from ios_ray.stage import Stage

#: How torch names each memory format, for messages that tell what to convert a model with.
MEMORY_FORMAT_TORCH_NAMES = {"contiguous": "contiguous_format", "channels_last": "channels_last"}


@dataclass(frozen=True)
class BlockSchedule:
    """The stages of one block, in order, with each stage's latency in ms (None where unknown)."""

    block: int
    stages: tuple[Stage, ...]
    latencies: tuple[float | None, ...] = ()

    @property
    def latency(self) -> float | None:
        """The block's predicted latency in ms: the sum of its stage latencies."""
        if not self.latencies or any(x is None for x in self.latencies):
            return None
        return float(sum(self.latencies))  # type: ignore[arg-type]


#: The schedules an end-to-end check may run, by their names in files, and as a reader reads them: the IOS schedule
#: (the one IOS's DP finds; ``dp`` in files, a name kept so every file reads as written), its alternatives that run
#: fewer stages or fewer groups at once, greedy, and sequential (the baseline).
CANDIDATES = {"dp": "IOS", "dp-fewer-stages": "IOS fewer stages", "dp-fewer-groups": "IOS fewer groups",
              "greedy": "greedy", "sequential": "sequential"}


@dataclass(frozen=True)
class CandidateRun:
    """One schedule as the end-to-end check ran it: its median ms over the rounds it ran, its prediction (the sum of
    its stage latencies) and corrected prediction (:mod:`~ios_ray.scheduler.correction`; None: no correction), and
    its ratio over sequential with its interval (None for sequential itself)."""

    name: str
    ms: float
    rounds: int
    predicted_ms: float | None = None
    corrected_ms: float | None = None
    ratio: RatioInterval | None = None


@dataclass(frozen=True)
class ModelAsIs:
    """The model as is (its own forward, eager, in the schedule's dtype and memory format) timed after the check in
    paired rounds against the schedule kept: its median ms, the rounds, and the ratio kept / as is with its interval."""

    ms: float
    rounds: int
    ratio: RatioInterval

    @property
    def slower(self) -> bool:
        """Whether the kept schedule ran slower than the model as is beyond noise."""
        return self.ratio.verdict == SLOWER

    def summary(self) -> str:
        """In words: ``the model as is 30.410 ms, kept / as is 0.612 (0.60-0.63)``."""
        return f"the model as is {self.ms:.3f} ms, kept / as is {self.ratio.median:.3f} ({self.ratio.span})"


@dataclass(frozen=True)
class EndToEnd:
    """The search's end-to-end check: the IOS schedule, its alternatives, greedy and the sequential schedule timed
    whole in rounds on the device (:mod:`ios_ray.paired`), with the IOS schedule's (``dp_*``) and sequential's
    median times beside their predictions (sums of stage latencies) and the ratio IOS / sequential with its
    interval, and each candidate that ran (``candidates``). The file keeps the candidate of the lowest median among
    those faster than sequential beyond noise (``kept_name``), else sequential. Files written before candidates ran
    only the IOS and the sequential schedule and keep the IOS schedule where its interval lies wholly below 1;
    ``ratio`` is None in files written before checks were paired, which kept the lower median. ``as_is``: the kept
    schedule against the model as is, timed after the check (None in files before 2026-11-27, and on ``sim:``
    devices). ``left_out``: the candidates that never ran, their first calls (regions compiled, a graph captured)
    due past the share of the check's time those may take (:data:`~ios_ray.runtime.compare.WARMUP_SHARE`).
    ``compiled``: the candidates' Inductor regions compiled before the rounds (None without ``inductor`` kernels, and
    in files before 2026-11-29)."""

    rounds: int
    dp_ms: float
    sequential_ms: float
    dp_predicted_ms: float | None = None
    sequential_predicted_ms: float | None = None
    ratio: RatioInterval | None = None
    candidates: tuple[CandidateRun, ...] = ()
    kept_name: str | None = None
    as_is: ModelAsIs | None = None
    left_out: tuple[str, ...] = ()
    compiled: CompiledAhead | None = None

    @property
    def kept(self) -> str:
        """The name of the schedule kept (:data:`CANDIDATES`: ``dp``, ``greedy``, ``sequential``...)."""
        if self.kept_name is not None:
            return self.kept_name
        if self.ratio is None:
            return "sequential" if self.sequential_ms < self.dp_ms else "dp"
        return "dp" if self.ratio.verdict == FASTER else "sequential"

    @property
    def deciding(self) -> RatioInterval | None:
        """The interval the decision rests on: the kept candidate's over sequential, or where sequential was kept
        that of the candidate that ran beside it to the end (the IOS schedule's in files before candidates)."""
        timed = [c for c in self.candidates if c.ratio is not None]
        if not timed:
            return self.ratio
        kept = next((c for c in timed if c.name == self.kept), None)
        return (kept or max(timed, key=lambda c: c.rounds)).ratio

    @property
    def reason(self) -> str:
        """Why the kept schedule was kept: ``faster beyond noise``, ``within noise``, ``IOS slower beyond noise``."""
        ratio = self.deciding
        if ratio is None:
            return "lower median, unpaired check"
        return {FASTER: "faster beyond noise", SLOWER: "IOS slower beyond noise",
                WITHIN_NOISE: "within noise"}[ratio.verdict]

    @property
    def decision(self) -> str:
        """The decision in words: ``kept sequential: within noise, 0.98-1.03``, ``kept greedy: faster beyond noise,
        0.80-0.85``."""
        ratio = self.deciding
        return f"kept {CANDIDATES[self.kept]}: {self.reason}" + ("" if ratio is None else f", {ratio.span}")

    @property
    def kept_over_predicted(self) -> float | None:
        """What the kept schedule measured over what was predicted of it (its corrected prediction where the search
        had a correction), or None without a prediction."""
        kept = next((c for c in self.candidates if c.name == self.kept), None)
        if kept is not None:
            predicted = kept.corrected_ms if kept.corrected_ms is not None else kept.predicted_ms
            return kept.ms / predicted if predicted else None
        ms, predicted = ((self.dp_ms, self.dp_predicted_ms) if self.kept == "dp" else
                         (self.sequential_ms, self.sequential_predicted_ms))
        return ms / predicted if predicted else None

    def times(self) -> str:
        """Each schedule's median time in words: ``IOS 1.011, greedy 0.908, sequential 1.108 ms``."""
        ran = self.candidates or (CandidateRun("dp", self.dp_ms, self.rounds),
                                  CandidateRun("sequential", self.sequential_ms, self.rounds))
        return ", ".join(f"{CANDIDATES[c.name]} {c.ms:.3f}" for c in ran) + " ms"

    def left_out_text(self) -> str:
        """The candidates left out in words, ``; left out for the check's time: IOS fewer groups, greedy``, or ''."""
        if not self.left_out:
            return ""
        return f"; left out for the check's time: {', '.join(CANDIDATES[name] for name in self.left_out)}"

    def compiled_text(self) -> str:
        """What was compiled before the rounds in words, ``; 75 regions compiled ahead in 16.3 s, 22 by 1 worker``,
        or ''."""
        return "" if self.compiled is None else f"; {self.compiled.summary()}"

    def summary(self) -> str:
        """One line: both end-to-end times, the ratio with its interval and rounds, the other candidates, the
        candidates left out, what was compiled before the rounds, the decision, and the model as is."""
        times = f"IOS schedule {self.dp_ms:.3f} ms, sequential {self.sequential_ms:.3f} ms"
        others = "".join(f"; {CANDIDATES[c.name]} {c.ms:.3f} ms" for c in self.candidates
                         if c.name not in ("dp", "sequential"))
        others += self.left_out_text() + self.compiled_text()
        as_is = "" if self.as_is is None else f"; {self.as_is.summary()}"
        if self.ratio is None:
            return f"{times}{others} ({self.rounds} rounds); {self.decision}{as_is}"
        return (f"{times}{others}; IOS / sequential {self.ratio.median:.3f} ({percent(self.ratio.confidence)} "
                f"interval {self.ratio.span}, {self.rounds} rounds); {self.decision}{as_is}")


@dataclass(frozen=True)
class PeakMemory:
    """A schedule's peak activation memory in bytes (:mod:`ios_ray.scheduler.memory`: the graph input and output
    included, the weights not), the sequential schedule's beside it, and the budget it was searched under (None:
    none)."""

    peak_bytes: int
    sequential_peak_bytes: int
    budget_bytes: int | None = None

    def summary(self) -> str:
        """One line: the peak, the sequential schedule's, and the budget."""
        budget = "no budget" if self.budget_bytes is None else f"budget {megabytes(self.budget_bytes)}"
        return f"peak {megabytes(self.peak_bytes)} (sequential {megabytes(self.sequential_peak_bytes)}; {budget})"


def megabytes(size: int) -> str:
    """Bytes as a reader reads them: ``12.3 MB`` (10^6 bytes)."""
    return f"{size / 1e6:,.1f} MB"
