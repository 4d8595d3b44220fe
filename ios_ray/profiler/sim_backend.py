"""The sim backend: predicts a stage's latency with the sim model and takes as long as measuring it would."""

from __future__ import annotations

import time
from typing import Any, Sequence

from ios_ray.devices import DeviceSpec
from ios_ray.profiler.fingerprint import device_fingerprint
from ios_ray.errors import UserError
from ios_ray.paired import ContestTiming
from ios_ray.profiler.jobs import CheckJob, DeviceIdentity, MeasureJob, ModelSource, local_identity, make_row
from ios_ray.profiler.protocol import Timing, resolve_protocol
from ios_ray.profiler.sim_model import sim_parameters, stage_latency_ms

#: Fixed host-side cost of measuring one stage (building inputs, compiling the stage), slept per stage.
STAGE_OVERHEAD_S = 0.002


class SimBackend:
    """Simulated measurement on ``sim:<gpu>``: deterministic latencies, rows marked ``source='simulated'``."""

    def __init__(self, spec: DeviceSpec, warmup: int | None = None, repeat: int | None = None) -> None:
        if not spec.simulated or spec.gpu is None:
            raise ValueError(f"{spec.label} is not a sim device")
        self.spec = spec
        self.gpu = spec.gpu
        self.warmup, self.repeat = resolve_protocol("gpu", warmup, repeat)
        self.identity: DeviceIdentity | None = None

    def start(self) -> DeviceIdentity:
        """Fingerprint the sim model for this GPU."""
        fingerprint, info = device_fingerprint(self.spec, sim_params=sim_parameters(self.gpu))
        self.identity = local_identity(self.spec.label, fingerprint, info, "simulated")
        return self.identity

    def prepare(self, model: ModelSource, dtype: str, memory_format: str) -> str | None:
        """Nothing to build: the sim model reads the driver's graph only."""
        return None

    def measure(self, job: MeasureJob) -> dict[str, Any]:
        """Predict the stage's latency, sleep as long as warmup and repeat runs would take, return the row."""
        identity = self.identity or self.start()
        latency = stage_latency_ms(job.graph, job.stage, job.batch, self.gpu, job.dtype)
        time.sleep((self.warmup + self.repeat) * latency / 1e3 + STAGE_OVERHEAD_S)
        timing = Timing(latency, latency, latency, self.repeat, self.warmup, self.repeat)
        return make_row(job, timing, identity.running(job.kernels))

    def measure_all(self, jobs: Sequence[MeasureJob]) -> list[dict[str, Any]]:
        """Predict a batch of stages, one after the other."""
        return [self.measure(job) for job in jobs]

    def time_schedules(self, job: CheckJob) -> ContestTiming:
        """Not offered: a simulated device has no end-to-end latency beyond the sum of its stages."""
        raise UserError(f"{self.spec.label} is simulated, so its schedules cannot be timed end to end.")
