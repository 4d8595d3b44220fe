"""The real backend: times a stage with the runtime's own stage executor on a CPU or GPU.

The stage runs exactly as deployed: ``compile_stage`` from ``ios_ray.runtime.stages`` on a ``Program`` built
from the model spec on this process's device. Its external inputs are random (``torch.randn``) tensors of the
graph's shapes with the batch dimension prepended.
"""

from __future__ import annotations

from typing import Any

import torch

from ios_ray.devices import DeviceSpec, cuda_problem, device_fingerprint
from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.profiler.jobs import DeviceIdentity, MeasureJob, local_identity, make_row
from ios_ray.profiler.timing import time_callable
from ios_ray.runtime.program import Program
from ios_ray.runtime.stages import Lanes, compile_stage, make_lanes
from ios_ray.stage import Stage

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32}


class RealBackend:
    """Measured execution on ``cpu``, ``cuda[:i]`` or a GPU label; rows are marked ``source='measured'``."""

    def __init__(self, spec: DeviceSpec, warmup: int | None = None, repeat: int | None = None) -> None:
        if spec.simulated:
            raise ValueError(f"{spec.label} is simulated, not a real device")
        self.spec = spec
        self.warmup = warmup
        self.repeat = repeat
        self.device = spec.torch_device()
        self.identity: DeviceIdentity | None = None
        self._programs: dict[str, Program] = {}
        self._lanes: Lanes | None = None

    def start(self) -> DeviceIdentity:
        """Check that this torch can run the device, then fingerprint it."""
        if self.spec.kind != "cpu":
            problem = cuda_problem(self.spec)
            if problem:
                raise UserError(problem)
        fingerprint, info = device_fingerprint(self.spec)
        self.identity = local_identity(self.spec.label, fingerprint, info, "measured")
        return self.identity

    def measure(self, job: MeasureJob) -> dict[str, Any]:
        """Compile the stage with the runtime, feed it random inputs, time it, and return the row."""
        identity = self.identity or self.start()
        if self._lanes is None:
            self._lanes = make_lanes(self.device)
        run = compile_stage(self._program(job, identity.host), job.stage, self.device, self._lanes)
        env = random_inputs(job.graph, job.stage, job.batch, _dtype(job.dtype), self.device)
        try:
            timing = time_callable(lambda: run(env), self.device, self.warmup, self.repeat)
        except torch.cuda.OutOfMemoryError:
            raise UserError(
                f"a stage of {job.model} at batch {job.batch} does not fit in the memory of {self.spec.label}; "
                "use a smaller batch size."
            ) from None
        return make_row(job, timing, identity)

    def _program(self, job: MeasureJob, host: str) -> Program:
        """The job's model on this device, built once per model spec and checked against the job's graph."""
        if job.model not in self._programs:
            self._programs[job.model] = Program.from_model(job.model, self.device)
        program = self._programs[job.model]
        if program.graph.fingerprint != job.graph.fingerprint:
            raise UserError(
                f"model {job.model!r} imports to a different graph on {host} than on the driver; install the same "
                "ios-ray, torch and model code on every node."
            )
        return program


def random_inputs(
    graph: Graph, stage: Stage, batch: int, dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """Random tensors for every source a stage reads from outside itself, keyed by source id."""
    inside = set(stage.units)
    sources = dict.fromkeys(s for u in stage.units for s in graph.unit(u).sources if s not in inside)
    return {s: torch.randn((batch, *graph.shape_of(s)), dtype=dtype, device=device) for s in sources}


def _dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name; others are a user error."""
    if name not in DTYPES:
        raise UserError(f"measuring supports {', '.join(DTYPES)} only, not {name!r}; use --dtype float32.")
    return DTYPES[name]
