"""What a stage's timing is, and the counts it is taken with: plain data, free of torch, so that an actor of a
simulated device (:mod:`~ios_ray.profiler.sim_backend`) starts without loading it. How a real device's stages are
timed is :mod:`~ios_ray.profiler.timing`."""

from __future__ import annotations

from dataclasses import dataclass

from ios_ray.paired import summary_ms

#: Default (warmup, repeat) per way of timing: ``cpu`` and ``gpu`` count calls (``gpu``: a GPU stage that cannot be
#: captured, and what the sim model sleeps for), ``graph`` counts replays of a CUDA graph of the stage.
DEFAULT_PROTOCOL: dict[str, tuple[int, int]] = {"cpu": (3, 10), "gpu": (10, 30), "graph": (3, 10)}


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
