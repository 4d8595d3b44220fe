"""The profiler's timing of stages: as deployed, with the device's default counts.

* On a CPU, call by call (:func:`ios_ray.runtime.timing.samples_ms`: a monotonic clock, each call primed by
  :func:`ios_ray.runtime.timing.cpu_primer`).
* On a GPU, inside CUDA graphs, as a deployed schedule runs: up to :data:`GRAPH_STAGES` stages of a batch in one
  graph, :data:`BATCH_COPIES` calls each between timing events inside it, replayed until their samples are tight
  (:func:`ios_ray.runtime.timing.graph_batch_samples_ms`; protocol ``graph-batch``). A batch that cannot be captured
  is timed stage by stage in graphs of one, and a stage that cannot be captured is timed call by call with CUDA
  events instead, its Timing saying why. Where this torch records no events inside a graph (before
  ``torch.cuda.Event(external=True)``), each stage gets a graph of its own (:func:`time_stage`, protocol ``graph``).

The protocol (:data:`DEFAULT_PROTOCOL`: warmup and repeat counts) is recorded with every row (:class:`Timing`); its
name (:func:`gpu_protocol`) is part of the device fingerprint (:mod:`~ios_ray.profiler.fingerprint`), so rows timed
one way are never reused by searches that time another.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ios_ray.runtime.cuda_graph import CaptureError
from ios_ray.runtime.timing import graph_batch_samples_ms, graph_samples_ms, samples_ms, summary_ms

#: Default (warmup, repeat) per way of timing: ``cpu`` and ``gpu`` count calls (``gpu``: a GPU stage that cannot be
#: captured, and what the sim model sleeps for), ``graph`` counts replays of a CUDA graph of the stage.
DEFAULT_PROTOCOL: dict[str, tuple[int, int]] = {"cpu": (3, 10), "gpu": (10, 30), "graph": (3, 10)}

#: Calls of a stage captured into one CUDA graph: a replay's own start-up cost on the device is spread over them.
STAGE_COPIES = 8
#: In the batched protocol: the most stages captured into one graph, and the calls of each between its events.
GRAPH_STAGES = 16
BATCH_COPIES = 2


#: Whether this torch records timing events inside CUDA graphs (``torch.cuda.Event(external=True)``), which the
#: batched protocol needs.
BATCHED_GRAPHS = "external" in inspect.signature(torch.cuda.Event.__new__).parameters


def gpu_protocol() -> str:
    """The name of the GPU timing protocol this process uses (part of a GPU's fingerprint)."""
    return f"graph-batch{GRAPH_STAGES}-x{BATCH_COPIES}-2" if BATCHED_GRAPHS else f"graph-x{STAGE_COPIES}-2"


def resolve_protocol(kind: str, warmup: int | None, repeat: int | None) -> tuple[int, int]:
    """(warmup, repeat) for a way of timing (a key of :data:`DEFAULT_PROTOCOL`), its defaults filled in where None;
    rejects repeat < 1 or warmup < 0."""
    default_warmup, default_repeat = DEFAULT_PROTOCOL[kind]
    warmup = default_warmup if warmup is None else warmup
    repeat = default_repeat if repeat is None else repeat
    if repeat < 1 or warmup < 0:
        raise ValueError(f"need repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
    return warmup, repeat


@dataclass(frozen=True)
class Timing:
    """The result of timing one stage: summary statistics in ms, how many samples they summarise, the protocol,
    and, for a GPU stage that could not be captured into a CUDA graph, why (it was then timed call by call)."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    samples: int
    warmup: int
    repeat: int
    uncaptured: str | None = None

    @staticmethod
    def of_samples(samples: list[float], warmup: int, uncaptured: str | None = None) -> "Timing":
        """Summarise samples (ms) taken after ``warmup`` untimed runs."""
        if not samples:
            raise ValueError("a timing needs at least one sample")
        median, p10, p90 = summary_ms(samples)
        return Timing(
            median_ms=median,
            p10_ms=p10,
            p90_ms=p90,
            samples=len(samples),
            warmup=warmup,
            repeat=len(samples),
            uncaptured=uncaptured,
        )


def time_callable(
    fn: Callable[[], object], device: torch.device | str, warmup: int | None = None, repeat: int | None = None,
    before: Callable[[], object] | None = None,
) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` times timed one by one (None: the device's default);
    ``before`` runs untimed before every call."""
    device = torch.device(device)
    warmup, repeat = resolve_protocol("gpu" if device.type == "cuda" else "cpu", warmup, repeat)
    return Timing.of_samples(samples_ms(fn, device, warmup, repeat, before), warmup)


def time_stage(
    fn: Callable[[], object], device: torch.device | str, warmup: int | None = None, repeat: int | None = None,
    before: Callable[[], object] | None = None, stream: torch.cuda.Stream | None = None,
) -> Timing:
    """Time a compiled stage as deployed: call by call on a CPU (``before`` untimed before each call); on a GPU
    captured into a CUDA graph on ``stream`` (the caller's capture stream, kept for all its stages) and replayed,
    or call by call where it cannot be captured."""
    device = torch.device(device)
    if device.type != "cuda":
        return time_callable(fn, device, warmup, repeat, before)
    warmup, repeat = resolve_protocol("graph", warmup, repeat)
    try:
        return Timing.of_samples(graph_samples_ms(fn, stream or torch.cuda.Stream(device), warmup, repeat,
                                                  STAGE_COPIES), warmup)
    except CaptureError as exc:
        return Timing.of_samples(samples_ms(fn, device, warmup, repeat), warmup, uncaptured=str(exc))


def time_stages(
    fns: Sequence[Callable[[], object]], device: torch.device | str, warmup: int | None = None,
    repeat: int | None = None, before: Callable[[], object] | None = None, stream: torch.cuda.Stream | None = None,
) -> list[Timing]:
    """Time compiled stages as deployed, one Timing each: call by call on a CPU (``before`` untimed before each
    call); on a GPU batched into CUDA graphs on ``stream`` (``repeat``: the most replays), a batch that cannot be
    captured stage by stage, where this torch allows it; else each as :func:`time_stage` does."""
    device = torch.device(device)
    if device.type != "cuda" or not BATCHED_GRAPHS:
        return [time_stage(fn, device, warmup, repeat, before, stream) for fn in fns]
    warmup, repeat = resolve_protocol("graph", warmup, repeat)
    stream = stream or torch.cuda.Stream(device)
    timings: list[Timing] = []
    for start in range(0, len(fns), GRAPH_STAGES):
        batch = fns[start:start + GRAPH_STAGES]
        try:
            found = graph_batch_samples_ms(batch, stream, warmup, repeat, BATCH_COPIES)
        except CaptureError:
            timings += [_alone(fn, device, warmup, repeat, stream) for fn in batch]
            continue
        timings += [Timing.of_samples(samples, warmup) for samples in found]
    return timings


def _alone(fn: Callable[[], object], device: torch.device, warmup: int, repeat: int, stream: torch.cuda.Stream
           ) -> Timing:
    """A stage of a batch that could not be captured, timed in a graph of its own with the same protocol, or call by
    call where it cannot be captured itself (saying why)."""
    try:
        return Timing.of_samples(graph_batch_samples_ms([fn], stream, warmup, repeat, BATCH_COPIES)[0], warmup)
    except CaptureError as exc:
        return Timing.of_samples(samples_ms(fn, device, warmup, repeat), warmup, uncaptured=str(exc))
