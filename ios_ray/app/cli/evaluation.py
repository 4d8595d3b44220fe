"""Cross-evaluation of schedules (the IOS paper's Table 3): the schedule optimised for X, run on Y.

Every schedule of a folder (of one model and dtype) is evaluated on every (device, batch) setting that some
schedule of the folder was made for. A setting on a device this machine has (``cpu``, or ``cuda`` when torch sees a
GPU) is *measured* end to end; any other is *predicted* as the sum of the schedule's stage latencies from the
latency store for that device and batch, labelled ``simulated`` for ``sim:`` devices and ``predicted`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ios_ray.app.search.budgets import Lookup
from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.schedule import Schedule
from ios_ray.scheduler.correction import Correction
from ios_ray.stage import StageKeys
from ios_ray.vocabulary import is_simulated

Setting = tuple[str, int]
#: Measures a schedule end to end at a batch size on a local device; returns the median latency in ms.
Measure = Callable[[Schedule, int], float]


@dataclass(frozen=True)
class Cell:
    """The latency of the schedule made for ``made_for`` when run on ``run_on``, and how it was obtained."""

    made_for: Setting
    run_on: Setting
    latency_ms: float | None
    how: str

    @property
    def own(self) -> bool:
        """True on the diagonal: the schedule runs on the setting it was made for."""
        return self.made_for == self.run_on


def settings_of(schedules: Sequence[Schedule]) -> list[Setting]:
    """The distinct (device, batch) settings of some schedules, sorted by device then batch."""
    return sorted({(s.device, s.batch) for s in schedules})


def cross_evaluate(
    schedules: Sequence[Schedule], graph: Graph, lookup: Lookup, measure: Mapping[str, Measure]
) -> list[Cell]:
    """Every schedule on every setting; ``measure`` maps the device labels measurable here to a measuring function."""
    if not schedules:
        raise UserError("no schedules to evaluate; run `ios-ray search` first.")
    fingerprints = {s.device: s.device_fingerprint for s in schedules}
    keys = StageKeys(graph)
    cells = []
    for device, batch in settings_of(schedules):
        for schedule in sorted(schedules, key=lambda s: (s.device, s.batch)):
            made_for = (schedule.device, schedule.batch)
            if device in measure:
                cells.append(Cell(made_for, (device, batch), measure[device](schedule, batch), "measured"))
                continue
            total = predicted_ms(schedule, keys, lookup, batch, fingerprints[device])
            cells.append(Cell(made_for, (device, batch), total, "simulated" if is_simulated(device) else "predicted"))
    return cells


def predicted_ms(
    schedule: Schedule, keys: StageKeys, lookup: Lookup, batch: int, fingerprint: str | None = None
) -> float | None:
    """The sum of the schedule's stage latencies in the store for a device fingerprint (default: the schedule's
    own) and batch, in the schedule's dtype (on its own device as the correction it was searched with prices it,
    where it had one), or None where any is missing."""
    stage_keys = [keys.key(stage) for stage in schedule.stages]
    table = lookup(stage_keys, fingerprint or schedule.device_fingerprint, batch, schedule.dtype)
    if not all(k in table for k in stage_keys):
        return None
    found = sum(table[k] for k in stage_keys)
    if "correction" not in schedule.params or fingerprint not in (None, schedule.device_fingerprint):
        return found
    return Correction.from_json(schedule.params["correction"]).predict(found, *schedule.shape)


def winners_hold(cells: Sequence[Cell]) -> dict[Setting, bool | None]:
    """Per setting: whether the schedule made for it is at least as fast there as every other schedule; None where
    its own cell has no latency (the store lacks a stage of it), so that nothing can be said."""
    result: dict[Setting, bool | None] = {}
    for setting in {c.run_on for c in cells}:
        column = [(c.latency_ms, c.own) for c in cells if c.run_on == setting and c.latency_ms is not None]
        own = [ms for ms, is_own in column if is_own]
        result[setting] = all(own[0] <= ms * (1 + 1e-9) for ms, _ in column) if own else None
    return result


def local_measures(
    model: str, rounds: int, input_shape: Sequence[int] | None, dtype: str, memory_format: str
) -> dict[str, Measure]:
    """Measuring functions for the device labels this machine runs: ``cpu``, and ``cuda`` where torch sees a GPU
    (the model imported at ``input_shape``, default its own, and run in ``dtype`` and ``memory_format``)."""
    import torch

    from ios_ray.dtypes import in_memory_format, torch_dtype
    from ios_ray.frontend import import_model
    from ios_ray.runtime import Programs, ScheduleRunner, measure_latency

    bound: list[Programs] = []

    def on(device: str) -> Measure:
        def measure(schedule: Schedule, batch: int) -> float:
            if not bound:
                bound.append(Programs(import_model(model, input_shape, dtype, memory_format)))
            program = bound[0](device, schedule.kernels)
            runner = ScheduleRunner(program, schedule, device)
            x = torch.randn(batch, *program.graph.input_shape, device=device, dtype=torch_dtype(dtype))
            x = in_memory_format(x, memory_format)
            return measure_latency(runner, x, warmup=2, repeat=rounds, device=device)[0]
        return measure

    return {"cpu": on("cpu"), **({"cuda": on("cuda")} if torch.cuda.is_available() else {})}
