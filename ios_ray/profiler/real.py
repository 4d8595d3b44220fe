"""The real backend: times a stage with the runtime's own stage executor on a CPU or GPU.

The stage runs exactly as deployed: ``compile_stage`` from ``ios_ray.runtime.stages`` on a ``Program`` of the job's
model (built from its spec, or fetched as the driver's object; :mod:`~ios_ray.profiler.model_source`) on this
process's device, with the job's kernels. Its external inputs are random (``torch.randn``) tensors of the graph's
shapes with the batch dimension prepended, in the job's dtype and laid out as the program holds activations (the
graph's memory format for eager kernels, else channels-last; the model is converted to the dtype and format and
imported there, as on the driver). On a CPU each call follows a small untimed op on the same thread
(:func:`~ios_ray.runtime.timing.cpu_primer`), as in a pass; on a GPU the stages of a batch are timed together inside
a CUDA graph, as a deployed schedule runs (:func:`~ios_ray.profiler.timing.time_stages`), captured on one stream kept
for all stages.
"""

from __future__ import annotations

import dataclasses
import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from ios_ray.devices import DeviceSpec
from ios_ray.dtypes import converted, in_memory_format, torch_dtype
from ios_ray.profiler.fingerprint import cuda_problem, device_fingerprint
from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.paired import REPORT_CONFIDENCE, CompiledAhead, ContestTiming, LookPlan, PairedTiming, contest_confidence
from ios_ray.profiler.jobs import (CheckJob, DeviceIdentity, MeasureJob, ModelSource, local_identity, make_row,
                                   refuse_another_graph)
