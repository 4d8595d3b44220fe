"""``bench`` on a GPU: every baseline a schedule must beat there, run side by side, each output equal to eager.

Skipped without CUDA (the CPU variants are tested through the CLI in tests/test_search_cli.py). TF32 is turned off
so that fp32 outputs compare at ``GPU_FLOAT32_TOLERANCE``, as ``ios-ray run`` holds them; torch.compile is left out
(it compiles for minutes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch

from ios_ray.app.cli.bench import bench_model
from ios_ray.runtime.accuracy import GPU_FLOAT32_TOLERANCE
from ios_ray.frontend import import_module
from ios_ray.schedule import save_schedule
from tests.helpers import tf32
from tests.test_runtime_schedules import BUILDERS, Tiny, make_schedule, tiny

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(autouse=True)
def exact_fp32() -> Iterator[None]:
    with tf32(conv=False, matmul=False):
        yield


def test_bench_runs_every_gpu_baseline_side_by_side(tmp_path: Path) -> None:
    module = tiny().cuda()
    graph = import_module(module, torch.randn(1, *Tiny.input_shape, device="cuda"), "tiny").graph
    for batch in (1, 4):
        schedule = make_schedule(graph, BUILDERS["ios_like"], batch, device="cuda", model="tiny")
        save_schedule(schedule, tmp_path / "tiny" / "cuda" / f"bs{batch}.json")
    results = list(bench_model(module, "tiny", Tiny.input_shape, "cuda", torch.device("cuda"), [1, 4], tmp_path,
                               None, rounds=3, compile_modes=()))
    assert [r.batch for r in results] == [1, 4]
    for result in results:
        rows = {row.name: row for row in result.rows}
        assert list(rows) == ["eager", "eager + graph", "sequential + graph", "greedy + graph", "IOS", "IOS + graph"]
        assert result.baseline == "sequential + graph" and rows["sequential + graph"].speedup_vs_sequential == 1.0
        assert rows["eager"].speedup == 1.0 and result.notes == ("torch.compile skipped (--no-compile)",)
        for row in rows.values():
            assert 0 < row.p10_ms <= row.median_ms <= row.p90_ms and row.error <= GPU_FLOAT32_TOLERANCE


def test_bench_names_the_schedules_for_their_fused_kernels(tmp_path: Path) -> None:
    module = tiny().cuda()
    graph = import_module(module, torch.randn(1, *Tiny.input_shape, device="cuda"), "tiny").graph
    schedule = make_schedule(graph, BUILDERS["ios_like"], 2, device="cuda", model="tiny", kernels="fused")
    save_schedule(schedule, tmp_path / "tiny" / "cuda" / "bs2.json")
    [result] = bench_model(module, "tiny", Tiny.input_shape, "cuda", torch.device("cuda"), [2], tmp_path, None,
                           rounds=3, compile_modes=())
    rows = {row.name: row for row in result.rows}
    assert list(rows) == ["eager", "eager + graph", "sequential fused + graph", "greedy fused + graph", "IOS fused",
                          "IOS fused + graph"]
    assert result.baseline == "sequential fused + graph"
    assert all(row.error <= GPU_FLOAT32_TOLERANCE for row in rows.values())
