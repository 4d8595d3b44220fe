"""The runtime on a GPU: groups on side streams, stages chained by events, whole forwards as CUDA graphs.

Skipped without CUDA. TF32 is turned off so that fp32 results compare at ``GPU_FLOAT32_TOLERANCE`` (what ``ios-ray
run`` holds a GPU to: cuDNN's algorithms, Winograd and FFT ones among them, differ by shape, and a merged convolution
has shapes of its own; a wrong schedule is off by far more).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import pytest
import torch

from ios_ray.runtime.accuracy import GPU_FLOAT32_TOLERANCE, HALF_TOLERANCE
from ios_ray.dtypes import example_input
from ios_ray.frontend import import_module
from ios_ray.ir import GRAPH_INPUT
from ios_ray.runtime import Program, ScheduledModule, ScheduleRunner, compile_stage, make_lanes, measure_latency
from ios_ray.runtime.stages import ParallelStage
from ios_ray.runtime.streams import StreamFork
from bench.gpu_steps import is_layout_transpose
from tests.helpers import captured_shapes, randomise_batchnorm, relative_error, tf32
from tests.idiom_models import ResNetStyle
from tests.test_runtime_schedules import BUILDERS, Tiny, make_schedule, tiny
from ios_ray.zoo import ZOO

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SHAPE = Tiny.input_shape


@pytest.fixture(scope="module", autouse=True)
def exact_fp32() -> Iterator[None]:
    with tf32(conv=False, matmul=False):
        yield


@pytest.fixture(scope="module")
def program() -> Program:
    return Program.from_imported(import_module(tiny(), torch.randn(1, *SHAPE)), "cuda")


def test_parallel_groups_run_on_side_streams_and_equal_sequential(program: Program) -> None:
    x = torch.randn(4, *SHAPE, device="cuda")
    expected = program.run(x)
    lanes = make_lanes(torch.device("cuda"))
    env = {GRAPH_INPUT: x}
    stages = [compile_stage(program, s, torch.device("cuda"), lanes) for s in make_schedule(
        program.graph, BUILDERS["ios_like"], 4).stages]
    parallel = [s for s in stages if isinstance(s, ParallelStage)]
    assert parallel and all(isinstance(s.launcher, StreamFork) for s in parallel)
    caller = torch.cuda.current_stream()
    assert all(caller != stream for s in parallel for stream in s.launcher.streams)
    for stage in stages:
        env.update(stage(env))
    actual = program.value(program.graph.output, env)
    assert relative_error(actual, expected) <= GPU_FLOAT32_TOLERANCE


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_runner_equals_sequential_on_the_callers_stream(program: Program, cuda_graph: bool) -> None:
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS["ios_like"], 4), "cuda", cuda_graph)
    stream = torch.cuda.Stream()
    for batch in (4, 4, 1):
        x = torch.randn(batch, *SHAPE, device="cuda")
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            actual = runner(x)
            expected = program.run(x)
        torch.cuda.current_stream().wait_stream(stream)
        assert relative_error(actual, expected) <= GPU_FLOAT32_TOLERANCE


def test_cuda_graphs_are_captured_per_input_shape(program: Program) -> None:
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS["greedy"], 2), "cuda")
    assert runner.captured is not None
    first = torch.randn(2, *SHAPE, device="cuda")
    kept = runner(first)
    runner(torch.randn(2, *SHAPE, device="cuda"))
    assert len(captured_shapes(runner.captured)) == 1
    assert relative_error(kept, program.run(first)) <= GPU_FLOAT32_TOLERANCE
    runner(torch.randn(3, *SHAPE, device="cuda"))
    assert len(captured_shapes(runner.captured)) == 2


@pytest.mark.parametrize("label", ["cuda", "sim:v100"])
def test_scheduled_inception_equals_eager_on_cuda(label: str) -> None:
    torch.manual_seed(0)
    model = randomise_batchnorm(ZOO["inception_v3"].build()).cuda()
    graph = import_module(model, torch.randn(1, 3, 299, 299, device="cuda")).graph
    schedules = [make_schedule(graph, BUILDERS["ios_like"], b, device=label, model="inception_v3") for b in (1, 4)]
    scheduled = ScheduledModule(model, schedules)
    for batch in (1, 4):
        x = torch.randn(batch, 3, 299, 299, device="cuda")
        with torch.no_grad():
            assert relative_error(scheduled(x), model(x)) <= GPU_FLOAT32_TOLERANCE


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scheduled_inception_in_half_precision_equals_eager_on_cuda(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = randomise_batchnorm(ZOO["inception_v3"].build()).cuda().to(dtype)
    graph = import_module(model, example_input(model, (3, 299, 299))).graph
    name = str(dtype).removeprefix("torch.")
    schedules = [dataclasses.replace(make_schedule(graph, BUILDERS["ios_like"], b, device="cuda",
                                                   model="inception_v3"), dtype=name) for b in (1, 4)]
    scheduled = ScheduledModule(model, schedules)
    for batch in (1, 4):
        x = torch.randn(batch, 3, 299, 299, device="cuda", dtype=dtype)
        assert scheduled.schedule_for(x).dtype == name
        with torch.no_grad():
            assert relative_error(scheduled(x), model(x)) <= HALF_TOLERANCE[dtype]


def test_scheduled_inception_in_channels_last_half_precision_equals_eager_on_cuda() -> None:
    torch.manual_seed(0)
    model = randomise_batchnorm(ZOO["inception_v3"].build()).cuda().to(torch.float16, memory_format=torch.channels_last)
    graph = import_module(model, example_input(model, (3, 299, 299))).graph
    assert graph.memory_format == "channels_last"
    schedules = [dataclasses.replace(make_schedule(graph, BUILDERS["ios_like"], b, device="cuda", model="inception_v3"),
                                     dtype="float16", memory_format="channels_last") for b in (1, 4)]
    scheduled = ScheduledModule(model, schedules)
    for batch in (1, 4):
        x = torch.randn(batch, 3, 299, 299, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        with torch.no_grad():
            assert relative_error(scheduled(x), model(x)) <= HALF_TOLERANCE[torch.float16]


def test_measure_latency_on_cuda(program: Program) -> None:
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS["sequential"], 1), "cuda")
    median, p10, p90 = measure_latency(runner, torch.randn(1, *SHAPE, device="cuda"), 2, 5, "cuda")
    assert 0 < p10 <= median <= p90


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scheduled_inception_with_fused_kernels_equals_eager_on_cuda(dtype: torch.dtype) -> None:
    """Fused kernels on a GPU: activations channels-last, ReLU convs through cuDNN's fused op, in CUDA graphs."""
    torch.manual_seed(0)
    model = randomise_batchnorm(ZOO["inception_v3"].build()).cuda().to(dtype)
    graph = import_module(model, example_input(model, (3, 299, 299))).graph
    name = str(dtype).removeprefix("torch.")
    schedules = [dataclasses.replace(make_schedule(graph, BUILDERS["ios_like"], b, device="cuda", model="inception_v3",
                                                   kernels="fused"), dtype=name) for b in (1, 4)]
    scheduled = ScheduledModule(model, schedules)
    tolerance = GPU_FLOAT32_TOLERANCE if dtype == torch.float32 else HALF_TOLERANCE[dtype]
    for batch in (1, 4, 4):
        x = torch.randn(batch, 3, 299, 299, device="cuda", dtype=dtype)
        with torch.no_grad():
            got = scheduled(x)
            assert relative_error(got, model(x)) <= tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_resnet_with_fused_kernels_adds_its_identity_shortcuts_inside_cudnns_convolution(dtype: torch.dtype) -> None:
    """A residual sum that completes a conv (its identity shortcut) runs in ``cudnn_convolution_add_relu``, in CUDA
    graphs, and equals eager; the downsampling shortcut stays a sum of its own."""
    torch.manual_seed(0)
    model = randomise_batchnorm(ResNetStyle()).cuda().to(dtype).eval()
    graph = import_module(model, example_input(model, (3, 32, 32))).graph
    assert sum(1 for u in graph.units if u.attrs.get("residual")) == 2
    name = str(dtype).removeprefix("torch.")
    schedule = make_schedule(graph, BUILDERS["sequential"], 4, device="cuda", model="resnet_style", kernels="fused")
    scheduled = ScheduledModule(model, [dataclasses.replace(schedule, dtype=name)])
    tolerance = GPU_FLOAT32_TOLERANCE if dtype == torch.float32 else HALF_TOLERANCE[dtype]
    for _ in range(2):
        x = torch.randn(4, 3, 32, 32, device="cuda", dtype=dtype)
        with torch.no_grad():
            assert relative_error(scheduled(x), model(x)) <= tolerance


