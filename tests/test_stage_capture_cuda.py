"""Stage timing inside CUDA graphs on a real GPU: every kind of stage captures, timings are device time (not launch
time), graph memory is released after each stage, an uncapturable stage is timed uncaptured and says so, and the
real backend's rows and fingerprint name the protocol. Skipped without CUDA; the control flow is also tested
without a GPU in tests/test_stage_capture.py.
"""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from ios_ray.devices import parse_device
from ios_ray.frontend import import_model, import_module
from ios_ray.profiler.jobs import MeasureJob
from ios_ray.profiler.real import RealBackend, random_inputs
from ios_ray.profiler.timing import gpu_protocol, time_stage
from ios_ray.runtime import Program, compile_stage, make_lanes
from ios_ray.runtime.timing import LEAST_REPLAYS, graph_batch_samples_ms, graph_samples_ms
from ios_ray.runtime.stages import InlineStage, MergeStage, ParallelStage
from ios_ray.runtime.timing import samples_ms
from ios_ray.stage import Stage, StageKeys
from tests.helpers import spec_source
from tests.test_runtime_schedules import BUILDERS, Tiny, make_schedule, tiny

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def program() -> Program:
    return Program.from_imported(import_module(tiny(), torch.randn(1, *Tiny.input_shape)), CUDA)


@pytest.fixture(scope="module")
def stages(program: Program) -> dict[str, tuple[Stage, object]]:
    """One compiled stage of each kind (inline, parallel on side streams, merge), with random inputs at batch 1."""
    lanes = make_lanes(CUDA)
    found: dict[str, tuple[Stage, object]] = {}
    kinds = {InlineStage: "inline", ParallelStage: "parallel", MergeStage: "merge"}
    for stage in make_schedule(program.graph, BUILDERS["ios_like"], 1).stages:
        compiled = compile_stage(program, stage, CUDA, lanes)
        env = random_inputs(program.graph, stage, 1, torch.float32, CUDA)
        found.setdefault(kinds[type(compiled)], (stage, lambda compiled=compiled, env=env: compiled(env)))
    assert set(found) == {"inline", "parallel", "merge"}
    return found


@pytest.mark.parametrize("kind", ["inline", "parallel", "merge"])
def test_every_kind_of_stage_is_captured_and_timed(stages: dict, kind: str) -> None:
    _, run = stages[kind]
    timing = time_stage(run, CUDA, warmup=2, repeat=5, stream=torch.cuda.Stream(CUDA))
    assert timing.uncaptured is None and timing.samples == 5
    assert 0 < timing.p10_ms <= timing.median_ms <= timing.p90_ms < 50


def test_captured_timing_leaves_out_the_hosts_launches(stages: dict) -> None:
    _, run = stages["parallel"]
    captured = statistics.median(graph_samples_ms(run, torch.cuda.Stream(CUDA), 3, 20, 8))
    eager = statistics.median(samples_ms(run, CUDA, 3, 20))
    assert captured < eager  # tiny kernels at batch 1: eager timing is mostly the host launching them


def test_graph_memory_is_released_after_each_stage(stages: dict) -> None:
    _, run = stages["merge"]
    stream = torch.cuda.Stream(CUDA)
    graph_samples_ms(run, stream, 1, 2, 8)
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(CUDA), torch.cuda.memory_reserved(CUDA)
    for _ in range(10):
        graph_samples_ms(run, stream, 1, 2, 8)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(CUDA) == allocated
    assert torch.cuda.memory_reserved(CUDA) <= reserved + (2 << 20)


def test_an_uncapturable_stage_is_timed_uncaptured_and_capture_works_after_it(stages: dict) -> None:
    x = torch.randn(64, device=CUDA)
    stream = torch.cuda.Stream(CUDA)
    caller = torch.cuda.current_stream(CUDA)
    timing = time_stage(lambda: x.sum().item(), CUDA, warmup=1, repeat=3, stream=stream)
    assert timing.uncaptured and timing.samples == 3 and timing.median_ms > 0
    assert torch.cuda.current_stream(CUDA) == caller
    _, run = stages["inline"]
    assert time_stage(run, CUDA, warmup=1, repeat=3, stream=stream).uncaptured is None


