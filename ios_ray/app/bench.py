"""``ios-ray bench`` and ``run``: execute a model eagerly and under schedules, measured side by side.

Side by side means interleaved rounds (:func:`~ios_ray.runtime.timing.interleaved_samples_ms`), so that a noisy
neighbour slows all variants alike. Each variant's output is checked against eager.
The predicted latency of a schedule (the sum of its stage latencies from the latency store, for the device
fingerprint and batch) is reported beside what was measured end to end.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from ios_ray.errors import UserError
from ios_ray.app.evaluation import Lookup, predicted_ms
from ios_ray.ir import Graph
from ios_ray.runtime import Program, ScheduleRunner, read_schedules
from ios_ray.runtime.timing import interleaved_samples_ms, summary_ms
from ios_ray.schedule import BlockSchedule, Schedule
from ios_ray.scheduler import greedy_stages, sequential_stages
from ios_ray.stage import StageKeys

Forward = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Variant:
    """One way of running the model: a name, its forward, and the schedule behind it (None for eager ones)."""

    name: str
    forward: Forward
    schedule: Schedule | None = None


@dataclass(frozen=True)
class BenchRow:
    """A variant's measured latency at one batch size, its speedup over eager, prediction and output error."""

    name: str
    batch: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    speedup: float
    predicted_ms: float | None
    error: float


def find_schedule(schedules_dir: Path, graph: Graph, device: str, batch: int) -> Schedule:
    """The IOS schedule for (device, batch) in a folder of schedules; UserError naming what to run where none is."""
    found = [s for s in read_schedules(schedules_dir).values()
             if s.graph_fingerprint == graph.fingerprint and s.device == device]
    if not found:
        raise UserError(f"no schedule of {graph.name} for device {device!r} under {schedules_dir}; run "
                        f"`ios-ray search --model {graph.name} --devices {device} --out {schedules_dir}` first.")
    exact = [s for s in found if s.batch == batch]
    return exact[0] if exact else min(found, key=lambda s: (s.batch < batch, abs(s.batch - batch)))


def baseline_schedule(graph: Graph, like: Schedule, name: str) -> Schedule:
    """The sequential or greedy schedule of a graph, labelled like another schedule (device, batch)."""
    make = {"sequential": sequential_stages, "greedy": greedy_stages}[name]
    blocks = tuple(BlockSchedule(b.index, make(graph, b)) for b in graph.blocks)
    return Schedule(like.model, graph.fingerprint, like.device, like.batch, blocks, like.dtype,
                    like.device_fingerprint, like.device_info, {"baseline": name}, like.source)


def side_by_side(
    variants: Sequence[Variant], x: torch.Tensor, warmup: int, rounds: int
) -> dict[str, tuple[float, float, float]]:
    """Median, p10 and p90 in ms of each variant, timed in interleaved rounds after ``warmup`` calls each (each
    timed call preceded by an untimed call of the same variant)."""
    calls = {v.name: functools.partial(v.forward, x) for v in variants}
    return {name: summary_ms(times) for name, times in interleaved_samples_ms(calls, x.device, warmup, rounds).items()}


def bench_rows(
    variants: Sequence[Variant], x: torch.Tensor, keys: StageKeys, lookup: Lookup | None,
    warmup: int = 3, rounds: int = 10,
) -> list[BenchRow]:
    """Time the variants side by side on ``x`` and check each output against the first (eager) variant."""
    with torch.inference_mode():
        expected = variants[0].forward(x)
        errors = {v.name: relative_error(v.forward(x), expected) for v in variants}
    timings = side_by_side(variants, x, warmup, rounds)
    eager = timings[variants[0].name][0]
    batch = x.shape[0]
    return [
        BenchRow(v.name, batch, *timings[v.name], eager / timings[v.name][0],
                 predicted_ms(v.schedule, keys, lookup, batch) if v.schedule is not None and lookup else None,
                 errors[v.name])
        for v in variants
    ]


def schedule_variants(program: Program, schedules: Mapping[str, Schedule]) -> list[Variant]:
    """A runner per named schedule (sequential, greedy, IOS...) on the program's device; on CUDA the IOS
    schedule is run both without and with a CUDA graph."""
    variants = [Variant(name, ScheduleRunner(program, s, program.device, cuda_graph=False), s)
                for name, s in schedules.items()]
    if program.device.type == "cuda" and "IOS" in schedules:
        variants.append(Variant("IOS + CUDA graph", ScheduleRunner(program, schedules["IOS"], program.device,
                                                                    cuda_graph=True), schedules["IOS"]))
    return variants


def compiled_variant(module: torch.nn.Module, x: torch.Tensor) -> Variant | str:
    """torch.compile of the module, or the one-line reason it is unavailable here."""
    try:
        compiled = torch.compile(module)
        with torch.inference_mode():
            compiled(x)
    except Exception as exc:  # noqa: BLE001 - any compiler failure is reported, not fatal
        text = str(exc).strip().splitlines()
        return f"torch.compile unavailable: {text[0] if text else type(exc).__name__}"
    return Variant("torch.compile", compiled)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|."""
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
