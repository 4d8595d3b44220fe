"""The search's end-to-end check: on a measured device the candidates of a setting (:mod:`~ios_ray.app.search.candidates`:
the DP's schedule, its alternatives, greedy, sequential) run whole, in rounds of alternating order, on an actor of
the device (:func:`~ios_ray.runtime.compare.contest`), and the search keeps, of the candidates whose interval of
candidate / sequential lies wholly below 1, the one of the lowest median; where none does, sequential (fewer
threads and streams, the same speed as far as the check can tell). The intervals hold together at
``check_confidence`` (each at a share of it: :func:`~ios_ray.paired.contest_confidence`); at the first of three
planned looks, up to ``check_rounds``, only the candidate of the lowest median goes on beside sequential, and the
check stops early once it decides or where the next look would end past ``check_seconds``. Each candidate's first
calls (its regions compiled, with ``inductor`` kernels; its CUDA graph captured) come before any round, in order
(the DP's schedule first): a candidate after the DP's whose first calls would start past half of ``check_seconds``
never runs (:data:`~ios_ray.runtime.compare.WARMUP_SHARE`; the check's record names it, ``left_out``).

Then the schedule kept runs against the model as is (its own forward, eager) in a few paired rounds
(:data:`~ios_ray.vocabulary.MODEL_AS_IS_ROUNDS`, at 95%): a report, not a decision (the search warns where the kept
schedule is slower beyond noise, for then ios-ray does not speed the model up on that device).

Every candidate that ran is a schedule timed whole on the device: the search stores it as a run
(:meth:`~ios_ray.store.LatencyStore.put_runs`), from which later searches fit their correction of stage costs.
"""

from __future__ import annotations

import dataclasses
import socket
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ios_ray.errors import UserError
from ios_ray.paired import ContestTiming, least_rounds, percent, valid_confidence
from ios_ray.profiler import CheckJob, DevicePool, ModelSource
from ios_ray.schedule import CandidateRun, EndToEnd, ModelAsIs, Schedule
from ios_ray.scheduler.correction import Correction, ScheduleRun, fit_correction
from ios_ray.vocabulary import MODEL_AS_IS_ROUNDS

if TYPE_CHECKING:
    from ios_ray.ir import Graph
    from ios_ray.store import LatencyStore

#: The candidate every other is timed against, and kept where none is faster beyond noise.
BASELINE = "sequential"


@dataclass(frozen=True)
class CheckSettings:
    """How the end-to-end check runs: at most ``rounds`` rounds (0: no check), intervals at ``confidence``, a next
    look only where it would end within ``seconds`` (None: no time cap), and its regions compiled beside
    ``compile_workers`` worker processes (None: as many as the device's host offers)."""

    rounds: int
    confidence: float
    seconds: float | None
    compile_workers: int | None = None

    def __post_init__(self) -> None:
        """Fail on a check that could never decide, or on a confidence or time cap out of range."""
        if not valid_confidence(self.confidence):
            raise UserError(f"check_confidence must be at least 0.5 and below 1 (e.g. 0.99), not {self.confidence}.")
        least = least_rounds(self.confidence)
        if 0 < self.rounds < least:
            raise UserError(f"check_rounds must be 0 (no check) or at least {least}: fewer rounds give no "
                            f"{percent(self.confidence)} interval that could decide, not {self.rounds}.")
        if self.seconds is not None and not self.seconds > 0:
            raise UserError(f"check_seconds must be above 0 (or None: no time cap), not {self.seconds}.")


def checked_end_to_end(
    pool: DevicePool, source: ModelSource, graph: Graph, settings: CheckSettings, candidates: dict[str, Schedule],
    correction: Correction,
) -> tuple[Schedule, list[dict[str, Any]]]:
    """Time the candidates whole against sequential on the device; the schedule kept, carrying the check, and the
    runs to store (one per candidate that ran)."""
    dp = candidates["dp"]
    job = CheckJob(source, graph, candidates, BASELINE, dp.batch, settings.rounds, dtype=dp.dtype,
                   confidence=settings.confidence, max_seconds=settings.seconds, as_is_rounds=MODEL_AS_IS_ROUNDS,
                   compile_workers=settings.compile_workers)
    timing = pool.time_schedules(dp.device, job)
    check = end_to_end(timing, candidates, correction)
    return kept_schedule(candidates, check), runs(timing, candidates, graph)


def end_to_end(timing: ContestTiming, candidates: dict[str, Schedule], correction: Correction) -> EndToEnd:
    """The check's record of a contest: the DP's and sequential's medians, predictions and ratio, every candidate
    that ran, and the one kept (:attr:`~ios_ray.paired.ContestTiming.kept`)."""
    ran = [CandidateRun(name, statistics.median(times), len(times), candidates[name].predicted_latency,
                        corrected_prediction(candidates[name], correction) if correction.runs else None,
                        timing.ratios.get(name))
           for name, times in timing.times_ms.items() if times]
    medians = {run.name: run.ms for run in ran}
    dp, plain = candidates["dp"], candidates[BASELINE]
    as_is = None if timing.as_is is None else \
        ModelAsIs(statistics.median(timing.as_is.second_ms), timing.as_is.rounds, timing.as_is.ratio)
    return EndToEnd(timing.rounds, medians["dp"], medians[BASELINE], dp.predicted_latency, plain.predicted_latency,
                    timing.ratios["dp"], tuple(ran), timing.kept, as_is, timing.left_out, timing.compiled)


def kept_schedule(candidates: dict[str, Schedule], check: EndToEnd) -> Schedule:
    """The candidate the check keeps (:attr:`EndToEnd.kept`), carrying the check."""
    return dataclasses.replace(candidates[check.kept], end_to_end=check)


def runs(timing: ContestTiming, candidates: dict[str, Schedule], graph: Graph) -> list[dict[str, Any]]:
    """The store's rows of the candidates that ran (:data:`~ios_ray.store.schema.RUN_SCHEMA`): each one's stage sum,
    stages and extra groups beside its median."""
    found = []
    for name, times in timing.times_ms.items():
        schedule = candidates[name]
        if not times or schedule.predicted_latency is None:
            continue
        stages, extra = schedule.shape
        found.append({"device": schedule.device, "device_fingerprint": schedule.device_fingerprint,
                      "batch": schedule.batch, "dtype": schedule.dtype, "model": schedule.model,
                      "graph_fingerprint": graph.fingerprint, "schedule": name,
                      "predicted_ms": schedule.predicted_latency, "stages": stages, "extra_groups": extra,
                      "measured_ms": statistics.median(times), "rounds": len(times), "host": socket.gethostname()})
    return found


def stored_correction(store: "LatencyStore", device_fingerprint: str, batch: int, dtype: str) -> Correction:
    """The correction fitted from the runs :func:`runs` stored for this device, batch and dtype."""
    stored = store.runs(device_fingerprint, batch, dtype)
    return fit_correction([ScheduleRun(*row) for row in zip(*(
        stored[column].to_pylist() for column in ("predicted_ms", "stages", "extra_groups", "measured_ms")))])


def corrected_prediction(schedule: Schedule, correction: Correction) -> float | None:
    """A schedule's stage sum as the correction prices it (the stage sum itself under the identity); None where it
    has no stage sum."""
    if schedule.predicted_latency is None:
        return None
    return correction.predict(schedule.predicted_latency, *schedule.shape)
