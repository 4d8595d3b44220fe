"""The profiler's timing of stages: as deployed, with the device's default counts.

* On a CPU, call by call (:func:`ios_ray.runtime.timing.samples_ms`: a monotonic clock, each call primed by
  :func:`ios_ray.runtime.timing.cpu_primer`).
* On a GPU, inside CUDA graphs, as a deployed schedule runs: up to :data:`GRAPH_STAGES` stages of a batch in one
  graph, :data:`BATCH_COPIES` calls each between timing events inside it, replayed until their samples are tight
  (:func:`ios_ray.runtime.timing.graph_batch_samples_ms`; protocol ``graph-batch``). A batch that cannot be captured
  is timed stage by stage in graphs of one, and a stage that cannot be captured is timed call by call with CUDA
  events instead, its Timing saying why. Where this torch records no events inside a graph (before
  ``torch.cuda.Event(external=True)``), each stage gets a graph of its own (:func:`time_stage`, protocol ``graph``).

The protocol (:data:`~ios_ray.profiler.protocol.DEFAULT_PROTOCOL`: warmup and repeat counts) is recorded with every
row (:class:`~ios_ray.profiler.protocol.Timing`); its name (:func:`gpu_protocol`) is part of the device fingerprint
(:mod:`~ios_ray.profiler.fingerprint`), so rows timed one way are never reused by searches that time another.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import torch

from ios_ray.profiler.protocol import Timing, resolve_protocol
from ios_ray.runtime.cuda_graph import CaptureError
from ios_ray.runtime.timing import graph_batch_samples_ms, graph_samples_ms, samples_ms

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
