"""The timing protocol's numbers: default warmup and repeat counts, and the Timing summary of a stage's samples."""

from __future__ import annotations

from dataclasses import dataclass

from ios_ray.runtime.timing import summary_ms

#: Default (warmup, repeat) for CPUs and GPUs (real or simulated); GPU stages are short and noisier.
DEFAULT_PROTOCOL: dict[str, tuple[int, int]] = {"cpu": (3, 10), "gpu": (10, 30)}


def resolve_protocol(on_gpu: bool, warmup: int | None, repeat: int | None) -> tuple[int, int]:
    """(warmup, repeat) with the device's defaults filled in where None; rejects repeat < 1 or warmup < 0."""
    default_warmup, default_repeat = DEFAULT_PROTOCOL["gpu" if on_gpu else "cpu"]
    warmup = default_warmup if warmup is None else warmup
    repeat = default_repeat if repeat is None else repeat
    if repeat < 1 or warmup < 0:
        raise ValueError(f"need repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
    return warmup, repeat


@dataclass(frozen=True)
class Timing:
    """The result of timing one stage: summary statistics in ms, how many samples they summarise, the protocol."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    samples: int
    warmup: int
    repeat: int

    @staticmethod
    def of_samples(samples: list[float], warmup: int) -> "Timing":
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
        )

