"""The runtime's latency helper: median, p10 and p90 of timed calls."""

from __future__ import annotations

import time

import pytest
import torch

from ios_ray.profiler.fingerprint import CPU_TIMING, cpu_info
from ios_ray.runtime import measure_latency
from ios_ray.runtime.timing import cpu_primer, interleaved_samples_ms, samples_ms


def test_measure_latency_orders_its_percentiles_and_counts_calls() -> None:
    calls: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        time.sleep(0.001)
        return x + 1

    median, p10, p90 = measure_latency(fn, torch.randn(2, 3), warmup=2, repeat=7, device="cpu")
    assert len(calls) == 9
    assert 1.0 <= p10 <= median <= p90


def test_measure_latency_rejects_an_empty_protocol() -> None:
    with pytest.raises(ValueError, match="repeat >= 1"):
        measure_latency(lambda x: x, torch.randn(1), warmup=0, repeat=0, device="cpu")


def test_samples_run_the_primer_untimed_before_every_call() -> None:
    calls: list[str] = []
    samples = samples_ms(lambda: calls.append("fn"), "cpu", warmup=2, repeat=3,
                         before=lambda: (calls.append("before"), time.sleep(0.02)))
    assert calls == ["before", "fn"] * 5
    assert len(samples) == 3 and max(samples) < 15  # the 20 ms sleeps before each call are not in the samples


def test_interleaved_samples_alternate_their_order_and_rewarm() -> None:
    calls: list[str] = []
    samples = interleaved_samples_ms({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"),
                                      "c": lambda: calls.append("c")}, "cpu", warmup=1, rounds=3)
    # warm-up; then c b a | a b c | c b a: each timed call follows an untimed one of its own, or its own timed call
    assert calls == ["a", "b", "c"] + ["c", "b", "b", "a", "a"] + ["a", "b", "b", "c", "c"] + ["c", "b", "b", "a", "a"]
    assert {name: len(times) for name, times in samples.items()} == {"a": 3, "b": 3, "c": 3}
    with pytest.raises(ValueError):
        interleaved_samples_ms({"a": lambda: None}, "cpu", warmup=0, rounds=0)


def test_the_cpu_primer_runs_a_parallel_op_and_the_cpu_fingerprint_names_the_protocol() -> None:
    assert tuple(cpu_primer()().shape) == (1, 32, 28, 28)
    assert cpu_info()["timing"] == CPU_TIMING
