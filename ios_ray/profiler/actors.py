"""The Ray actor that measures stages on one device unit, and how it is started."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.actor import ActorHandle

from ios_ray.devices import parse_device
from ios_ray.errors import UserError
from ios_ray.profiler.backends import Backend, make_backend
from ios_ray.profiler.cluster import Placement
from ios_ray.paired import ContestTiming
from ios_ray.profiler.jobs import CheckJob, DeviceIdentity, MeasureJob, ModelSource


@dataclass(frozen=True)
class Hello:
    """What an actor reports on start: who measures, or the one sentence saying why it cannot."""

    label: str
    identity: DeviceIdentity | None
    problem: str | None = None


@dataclass(frozen=True)
class Built:
    """What an actor reports once it has built a model: the fingerprint of the graph it imported to (None: nothing
    to build, a simulated device), or the one sentence saying why it cannot be built."""

    fingerprint: str | None
    problem: str | None = None


class ProfilerActor:
    """Measures stages, and times whole schedules, on one device unit (one GPU, a node's CPUs, or one simulated GPU)."""

    def __init__(self, label: str, warmup: int | None, repeat: int | None) -> None:
        self.label = label
        self.backend: Backend = make_backend(parse_device(label), warmup, repeat)

    def renew(self, warmup: int | None, repeat: int | None) -> None:
        """Start over with a fresh backend (no model, program or timing setting kept), in this warm process: a
        parked actor taken by the next search (:mod:`~ios_ray.profiler.parking`)."""
        self.backend = make_backend(parse_device(self.label), warmup, repeat)

    def hello(self) -> Hello:
        """Check the device and fingerprint it; a device this torch cannot run is reported, not raised."""
        try:
            return Hello(self.label, self.backend.start())
        except UserError as error:
            return Hello(self.label, None, str(error))

    def prepare(self, model: ModelSource, dtype: str, memory_format: str) -> Built:
        """Build a model on the device in ``dtype`` and ``memory_format`` before measuring it: the fingerprint of the
        graph it imported to, or the one sentence saying why it cannot be built."""
        try:
            return Built(self.backend.prepare(model, dtype, memory_format))
        except UserError as error:
            return Built(None, str(error))

    def measure(self, jobs: list[MeasureJob]) -> list[dict[str, Any]]:
        """Measure a batch of stages (on a GPU several in one CUDA graph); their rows in order."""
        return self.backend.measure_all(jobs)

    def time_schedules(self, job: CheckJob) -> ContestTiming:
        """Time whole schedules in rounds against a baseline until the interval of the best decides (or the job's
        cap)."""
        return self.backend.time_schedules(job)


RemoteProfilerActor = ray.remote(ProfilerActor)


def start_actor(placement: Placement, warmup: int | None, repeat: int | None, max_restarts: int) -> ActorHandle[Any]:
    """Start one actor for a placement; Ray restarts it (same node) up to ``max_restarts`` times if it dies."""
    return RemoteProfilerActor.options(
        **placement.options(), max_restarts=max_restarts, max_task_retries=0
    ).remote(placement.label, warmup, repeat)  # type: ignore[return-value]  # Ray 2.60 types it a handle or a class
