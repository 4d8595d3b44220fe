"""What a search found for one (device, batch): :class:`SearchOutcome`, and the line that says which schedule it kept
and why (printed as each setting is decided, and by ``SearchResult``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ios_ray.app.search.phases import SearchTimes
from ios_ray.scheduler.correction import IDENTITY, Correction
from ios_ray.schedule import EndToEnd, Schedule


@dataclass(frozen=True)
class SearchOutcome:
    """The result for one (device, batch): the schedule kept, the DP's and the sequential schedule's predicted
    latency (their stage sums, as the setting's correction prices them where one was fitted: ``correction``), how
    many stages were measured new and found stored (outliers measured again count in neither: the schedule's
    ``params["measure"]["remeasured"]``), where the search's time went until the setting was decided (``times``,
    also the file's ``params["search_s"]``), where the file went (None: not written), and on a measured device the
    end-to-end check (each candidate that ran, the ratio DP / sequential, its interval and rounds, which it kept and
    why: ``end_to_end.decision``)."""

    device: str
    batch: int
    schedule: Schedule
    predicted_ms: float
    sequential_ms: float
    measured: int
    cached: int
    times: SearchTimes
    path: Path | None
    source: str
    planned: int = 0
    correction: Correction = IDENTITY

    @property
    def end_to_end(self) -> EndToEnd | None:
        """The end-to-end check behind the kept schedule (None on a ``sim:`` device or with no check)."""
        return self.schedule.end_to_end

    @property
    def wall_s(self) -> float:
        """Seconds from the search's start until this setting was decided."""
        return self.times.wall_s

    @property
    def speedup(self) -> float:
        """Predicted speedup of the IOS schedule over the sequential one."""
        return self.sequential_ms / self.predicted_ms

    @property
    def kernels(self) -> str:
        """How the setting's kernels were chosen, in words (``fused kernels: faster beyond noise, ...``)."""
        return str(self.schedule.params.get("kernels", {}).get("decision", f"{self.schedule.kernels} kernels"))

    @property
    def decision(self) -> str:
        """Which schedule the file keeps and why: the end-to-end check's decision (``kept sequential: within noise,
        0.98-1.03``), else why there was no check."""
        if self.end_to_end is not None:
            return self.end_to_end.decision
        if self.source == "simulated":
            return "kept IOS: simulated, so nothing to time end to end"
        return "kept IOS: not checked end to end (check_rounds=0)"

    @property
    def slower_than_as_is(self) -> str | None:
        """Where the kept schedule ran slower than the model as is beyond noise, the warning that says so (else
        None)."""
        as_is = None if self.end_to_end is None else self.end_to_end.as_is
        if as_is is None or not as_is.slower:
            return None
        return (f"warning: {self.device} batch {self.batch}: the schedule kept ran {as_is.ratio.median:.2f}x as long "
                f"as the model as is ({as_is.ratio.span}, {as_is.rounds} rounds): ios-ray does not speed "
                f"{self.schedule.model} up there; run the model as is on {self.device}")

    def summary(self) -> str:
        """One line: the decision, the kernels, both predictions, what the check timed (the model as is too), and the
        peak memory."""
        check = self.end_to_end
        timed = ""
        if check is not None:
            deciding = check.deciding
            ratio = "" if deciding is None else f", ratio {deciding.median:.3f}"
            timed = (f"; end to end {check.times()}{ratio} in {check.rounds} rounds{check.left_out_text()}"
                     f"{check.compiled_text()}")
            timed += "" if check.as_is is None else f"; {check.as_is.summary()}"
        memory = "" if self.schedule.memory is None else f"; {self.schedule.memory.summary()}"
        return (f"{self.device} batch {self.batch}: {self.decision}; {self.kernels}; IOS {self.predicted_ms:.3f} ms, "
                f"sequential {self.sequential_ms:.3f} ms predicted ({self.source}){timed}{memory}")
