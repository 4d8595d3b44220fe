"""``ios-ray bench`` and ``run``: execute a model eagerly, under schedules and compiled, measured side by side.

Side by side means interleaved rounds (:func:`~ios_ray.runtime.timing.interleaved_samples_ms`), so that a noisy
neighbour slows all variants alike. Each variant's output is checked against eager. The predicted latency of a
schedule (the sum of its stage latencies from the latency store, for the device fingerprint and batch) is reported
beside what was measured end to end.

The variants are the baselines a schedule must beat where it is deployed. On a CPU: eager, the sequential, greedy
and IOS schedules, and ``torch.compile``. On a GPU, where launching kernels from the host costs more than running
small ones, the fair baseline is sequential execution without launch overhead: eager, eager captured whole in a
CUDA graph, the sequential and greedy schedules in a graph, the IOS schedule without and with a graph, and
``torch.compile`` (default and ``mode="reduce-overhead"``, which replays CUDA graphs). The schedules run with the
kernels the IOS schedule was searched with, which their names carry where they are not eager (``IOS fused``).
Every row gives its speedup over eager and over the sequential schedule as deployed (:func:`sequential_baseline`),
each the median of the per-round ratios with its interval (:func:`~ios_ray.paired.median_interval`; rounds pair the
variants' samples), and its samples, so that any two rows give a paired speedup.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from ios_ray.app.cli.evaluation import predicted_ms
from ios_ray.app.cli.util import search_command
from ios_ray.app.search.budgets import Lookup
from ios_ray.dtypes import example_input, in_memory_format, module_dtype, torch_dtype
from ios_ray.errors import UserError, first_line
from ios_ray.frontend import Imported, import_module, output_tensor
from ios_ray.ir import Graph
from ios_ray.paired import median_interval, ratios_of, summary_ms
from ios_ray.vocabulary import DEFAULT_DTYPE, EAGER_KERNELS, kernel_named, spelt_shape
from ios_ray.runtime import Program, Programs, ScheduleRunner, read_schedules
from ios_ray.runtime.accuracy import relative_error
from ios_ray.runtime.cuda_graph import CapturedForward
from ios_ray.runtime.schedule_set import other_input_shapes, pick_batch, why_none_fit
from ios_ray.runtime.timing import interleaved_samples_ms
from ios_ray.schedule import Schedule
from ios_ray.scheduler import baseline_schedule
from ios_ray.stage import StageKeys

Forward = Callable[[torch.Tensor], torch.Tensor]

#: The ``torch.compile`` modes per device type: mode -> the name of its variant.
COMPILE_MODES: dict[str, dict[str, str]] = {
    "cpu": {"default": "torch.compile"},
    "cuda": {"default": "torch.compile", "reduce-overhead": "torch.compile reduce-overhead"},
}


@dataclass(frozen=True)
class Variant:
    """One way of running the model: a name, its forward, and the schedule behind it (None for eager ones)."""

    name: str
    forward: Forward
    schedule: Schedule | None = None


@dataclass(frozen=True)
class BenchRow:
    """A variant's measured latency at one batch size, its speedups over eager and over the sequential baseline
    (medians of per-round ratios, with their interval at ``confidence``), its prediction, its output error against
    eager, and its per-round samples."""

    name: str
    batch: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    speedup: float
    speedup_low: float | None
    speedup_high: float | None
    speedup_vs_sequential: float | None
    vs_sequential_low: float | None
    vs_sequential_high: float | None
    confidence: float
    predicted_ms: float | None
    error: float
    samples_ms: tuple[float, ...]


@dataclass(frozen=True)
class BenchResult:
    """One model's variants timed side by side at one batch size, with the IOS schedule they ran and the notes
    (a variant unavailable here, say)."""

    model: str
    device: str
    batch: int
    schedule: Schedule
    baseline: str
    rows: tuple[BenchRow, ...]
    notes: tuple[str, ...]

    @property
    def title(self) -> str:
        """One line naming the setting, and saying where the search kept the sequential schedule."""
        title = f"{self.model} on {self.device}, batch {self.batch} (IOS schedule made for batch "
        title += f"{self.schedule.batch})"
        check = self.schedule.end_to_end
        if check is not None and check.kept == "sequential":
            title += f"; the search {check.decision}"
        return title


def bench_model(
    module: nn.Module, name: str, input_shape: Sequence[int], device: str, target: torch.device,
    batches: Sequence[int], schedules_dir: Path, lookup: Lookup | None, rounds: int = 10,
    compile_modes: Sequence[str] | None = None,
) -> Iterator[BenchResult]:
    """Time every variant of ``module`` (on ``target``, in its dtype and memory format, with the schedules of device
    label ``device``, that dtype and that format found under ``schedules_dir``) side by side at each batch size; one
    result per batch, as soon as it is measured. ``compile_modes`` are the ``torch.compile`` modes to include (None:
    every mode the device has; none: no ``torch.compile``)."""
    imported = import_module(module, example_input(module, input_shape), name)
    programs = Programs(imported)
    keys, dtype = StageKeys(imported.graph), module_dtype(module)
    modes = compile_modes_for(target.type) if compile_modes is None else compile_modes
    for batch in batches:
        ios = find_schedule(schedules_dir, imported.graph, device, batch, dtype)
        named = {kernel_named(name, ios.kernels): schedule for name, schedule in (
            ("sequential", baseline_schedule(imported.graph, "sequential", ios)),
            ("greedy", baseline_schedule(imported.graph, "greedy", ios)), ("IOS", ios))}
        x = in_memory_format(torch.randn(batch, *input_shape, device=target, dtype=torch_dtype(dtype)),
                             imported.graph.memory_format)
        variants = [*eager_variants(module, target, imported),
                    *schedule_variants(programs(target, ios.kernels), named)]
        skipped: tuple[list[Variant], list[str]] = ([], ["torch.compile skipped (--no-compile)"])
        compiled, notes = compiled_variants(module, x, modes, imported) if modes else skipped
        baseline = sequential_baseline(target.type, ios.kernels)
        rows = bench_rows([*variants, *compiled], x, keys, lookup, baseline, rounds=rounds)
        yield BenchResult(name, device, batch, ios, baseline, tuple(rows), tuple(notes))


def sequential_baseline(device_type: str, kernels: str = EAGER_KERNELS) -> str:
    """The name of the variant every speedup is also given against on a device type: the sequential schedule as
    deployed there, with the kernels of the schedule benched (``sequential fused + graph``)."""
    return kernel_named("sequential", kernels) + (" + graph" if device_type == "cuda" else "")


def find_schedule(schedules_dir: Path, graph: Graph, device: str, batch: int, dtype: str = DEFAULT_DTYPE) -> Schedule:
    """The IOS schedule for (device, batch, dtype) in a folder of schedules; UserError naming what to run where none
    is."""
    here = [s for s in read_schedules(schedules_dir).values() if s.device == device and s.dtype == dtype]
    found = [s for s in here if s.graph_fingerprint == graph.fingerprint]
    if not found:
        mine = [s for s in here if s.model == graph.name]
        shape = spelt_shape(graph.input_shape) if other_input_shapes(mine, graph) else None
        search = search_command(graph.name, device, dtype=dtype, memory_format=graph.memory_format, input_shape=shape,
                                out=schedules_dir)
        raise UserError(f"no {dtype} schedule of {graph.name} for device {device!r} under {schedules_dir}"
                        f"{why_none_fit(mine, graph) if mine else ''}; run `{search}` first.")
    chosen = pick_batch((s.batch for s in found), batch)
    return next(s for s in found if s.batch == chosen)


def eager_variants(module: nn.Module, device: torch.device, imported: Imported | None = None) -> list[Variant]:
    """Eager; on a GPU also eager captured whole into a CUDA graph. (Each returns the tensor that ``imported``'s
    graph computes, where the module returns it in a dict, tuple or list.)"""
    forward = tensor_forward(module, imported)
    variants = [Variant("eager", forward)]
    if device.type == "cuda":
        variants.append(Variant("eager + graph", CapturedForward(forward, device)))
    return variants


def tensor_forward(module: Forward, imported: Imported | None) -> Forward:
    """``module`` itself where it returns a tensor, else a call of it that returns the tensor of its output."""
    if imported is None or imported.output.bare:
        return module
    return lambda x: output_tensor(module(x))


def schedule_variants(program: Program, schedules: Mapping[str, Schedule]) -> list[Variant]:
    """A runner per named schedule (sequential, greedy, IOS...) on the program's device. On a CPU each runs as
    deployed there; on a GPU each runs in a CUDA graph, as deployed (``<name> + graph``), and the IOS schedule also
    without one."""
    device = program.device
    if device.type != "cuda":
        return [Variant(name, ScheduleRunner(program, s, device, cuda_graph=False), s) for name, s in schedules.items()]
    variants = []
    for name, schedule in schedules.items():
        if name.startswith("IOS"):
            variants.append(Variant(name, ScheduleRunner(program, schedule, device, cuda_graph=False), schedule))
        graphed = ScheduleRunner(program, schedule, device, cuda_graph=True)
        variants.append(Variant(f"{name} + graph", graphed, schedule))
    return variants


def compile_modes_for(device_type: str, only: str | None = None) -> tuple[str, ...]:
    """The ``torch.compile`` modes to bench on a device type: each of :data:`COMPILE_MODES` it has, or ``only``;
    UserError where it has no such mode."""
    modes = tuple(COMPILE_MODES[device_type])
    if only is None:
        return modes
    if only not in modes:
        raise UserError(f"the torch.compile mode must be one of {', '.join(modes)} on {device_type}, not {only!r}.")
    return (only,)


def compiled_variants(
    module: nn.Module, x: torch.Tensor, modes: Sequence[str] | None = None, imported: Imported | None = None,
) -> tuple[list[Variant], list[str]]:
    """``torch.compile`` of the module in each of ``modes`` (default: every mode of :data:`COMPILE_MODES` for
    ``x``'s device), compiled for ``x``'s shape by one call, and one note per mode that is unavailable here (each
    returning a tensor as :func:`tensor_forward` does)."""
    variants, notes = [], []
    # each batch size and mode adds an entry to Dynamo's cache of the module's forward; past its recompile limit (8)
    # Dynamo runs the forward eagerly, saying so in a log line only, so the rows would time eager under this name
    torch._dynamo.reset()
    for mode in compile_modes_for(x.device.type) if modes is None else modes:
        name = COMPILE_MODES[x.device.type][mode]
        try:
            compiled = torch.compile(module, mode=None if mode == "default" else mode, dynamic=False)
            with torch.inference_mode():
                compiled(x)
        except Exception as exc:  # noqa: BLE001 - any compiler failure is reported, not fatal
            notes.append(f"{name} unavailable: {first_line(exc)}")
            continue
        variants.append(Variant(name, tensor_forward(compiled, imported)))
    return variants, notes


def bench_rows(
    variants: Sequence[Variant], x: torch.Tensor, keys: StageKeys, lookup: Lookup | None, baseline: str | None = None,
    warmup: int = 3, rounds: int = 10,
) -> list[BenchRow]:
    """Time the variants side by side on ``x`` and check each output against the first (eager) variant; speedups
    are over the first variant and over the one named ``baseline`` (where present)."""
    with torch.inference_mode():
        expected = variants[0].forward(x)
        errors = {v.name: relative_error(v.forward(x), expected) for v in variants}
    samples = side_by_side(variants, x, warmup, rounds)
    eager = samples[variants[0].name]
    reference = samples.get(baseline) if baseline is not None else None
    batch = x.shape[0]
    rows = []
    for v in variants:
        own = samples[v.name]
        speedup = median_interval(ratios_of(eager, own))
        versus = median_interval(ratios_of(reference, own)) if reference is not None else None
        rows.append(BenchRow(
            v.name, batch, *summary_ms(own), speedup.median, speedup.low, speedup.high,
            None if versus is None else versus.median, None if versus is None else versus.low,
            None if versus is None else versus.high, speedup.confidence,
            predicted_ms(v.schedule, keys, lookup, batch) if v.schedule is not None and lookup else None,
            errors[v.name], tuple(own)))
    return rows


def side_by_side(variants: Sequence[Variant], x: torch.Tensor, warmup: int, rounds: int) -> dict[str, list[float]]:
    """Each variant's ms per round, timed in interleaved rounds (:func:`~ios_ray.runtime.timing.alternating_rounds`)
    after ``warmup`` calls each."""
    calls = {v.name: functools.partial(v.forward, x) for v in variants}
    return interleaved_samples_ms(calls, x.device, warmup, rounds)
