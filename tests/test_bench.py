"""The pieces of ``bench`` around the variants: speedups over eager and over the sequential baseline, and a
compiler that fails becoming a note (the whole command on the CPU: tests/test_search_cli.py; on a GPU:
tests/test_bench_cuda.py)."""

from __future__ import annotations

import time

import pytest
import torch

from ios_ray.app.cli.bench import Variant, bench_rows, compile_modes_for, compiled_variants
from ios_ray.runtime.accuracy import FLOAT32_TOLERANCE, GPU_FLOAT32_TOLERANCE, TF32_TOLERANCE, output_tolerance
from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.stage import StageKeys
from tests.helpers import tf32


def sleeper(ms: float) -> Variant:
    """A variant that takes about ``ms`` and returns its input doubled."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        time.sleep(ms / 1e3)
        return x * 2

    return Variant(f"{ms:g} ms", forward)


def test_rows_give_speedups_with_intervals_over_eager_and_over_the_named_baseline(small_graph: Graph) -> None:
    eager, baseline, fast = sleeper(30), sleeper(20), sleeper(10)
    rows = bench_rows([eager, baseline, fast], torch.ones(2), StageKeys(small_graph), None, baseline="20 ms",
                      warmup=0, rounds=6)
    by_name = {row.name: row for row in rows}
    assert by_name["30 ms"].speedup == 1.0 and by_name["20 ms"].speedup_vs_sequential == 1.0
    assert by_name["10 ms"].speedup > by_name["10 ms"].speedup_vs_sequential > 1.2
    # six rounds give a 95% interval (the smallest and largest ratio), which a clear speedup clears
    fast_row = by_name["10 ms"]
    assert fast_row.confidence == 0.95 and len(fast_row.samples_ms) == 6
    assert 1.2 < fast_row.vs_sequential_low <= fast_row.speedup_vs_sequential <= fast_row.vs_sequential_high
    ratios = sorted(e / f for e, f in zip(by_name["30 ms"].samples_ms, fast_row.samples_ms))
    assert (fast_row.speedup_low, fast_row.speedup_high) == (ratios[0], ratios[-1])
    assert all(row.error == 0.0 and row.predicted_ms is None for row in rows)
    unnamed = bench_rows([eager, fast], torch.ones(2), StageKeys(small_graph), None, warmup=0, rounds=1)
    assert [row.speedup_vs_sequential for row in unnamed] == [None, None]
    assert unnamed[1].speedup_low is None  # one round gives no interval


def test_a_compiler_that_fails_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore detail")

    monkeypatch.setattr(torch, "compile", broken)
    variants, notes = compiled_variants(torch.nn.Linear(2, 2), torch.ones(1, 2))
    assert variants == [] and notes == ["torch.compile unavailable: InvalidCxxCompiler: No working C++ compiler found"]


def test_compile_modes_are_the_devices_own_or_the_one_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compile_modes_for("cuda") == ("default", "reduce-overhead")
    assert compile_modes_for("cuda", "reduce-overhead") == ("reduce-overhead",)
    assert compile_modes_for("cpu") == ("default",)
    with pytest.raises(UserError, match="mode must be one of default on cpu, not 'reduce-overhead'"):
        compile_modes_for("cpu", "reduce-overhead")
    asked: list[object] = []

    def compile_(module: torch.nn.Module, mode: object = None, dynamic: object = None) -> torch.nn.Module:
        asked.append(mode)
        return module

    monkeypatch.setattr(torch, "compile", compile_)
    variants, notes = compiled_variants(torch.nn.Linear(2, 2), torch.ones(1, 2), ("default",))
    assert [v.name for v in variants] == ["torch.compile"] and asked == [None] and notes == []



def test_every_batch_size_is_compiled_afresh_not_run_eagerly_past_dynamos_recompile_limit(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        compiled.append(gm)
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, mode=None, dynamic=None: real_compile(
        module, backend=backend, dynamic=dynamic))
    module = torch.nn.Linear(2, 2)
    for batch in range(1, 11):  # more than Dynamo's limit of 8 entries per frame
        compiled_variants(module, torch.ones(batch, 2), ("default",))
    assert len(compiled) == 10  # one compile per batch size, none left to run eagerly


def test_outputs_are_held_to_float32_unless_a_gpu_may_compute_in_tf32() -> None:
    with tf32(conv=True, matmul=False):
        assert output_tolerance(torch.device("cpu")) == FLOAT32_TOLERANCE
        assert output_tolerance(torch.device("cuda", 0)) == TF32_TOLERANCE  # torch's default for cuDNN convolutions
    with tf32(conv=False, matmul=False):
        assert output_tolerance(torch.device("cuda", 0)) == GPU_FLOAT32_TOLERANCE
    assert FLOAT32_TOLERANCE < GPU_FLOAT32_TOLERANCE < TF32_TOLERANCE <= 1e-2  # a wrong schedule is off by far more
