"""A whole graph's schedule (:class:`Schedule`) and its JSON form: the file's fields
(:data:`~ios_ray.schedule.format.SCHEDULE_FIELDS`) made into a :class:`Schedule`, written from one, and checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ios_ray.schedule.format import (SCHEDULE_FIELDS, SCHEDULE_FORMAT, SCHEDULE_VERSION, Record, envelope_defects,
                                     read_record, record_defects, upgraded, write_record)
from ios_ray.schedule.records import BlockSchedule, EndToEnd, PeakMemory
from ios_ray.stage import Stage
from ios_ray.vocabulary import DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, EAGER_KERNELS


@dataclass(frozen=True)
class Schedule:
    """A whole-graph schedule specialised for one (device, batch, dtype); its graph's memory format comes along."""

    model: str
    graph_fingerprint: str
    device: str
    batch: int
    blocks: tuple[BlockSchedule, ...]
    dtype: str = DEFAULT_DTYPE
    device_fingerprint: str = ""
    device_info: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    source: str = "measured"
    end_to_end: EndToEnd | None = None
    input_shape: tuple[int, ...] | None = None
    memory_format: str = DEFAULT_MEMORY_FORMAT
    memory: PeakMemory | None = None
    kernels: str = EAGER_KERNELS

    @property
    def numerics(self) -> tuple[str, ...]:
        """Its dtype, and its memory format where that is not contiguous: what listings and titles name."""
        return (self.dtype,) if self.memory_format == DEFAULT_MEMORY_FORMAT else (self.dtype, self.memory_format)

    @property
    def stages(self) -> tuple[Stage, ...]:
        """All stages of the graph in execution order."""
        return tuple(s for b in self.blocks for s in b.stages)

    @property
    def shape(self) -> tuple[int, int]:
        """Its stages, and its groups beyond the first of each concurrent stage (what a correction of stage costs
        prices besides their sum: :mod:`~ios_ray.scheduler.correction`)."""
        stages = self.stages
        return len(stages), sum(len(s.groups) - 1 for s in stages if s.strategy == "concurrent")

    @property
    def predicted_latency(self) -> float | None:
        """Predicted end-to-end latency in ms: the sum of all stage latencies (None where any is unknown)."""
        latencies = [b.latency for b in self.blocks]
        return None if any(x is None for x in latencies) else float(sum(latencies))  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        """Its JSON form, as the file holds it (:func:`schedule_to_json`)."""
        return schedule_to_json(self)


#: The whole file, after its ``format`` and ``version``.
SCHEDULE = Record(SCHEDULE_FIELDS, build=lambda v, _: Schedule(**v))


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    """The schedule's JSON form, as the file holds it (see :func:`schedule_from_json`)."""
    return {"format": SCHEDULE_FORMAT, "version": SCHEDULE_VERSION, **write_record(SCHEDULE, schedule)}


def schedule_defects(data: Any) -> list[str]:
    """Every field of a schedule's JSON form that is missing, of the wrong type or out of range, one phrase each
    (``batch is '1', not a whole number from 1 to ...``); empty where the form is sound."""
    return envelope_defects(data) or record_defects(SCHEDULE, upgraded(data), "")


def schedule_from_json(data: Mapping[str, Any]) -> Schedule:
    """Parse the JSON form; raises ValueError listing the defects (:func:`schedule_defects`) of a malformed one."""
    defects = schedule_defects(data)
    if defects:
        raise ValueError("; ".join(defects))
    schedule: Schedule = read_record(SCHEDULE, upgraded(data), {})
    return schedule