def test_fused_kernels_launch_no_layout_transposes_on_cuda() -> None:
    """In float32 NCHW cuDNN transposes around its NHWC kernels; fused kernels hold activations NHWC throughout."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    model = ZOO["inception_v3"].build().cuda().eval()
    imported = import_module(model, torch.randn(1, 3, 299, 299, device="cuda"))
    x = torch.randn(1, 3, 299, 299, device="cuda")
    runners = {kernels: ScheduleRunner(Program.from_imported(imported, "cuda", kernels),
                                       make_schedule(imported.graph, BUILDERS["sequential"], 1, kernels=kernels),
                                       "cuda", cuda_graph=False) for kernels in ("eager", "fused")}
    for runner in runners.values():
        runner(x)
    # one session, each pass in a range of its own that ends after the device did: a kernel counts for the range it
    # started in (separate sessions delivered their kernels late on an H200, 2026-11-28: eager 0, fused 329)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for kernels, runner in runners.items():
            with record_function(f"pass with {kernels} kernels"):
                runner(x)
                torch.cuda.synchronize()
    events = prof.events()
    ranges = {kernels: next(e.time_range for e in events if e.name == f"pass with {kernels} kernels")
              for kernels in runners}
    starts = [e.time_range.start for e in events if e.device_type == DeviceType.CUDA and is_layout_transpose(e.name)]
    transposes = {kernels: sum(span.start <= start <= span.end for start in starts) for kernels, span in ranges.items()}
    assert transposes["fused"] == 0 < transposes["eager"], (transposes, len(starts))  # H100, torch 2.11: 0 and 113
