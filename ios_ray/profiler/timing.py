"""The profiler's timing of a stage: as deployed, with the device's default counts.

* On a CPU, call by call (:func:`ios_ray.runtime.timing.samples_ms`: a monotonic clock, each call primed by
  :func:`ios_ray.runtime.timing.cpu_primer`).
* On a GPU, inside a CUDA graph, as a deployed schedule runs (:func:`ios_ray.runtime.timing.graph_samples_ms`:
  :data:`STAGE_COPIES` copies per graph, replays timed with events). A stage that cannot
  be captured is timed call by call with CUDA events instead, and its Timing says why.

The protocol (:data:`DEFAULT_PROTOCOL`: warmup and repeat counts) is recorded with every row (:class:`Timing`); its name is part of the device
fingerprint (:mod:`~ios_ray.profiler.fingerprint`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ios_ray.runtime.cuda_graph import CaptureError
from ios_ray.runtime.timing import graph_samples_ms, samples_ms, summary_ms

#: Default (warmup, repeat) per way of timing: ``cpu`` and ``gpu`` count calls (``gpu``: a GPU stage that cannot be
#: captured, and what the sim model sleeps for), ``graph`` counts replays of a CUDA graph of the stage.
DEFAULT_PROTOCOL: dict[str, tuple[int, int]] = {"cpu": (3, 10), "gpu": (10, 30), "graph": (3, 10)}

#: Calls of a stage captured into one CUDA graph: a replay's own start-up cost on the device is spread over them.
STAGE_COPIES = 8


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