def test_the_real_backend_times_gpu_stages_in_graphs_and_names_the_protocol() -> None:
    graph = import_model("squeezenet").graph
    stage = Stage("concurrent", (("fire2.expand1x1",), ("fire2.expand3x3",)))  # two groups on side streams
    keys = StageKeys(graph)
    backend = RealBackend(parse_device("cuda"), warmup=1, repeat=4)
    assert backend.start().info["timing"] == gpu_protocol()
    row = backend.measure(MeasureJob(keys.key(stage), stage, keys.describe_json(stage), graph,
                                     spec_source("squeezenet"), 2))
    assert LEAST_REPLAYS <= row["samples"] == row["repeat"] <= 4 and row["warmup"] == 1 and row["median_ms"] > 0
    assert json.loads(row["device_info"])["timing"] == gpu_protocol()
    assert "uncaptured" not in json.loads(row["device_info"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_real_backend_measures_stages_in_half_precision(dtype: str) -> None:
    graph = import_model("squeezenet").graph
    stage = Stage("merge", (("fire2.expand1x1",), ("fire2.expand3x3",)))
    keys = StageKeys(graph)
    backend = RealBackend(parse_device("cuda"), warmup=1, repeat=4)
    row = backend.measure(MeasureJob(keys.key(stage), stage, keys.describe_json(stage), graph,
                                     spec_source("squeezenet"), 8, dtype))
    assert row["dtype"] == dtype and row["median_ms"] > 0
    assert "uncaptured" not in json.loads(row["device_info"])


def test_the_real_backend_measures_channels_last_stages_in_graphs() -> None:
    graph = import_model("squeezenet", dtype=torch.float16, memory_format="channels_last").graph
    keys = StageKeys(graph)
    backend = RealBackend(parse_device("cuda"), warmup=1, repeat=4)
    for stage in (Stage("merge", (("fire2.expand1x1",), ("fire2.expand3x3",))),
                  Stage("concurrent", (("fire2.expand1x1",), ("fire2.expand3x3",)))):
        assert keys.describe(stage)["memory_format"] == "channels_last"
        row = backend.measure(MeasureJob(keys.key(stage), stage, keys.describe_json(stage), graph,
                                         spec_source("squeezenet"), 8, "float16"))
        assert row["median_ms"] > 0 and "uncaptured" not in json.loads(row["device_info"])


def test_stages_timed_together_in_one_graph_take_what_each_takes_in_a_graph_of_its_own(stages: dict) -> None:
    """The batched protocol against the stage-per-graph one, on one stage of each kind: within 25% each (both are
    device time in a graph; the batch replays each stage twice between events, the other eight times a replay)."""
    runs = [run for _, run in stages.values()]
    stream = torch.cuda.Stream(CUDA)
    together = [statistics.median(found) for found in graph_batch_samples_ms(runs, stream, 1, 10, 2)]
    alone = [statistics.median(graph_samples_ms(run, stream, 3, 10, 8)) for run in runs]
    for batched, single in zip(together, alone):
        assert 0.75 < batched / single < 1.25, (together, alone)


def test_the_real_backend_measures_a_batch_of_stages_in_graphs_of_several() -> None:
    graph = import_model("inception_v3").graph
    keys = StageKeys(graph)
    chosen = [Stage("concurrent", ((unit.id,),)) for unit in graph.units[:20]]
    backend = RealBackend(parse_device("cuda"), warmup=1, repeat=5)
    rows = backend.measure_all([MeasureJob(keys.key(s), s, keys.describe_json(s), graph, spec_source("inception_v3"),
                                           1) for s in chosen])
    assert [row["stage_key"] for row in rows] == [keys.key(s) for s in chosen]
    assert all(row["median_ms"] > 0 and "uncaptured" not in json.loads(row["device_info"]) for row in rows)
