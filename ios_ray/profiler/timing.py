"""The profiler's timing of a stage: as deployed, with the device's default counts.

* On a CPU, call by call (:func:`ios_ray.runtime.timing.samples_ms`: a monotonic clock, each call primed by
  :func:`ios_ray.runtime.timing.cpu_primer`).
* On a GPU, inside a CUDA graph, as a deployed schedule runs (:func:`ios_ray.runtime.graph_timing.graph_samples_ms`:
  :data:`~ios_ray.profiler.protocol.STAGE_COPIES` copies per graph, replays timed with events). A stage that cannot
  be captured is timed call by call with CUDA events instead, and its Timing says why.

The protocol used (warmup and repeat counts) is recorded with every row; its name is part of the device
fingerprint (:mod:`~ios_ray.profiler.fingerprint`).
"""

from __future__ import annotations

from typing import Callable

import torch

from ios_ray.profiler.protocol import STAGE_COPIES, Timing, resolve_protocol
from ios_ray.runtime.cuda_graph import CaptureError
from ios_ray.runtime.graph_timing import graph_samples_ms
from ios_ray.runtime.timing import samples_ms


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