from ios_ray.profiler.model_source import import_source, load_source
from ios_ray.profiler.timing import GRAPH_STAGES, time_stages
from ios_ray.runtime.executor import ScheduleRunner
from ios_ray.runtime.program import Program
from ios_ray.runtime.stages import Lanes, compile_stage, make_lanes
from ios_ray.runtime.ahead import compile_ahead, default_workers
from ios_ray.runtime.compare import WARMUP_SHARE, contest, paired_timing
from ios_ray.runtime.timing import cpu_primer
from ios_ray.stage import Stage
from ios_ray.vocabulary import EAGER_KERNELS, INDUCTOR_KERNELS


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
        self._programs: dict[tuple[str, str, str, str], Program] = {}
        self._modules: dict[tuple[str, str, str], torch.nn.Module] = {}
        self._lanes: Lanes | None = None
        self._capture_stream: torch.cuda.Stream | None = None
        self._primer = cpu_primer() if self.device.type == "cpu" else None
        self._kept: ScheduleRunner | None = None  # the last check job's kept runner (:meth:`_runners`)

    def start(self) -> DeviceIdentity:
        """Check that this torch can run the device, then fingerprint it."""
        if self.spec.kind != "cpu":
            problem = cuda_problem(self.spec)
            if problem:
                raise UserError(problem)
        fingerprint, info = device_fingerprint(self.spec)
        self.identity = local_identity(self.spec.label, fingerprint, info, "measured")
        return self.identity

    def prepare(self, model: ModelSource, dtype: str, memory_format: str) -> str | None:
        """Build the model on this device in ``dtype`` and ``memory_format`` now (once), so that a model this node
        cannot rebuild fails early: the fingerprint of the graph it imported to."""
        return self._built(model, dtype, memory_format).graph.fingerprint

    def measure(self, job: MeasureJob) -> dict[str, Any]:
        """Compile the stage with the runtime, feed it random inputs, time it, and return the row."""
        return self.measure_all([job])[0]

    def measure_all(self, jobs: Sequence[MeasureJob]) -> list[dict[str, Any]]:
        """Measure a batch of stages, their rows in order: on a CPU one after the other (each compiled, fed random
        inputs and timed, then released), on a GPU up to :data:`~ios_ray.profiler.timing.GRAPH_STAGES` at a time,
        captured together (:func:`~ios_ray.profiler.timing.time_stages`)."""
        identity = self.identity or self.start()
        if self._lanes is None:
            self._lanes = make_lanes(self.device)
            self._capture_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        together = GRAPH_STAGES if self.device.type == "cuda" else 1
        rows = []
        for start in range(0, len(jobs), together):
            batch = jobs[start:start + together]
            runs = [self._stage_call(job, identity.host) for job in batch]
            with _fits(self.spec.label, batch[0].model.name, max(job.batch for job in batch)):
                timings = time_stages(runs, self.device, self.warmup, self.repeat, self._primer, self._capture_stream)
            rows += [make_row(job, timing, identity.running(job.kernels)) for job, timing in zip(batch, timings)]
        return rows

    def _stage_call(self, job: MeasureJob, host: str) -> Callable[[], object]:
        """A job's stage compiled with the runtime on random inputs: the call to time."""
        program = self._program(job.model, job.graph, host, job.dtype, job.kernels)
        run = compile_stage(program, job.stage, self.device, self._lanes)
        env = random_inputs(job.graph, job.stage, job.batch, torch_dtype(job.dtype), self.device, program.layout)
        return functools.partial(run.run, *[env[source] for source in run.inputs])  # as the deployed pass calls it

    def time_schedules(self, job: CheckJob) -> ContestTiming:
        """The job's schedules, each run as deployed (a CUDA graph on a GPU, its own kernels) on one random batch of
        its dtype, timed in rounds against its baseline until the interval of the best over the baseline decides, or
        the job's cap; then the one kept against the model as is (:meth:`_as_is`), on the same batch."""
        identity = self.identity or self.start()
        x = torch.randn(job.batch, *job.graph.input_shape, device=self.device, dtype=torch_dtype(job.dtype))
        x = in_memory_format(x, job.graph.memory_format)
        runners = self._runners(job, identity.host)
        runs = {name: functools.partial(runner, x) for name, runner in runners.items()}
        plan = LookPlan.planned(job.rounds, contest_confidence(job.confidence, len(runs) - 1))
        with _fits(self.spec.label, job.model.name, job.batch):
            compiled = self._compiled_ahead(job, runners, x)
            seconds = job.max_seconds if compiled is None or job.max_seconds is None else \
                max(0.0, job.max_seconds - compiled.seconds)
            timing = dataclasses.replace(contest(runs, job.baseline, self.device, plan, job.warmup, seconds),
                                         compiled=compiled)
        self._kept = runners[timing.kept]
        if job.as_is_rounds == 0:
            return timing
        return dataclasses.replace(timing, as_is=self._time_as_is(job, runs[timing.kept], x))

    def _compiled_ahead(self, job: CheckJob, runners: dict[str, ScheduleRunner], x: torch.Tensor
                        ) -> CompiledAhead | None:
        """The regions of the runners with ``inductor`` kernels compiled side by side before the contest
        (:func:`~ios_ray.runtime.ahead.compile_ahead`, within the share of the job's time its first calls may take);
        None where no runner has regions to compile."""
        inductor = [runner for runner in runners.values() if runner.program.kernels == INDUCTOR_KERNELS]
        if not inductor:
            return None
        workers = default_workers() if job.compile_workers is None else job.compile_workers
        share = None if job.max_seconds is None else WARMUP_SHARE * job.max_seconds
        with torch.no_grad():
            return compile_ahead([functools.partial(runner.run_stages, x) for runner in inductor], workers, share)

    def _runners(self, job: CheckJob, host: str) -> dict[str, ScheduleRunner]:
        """A runner per schedule of the job; the previous job's kept runner is taken over where it runs one of the
        schedules (the same stages and program: its regions compiled, its weights packed, its graph captured), as the
        kernel choice's kept sequential schedule comes back as the check's baseline; otherwise it is dropped first."""
        previous, self._kept = self._kept, None
        programs = {name: self._program(job.model, job.graph, host, job.dtype, schedule.kernels)
                    for name, schedule in job.schedules.items()}
        taken = {name: previous for name, schedule in job.schedules.items() if previous is not None
                 and previous.program is programs[name] and previous.schedule.stages == schedule.stages}
        del previous
        return {name: taken[name] if name in taken else ScheduleRunner(programs[name], schedule, self.device)
                for name, schedule in job.schedules.items()}

    def _time_as_is(self, job: CheckJob, kept: Callable[[], object], x: torch.Tensor) -> PairedTiming | None:
        """The kept schedule timed against the model as is on ``x``; None where the model as is does not fit in the
        device's memory beside the schedules (a report: never a reason for the check to fail)."""
        try:
            module = self._as_is(job.model, job.dtype, job.graph.memory_format)
            return paired_timing(kept, functools.partial(module, x), self.device,
                                 LookPlan.planned(job.as_is_rounds, REPORT_CONFIDENCE), job.warmup, job.max_seconds)
        except torch.cuda.OutOfMemoryError:
            self._modules.clear()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    def _as_is(self, model: ModelSource, dtype: str, memory_format: str) -> torch.nn.Module:
        """The model as a user runs it without ios-ray: its own module in eval mode on this device, in ``dtype`` and
        ``memory_format``, built once per model, dtype and format."""
        key = (model.key, dtype, memory_format)
        if key not in self._modules:
            module = converted(load_source(model).module, dtype, memory_format)
            self._modules[key] = module.to(self.device).eval()
        return self._modules[key]

    def _program(self, model: ModelSource, graph: Graph, host: str, dtype: str, kernels: str = EAGER_KERNELS
                 ) -> Program:
        """A model on this device in ``dtype`` and the graph's memory format, run with ``kernels``, built once per
        model, dtype, format and kernels and checked against the driver's graph of it."""
        program = self._built(model, dtype, graph.memory_format, kernels)
        refuse_another_graph(model.name, program.graph.fingerprint, graph.fingerprint, host)
        return program

    def _built(self, model: ModelSource, dtype: str, memory_format: str, kernels: str = EAGER_KERNELS) -> Program:
        """A model on this device in ``dtype`` and ``memory_format``, run with ``kernels``, built once per model, dtype,
        format and kernels."""
        key = (model.key, dtype, memory_format, kernels)
        program = self._programs.get(key)
        if program is None:
            imported = import_source(model, dtype, memory_format)
            program = self._programs[key] = Program.from_imported(imported, self.device, kernels)
        return program


@contextmanager
def _fits(label: str, model: str, batch: int) -> Iterator[None]:
    """Turn running out of GPU memory into one sentence."""
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        raise UserError(
            f"{model} at batch {batch} does not fit in the memory of {label}; use a smaller batch size."
        ) from None


def random_inputs(
    graph: Graph, stage: Stage, batch: int, dtype: torch.dtype, device: torch.device, layout: str | None = None,
) -> dict[str, torch.Tensor]:
    """Random tensors for every source a stage reads from outside itself, keyed by source id (4-D ones in ``layout``,
    the program's activation format, by default the graph's memory format: as the units before the stage would hand
    them over)."""
    inside = set(stage.units)
    sources = dict.fromkeys(s for u in stage.units for s in graph.unit(u).sources if s not in inside)
    return {s: in_memory_format(torch.randn((batch, *graph.shape_of(s)), dtype=dtype, device=device),
                                layout or graph.memory_format) for s in sources}

