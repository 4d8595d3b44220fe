"""The one interface every measurement backend offers, and the factory that picks one for a device label."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from ios_ray.devices import DeviceSpec
from ios_ray.paired import ContestTiming
from ios_ray.profiler.jobs import CheckJob, DeviceIdentity, MeasureJob, ModelSource


class Backend(Protocol):
    """Measures stages on one device unit; ``start`` raises UserError when the device is unusable here."""

    def start(self) -> DeviceIdentity:
        """Check the device, fingerprint it, and say who measures."""

    def prepare(self, model: ModelSource, dtype: str, memory_format: str) -> str | None:
        """Get ready to measure stages of a model in ``dtype`` and ``memory_format`` (build it on the device): the
        fingerprint of the graph it imported to (None: nothing to build); UserError where it cannot."""

    def measure(self, job: MeasureJob) -> dict[str, Any]:
        """Time one stage and return its latency row (the store's columns)."""

    def measure_all(self, jobs: Sequence[MeasureJob]) -> list[dict[str, Any]]:
        """Time a batch of stages; their rows in order."""

    def time_schedules(self, job: CheckJob) -> ContestTiming:
        """Time whole schedules in rounds against a baseline until the interval of the best decides (or the job's
        cap)."""


def make_backend(spec: DeviceSpec, warmup: int | None = None, repeat: int | None = None) -> Backend:
    """The backend for a device: the sim model for ``sim:`` labels, else real execution through the runtime."""
    if spec.simulated:
        from ios_ray.profiler.sim_backend import SimBackend

        return SimBackend(spec, warmup, repeat)
    from ios_ray.profiler.real import RealBackend

    return RealBackend(spec, warmup, repeat)
