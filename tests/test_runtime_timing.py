"""The runtime's latency helper: median, p10 and p90 of timed calls."""

from __future__ import annotations

import time

import pytest
import torch

from ios_ray.runtime import measure_latency


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
