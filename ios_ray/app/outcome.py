"""What a search found for one (device, batch): :class:`SearchOutcome`, and the line that says which schedule it kept
and why (printed as each setting is decided, and by ``SearchResult``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ios_ray.schedule import EndToEnd, Schedule


@dataclass(frozen=True)
class SearchOutcome:
    """The result for one (device, batch): the schedule kept, the DP's and the sequential schedule's predicted
    latency, how many stages were measured new and found stored (outliers measured again count in neither: the
    schedule's ``params["measure"]["remeasured"]``), where the file went (None: not written), and on a measured
    device the end-to-end check (the ratio DP / sequential, its interval and rounds, which of the two it kept and
    why: ``end_to_end.decision``)."""

    device: str
    batch: int
    schedule: Schedule
    predicted_ms: float
    sequential_ms: float
    measured: int
    cached: int
    wall_s: float
    path: Path | None
    source: str
    planned: int = 0

    @property
    def end_to_end(self) -> EndToEnd | None:
        """The end-to-end check behind the kept schedule (None on a ``sim:`` device or with no check)."""
        return self.schedule.end_to_end

    @property
    def speedup(self) -> float:
        """Predicted speedup of the IOS schedule over the sequential one."""
        return self.sequential_ms / self.predicted_ms

    @property
    def decision(self) -> str:
        """Which schedule the file keeps and why: the end-to-end check's decision (``kept sequential: within noise,
        0.98-1.03``), else why there was no check."""
        if self.end_to_end is not None:
            return self.end_to_end.decision
        if self.source == "simulated":
            return "kept IOS: simulated, so nothing to time end to end"
        return "kept IOS: not checked end to end (check_rounds=0)"

    def summary(self) -> str:
        """One line: the decision, both predictions, what the check timed, and the peak memory."""
        check = self.end_to_end
        timed = ""
        if check is not None:
            ratio = "" if check.ratio is None else f", ratio {check.ratio.median:.3f}"
            timed = f"; end to end {check.dp_ms:.3f} / {check.sequential_ms:.3f} ms{ratio} in {check.rounds} rounds"
        memory = "" if self.schedule.memory is None else f"; {self.schedule.memory.summary()}"
        return (f"{self.device} batch {self.batch}: {self.decision}; IOS {self.predicted_ms:.3f} ms, sequential "
                f"{self.sequential_ms:.3f} ms predicted ({self.source}){timed}{memory}")
