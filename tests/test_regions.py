"""Inductor regions (:mod:`ios_ray.runtime.regions`): with ``inductor`` kernels a pass compiles each run of stages
that are not of several groups, and each group of the others, into one function that computes what eager kernels
compute, once per input signature, never inside a CUDA capture; a region that cannot be traced runs its code as it
is; a search runs and deploys them."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ios_ray.frontend import import_module
from ios_ray.runtime import Program, ScheduleRunner
from ios_ray.runtime.ahead import TRACES_PER_WORKER, default_workers
from ios_ray.runtime.kernels import CudnnConvRelu, OneDnnConv, conv_binder
from ios_ray.runtime.units import FoldedConv
from ios_ray.runtime.regions import LEAST_UNITS, Region, region_steps, signature, tracing_ahead
from ios_ray.runtime.stages import ParallelStage
from tests.fake_cuda import FakeCuda
from tests.helpers import relative_error
from tests.test_kernels import search_tiny
from tests.test_runtime_schedules import BUILDERS, Tiny, make_schedule, tiny

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)


def regions_of(runner: ScheduleRunner) -> list[Region]:
    """The regions a runner's pass calls (:attr:`ScheduleRunner.regions`), its steps checked on the way: a group or a
    run of stages is a region exactly where it holds :data:`LEAST_UNITS` units or more."""
    for units, _, code in runner._pass.steps:
        stage = getattr(code, "__self__", None)
        if isinstance(stage, ParallelStage):
            assert all(isinstance(g.code, Region) == (len(g.units) >= LEAST_UNITS) for g in stage.groups)
        else:
            assert isinstance(code, Region) or len(units) < LEAST_UNITS
    return runner.regions


def test_region_steps_cut_at_stages_of_several_groups_and_return_only_what_is_read_later() -> None:
    def add(k: float):  # noqa: ANN202
        return lambda *xs: (sum(xs) + k,)

    steps = [(("a",), ("@input",), add(1)), (("b",), ("a",), add(2)),
             (("c", "d"), ("b",), lambda b: (b * 2, b * 3)),  # a stage of two groups
             (("e",), ("c", "d"), add(0)), (("g",), ("e", "a"), add(5))]
    releases = [("@input",), (), ("b",), ("c", "d"), ("e", "a")]
    found, released = region_steps(steps, [True, True, False, True, True], releases, ("g",))
    assert [(units, inputs) for units, inputs, _ in found] == [
        (("a", "b"), ("@input",)), (("c", "d"), ("b",)), (("g",), ("c", "d", "a"))]  # e never leaves its region
    assert released == [("@input",), ("b",), ("c", "d", "a")]
    first, second = found[0][2], found[2][2]
    assert isinstance(first, Region) and isinstance(second, Region) and found[1] == steps[2]
    x = torch.tensor([1.0])
    assert first.code(x) == (x + 1, x + 3)
    assert second.code(x, 2 * x, 10 * x) == (3 * x + 10 * x + 5,)


@pytest.mark.parametrize("strategy", ["sequential", "greedy", "ios_like"])
def test_a_pass_with_inductor_kernels_computes_what_eager_kernels_compute(strategy: str) -> None:
    model, x = tiny().double(), torch.randn(2, *Tiny.input_shape, dtype=torch.float64)
    imported = import_module(model, x[:1])
    schedule = make_schedule(imported.graph, BUILDERS[strategy], 2, kernels="inductor")
    runner = ScheduleRunner(Program.from_imported(imported, CPU, "inductor"), schedule)
    eager = ScheduleRunner(Program.from_imported(imported, CPU, "eager"), schedule)
    several = [isinstance(stage, ParallelStage) for stage in runner.stages]
    runs, run = [], []  # the units of each run of stages not of several groups
    for stage, alone in zip(runner.stages, several):
        if not alone:
            run.extend(stage.stage.units)
        elif run:
            runs, run = [*runs, run], []
    runs = [*runs, run] if run else runs
    groups = [g for s in runner.stages if isinstance(s, ParallelStage) for g in s.stage.groups]
    regions = regions_of(runner)
    assert len(regions) == sum(len(r) >= LEAST_UNITS for r in [*runs, *groups]) > 0
    assert len(runner._pass.steps) == sum(several) + sum(1 if len(r) >= LEAST_UNITS else len(r) for r in runs)
    with torch.no_grad():
        expected = model(x)
        for _ in range(3):  # the first call runs the code as it is and compiles; the others run compiled code
            assert relative_error(runner(x), expected) <= 1e-12
        assert relative_error(eager(x), expected) <= 1e-12
    assert all(len(r.compiled) == 1 and None not in r.compiled.values() for r in regions)


def test_with_inductor_kernels_a_unit_outside_a_region_runs_fused_and_a_region_traces_torchs_own_ops() -> None:
    # a lone conv (a group of one beside a stage's other groups) is one oneDNN call with its
    # bias and activation, as fused kernels run it, and so is every unit of a stage as the profiler times it; a region
    # traces the convolutions as torch's own op, which Inductor fuses around itself; both compute what the model does
    model, x = tiny(), torch.randn(2, *Tiny.input_shape)
    imported = import_module(model, x[:1])
    program = Program.from_imported(imported, CPU, "inductor")
    convs = {u.id for u in imported.graph.units if u.kind == "conv"}
    assert convs and all(isinstance(program.fns[u], OneDnnConv) and program.traced_fns[u] is program.fns[u].conv
                         for u in convs)
    runner = ScheduleRunner(program, make_schedule(imported.graph, BUILDERS["ios_like"], 2, kernels="inductor"))

    def calls(code: object) -> set[int]:  # the unit callables a group's code calls (its namespace holds them)
        return {id(v) for v in getattr(code, "__globals__", {}).values()}

    lone = [(g.units[0], g.code) for _, _, code in runner._pass.steps if isinstance(getattr(code, "__self__", None),
            ParallelStage) for g in code.__self__.groups if len(g.units) == 1 and g.units[0] in convs]
    assert lone and all(id(program.fns[u]) in calls(code) for u, code in lone)
    timed = [stage for stage in runner.stages if isinstance(stage, ParallelStage)]
    assert timed and all(id(program.fns[u]) in calls(g.code) for s in timed for g in s.groups for u in g.units
                         if u in convs)
    with tracing_ahead() as traces, torch.no_grad():
        first = runner(x)
    ops = {node.target for trace in traces for node in trace.graph.graph.nodes if node.op == "call_function"}
    assert torch.ops.aten.convolution.default in ops
    assert not any("mkldnn" in str(op) for op in ops)
    with torch.no_grad():
        expected = model(x)
        assert relative_error(first, expected) <= 1e-5
        for _ in range(2):  # the next call compiles the traces, the one after runs compiled code
            assert relative_error(runner(x), expected) <= 1e-5
    assert all(None not in r.compiled.values() for r in regions_of(runner))


def test_a_region_compiles_once_per_input_signature() -> None:
    model, x = tiny(), torch.randn(2, *Tiny.input_shape)
    imported = import_module(model, x[:1])
    runner = ScheduleRunner(Program.from_imported(imported, CPU, "inductor"),
                            make_schedule(imported.graph, BUILDERS["sequential"], 2, kernels="inductor"))
    (_, _, region), = runner._pass.steps
    assert isinstance(region, Region)
    with torch.no_grad():
        for batch in (2, 2, 3, 2, 3):
            assert relative_error(runner(x[:1].expand(batch, -1, -1, -1) * 1), model(x[:1].expand(batch, -1, -1, -1)))\
                <= 1e-5
    assert len(region.compiled) == 2 and None not in region.compiled.values()


def test_passes_over_one_program_share_the_regions_they_both_run_and_compile_them_once() -> None:
    # a search's check runs several candidate schedules over one program: a region two of them run (the same group,
    # or the same run of stages returning the same values) is one region, compiled once; other regions stay apart
    model, x = tiny().double(), torch.randn(2, *Tiny.input_shape, dtype=torch.float64)
    imported = import_module(model, x[:1])
    program = Program.from_imported(imported, CPU, "inductor")
    runners = {strategy: ScheduleRunner(program, make_schedule(imported.graph, BUILDERS[strategy], 2,
                                                               kernels="inductor"))
               for strategy in ("ios_like", "greedy", "sequential")}
    again = ScheduleRunner(program, runners["ios_like"].schedule)
    assert [id(r) for r in regions_of(again)] == [id(r) for r in regions_of(runners["ios_like"])]
    assert len(program.regions) == len({id(r) for runner in runners.values() for r in regions_of(runner)}) > 1
    with torch.no_grad():
        expected = model(x)
        for runner in runners.values():
            assert relative_error(runner(x), expected) <= 1e-12
        compiled = {id(r): dict(r.compiled) for r in regions_of(again)}
        assert relative_error(again(x), expected) <= 1e-12
    assert {id(r): r.compiled for r in regions_of(again)} == compiled  # nothing compiled again
    del runners, runner, again
    gc.collect()
    assert len(program.regions) == 0  # a region lives as long as a pass that runs it


def test_a_dropped_runner_frees_the_weights_its_regions_compiled() -> None:
    def frozen() -> dict[int, weakref.ref[torch.Tensor]]:  # the tensors in the namespaces of Inductor's Python code
        return {id(v): weakref.ref(v) for d in gc.get_objects() if type(d) is dict
                and str(d.get("__file__", "")).endswith(".py") and "torchinductor" in str(d.get("__file__"))
                for v in d.values() if isinstance(v, torch.Tensor)}

    before = frozen()
    model, x = tiny(), torch.randn(2, *Tiny.input_shape)
    imported = import_module(model, x[:1])
    runner = ScheduleRunner(Program.from_imported(imported, CPU, "inductor"),
                            make_schedule(imported.graph, BUILDERS["sequential"], 2, kernels="inductor"))
    with torch.no_grad():
        runner(x)
    weights = [ref for key, ref in frozen().items() if key not in before]
    assert weights  # the compiled code's own copies of the region's weights, packed and folded
    del runner
    gc.collect()
    assert all(ref() is None for ref in weights)  # Inductor keeps every module it loads unless told otherwise


class Scaled(torch.nn.Module):
    """Two convs, a sigmoid, and a learned scale and per-channel weight that stay outside the convs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 16, 1)
        self.scale, self.weight = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(16, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x))
        return torch.sigmoid(self.b(y)) * self.scale + y * self.weight


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_a_region_compiled_before_with_other_weights_is_read_from_inductors_cache_and_computes_with_its_own(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dtype: torch.dtype, tolerance: float) -> None:
    # Inductor's FX graph cache holds a region's compiled code across processes, its weights read from the region's
    # own graph: in float64 on a CPU, where freezing packs no weights, and in float32, where it packs the convs' weights
    # into oneDNN tensors (which Inductor alone would refuse to cache). Frozen weights of up to 8 numbers are written
    # into the code (the scale): a hit needs them equal.
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    x = torch.randn(2, 3, 8, 8, dtype=dtype)
    alive = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = Scaled().to(dtype).eval()
        with torch.no_grad():
            model.scale.fill_(1.5)
            model.weight.normal_()
        imported = import_module(model, x[:1])
        assert [u.kind for u in imported.graph.units].count("elementwise") == 1  # the scale stays a unit's
        runner = ScheduleRunner(Program.from_imported(imported, CPU, "inductor"),
                                make_schedule(imported.graph, BUILDERS["sequential"], 2, kernels="inductor"))
        counters.clear()
        with torch.no_grad():
            assert relative_error(runner(x), model(x)) <= tolerance
            assert relative_error(runner(x), model(x)) <= tolerance
        alive.append((model, runner))
    assert counters["inductor"]["fxgraph_cache_hit"] == 1  # the second model's region: the first one's code
    with torch.no_grad():  # each region still computes with its own weights (none shares the other's)
        assert all(relative_error(runner(x), model(x)) <= tolerance for model, runner in alive)


def test_a_region_that_reads_a_value_runs_its_code_as_it_is_and_says_so() -> None:
    region = Region(lambda x: (x * float(x.sum()),), "region 0 (stages 0 to 2)")
    x = torch.arange(3.0)
    with pytest.warns(RuntimeWarning, match=r"region 0 \(stages 0 to 2\) runs uncompiled \(\w+"):
        assert torch.equal(region(x)[0], x * 3)
    assert region.compiled == {signature((x,)): None}
    assert torch.equal(region(2 * x)[0], 2 * x * 6)  # not the value read while tracing: 2x * 3


def on_a_fake_gpu(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeCuda, list[bool], torch.nn.Module, torch.Tensor,
                                                               Program]:
    """A fake GPU installed, the list to which every region's compile adds whether it ran inside a capture, and the
    tiny model, an input and its ``inductor`` program on the GPU, its convs bound as on a GPU (cuDNN's fused conv and
    ReLU where the activation is a ReLU; each call adds ``"cudnn"`` and whether it ran inside a capture to the list;
    the fake device runs nothing: tensors stay on the CPU)."""
    cuda = FakeCuda().install(monkeypatch)
    compiled_while: list[bool | str] = []
    compile_region = Region._compiled

    def recorded(self: Region, inputs: tuple[torch.Tensor, ...]):  # noqa: ANN202
        compiled_while.append(cuda.capturing is not None)
        return compile_region(self, inputs)

    def cudnn_convolution_relu(x, weight, bias, stride, padding, dilation, groups):  # noqa: ANN001, ANN202
        compiled_while.append(f"cudnn {'inside' if cuda.capturing is not None else 'outside'} a capture")
        return F.relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups))

    monkeypatch.setattr(Region, "_compiled", recorded)
    monkeypatch.setattr(torch, "cudnn_convolution_relu", cudnn_convolution_relu)
    model, x = tiny(), torch.randn(2, *Tiny.input_shape)
    cpu = Program.from_imported(import_module(model, x[:1]), CPU, "eager")
    bind = conv_binder("inductor", CUDA)
    fns = {u.id: bind(fn, cpu.graph.value_shape(u.inputs[0])) if isinstance(fn := cpu.fns[u.id], FoldedConv) else fn
           for u in cpu.graph.units}
    return cuda, compiled_while, model, x, Program(cpu.graph, fns, CUDA, "inductor")  # type: ignore[return-value]


def test_on_a_gpu_regions_compile_at_the_captures_warm_up_never_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, compiled_while, model, x, program = on_a_fake_gpu(monkeypatch)
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS["ios_like"], 2, kernels="inductor"), CUDA,
                            cuda_graph=True)
    assert any(isinstance(stage, ParallelStage) for stage in runner.stages)  # side streams between the regions
    with torch.no_grad():
        got = runner.captured(x)  # type: ignore[misc]  # the fake device runs nothing: the tensors stay on the CPU
        expected = model(x)
    assert relative_error(got, expected) <= 1e-5
    regions = regions_of(runner)
    compiles = [c for c in compiled_while if isinstance(c, bool)]
    assert compiles == [False] * len(regions) and len(regions) >= 4  # two runs of stages, and groups
    assert all(len(r.compiled) == 1 and None not in r.compiled.values() for r in regions)
    assert [g.captured for g in cuda.graphs] == [True]


def test_on_a_gpu_a_lone_relu_conv_beside_regions_runs_cudnns_fused_conv_inside_the_capture(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the greedy schedule's groups are single units: each conv with a ReLU runs cuDNN's fused conv and ReLU, uncaptured
    # at the warm-up, then inside the capture (never three kernels: conv, bias, ReLU)
    cuda, compiled_while, model, x, program = on_a_fake_gpu(monkeypatch)
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS["greedy"], 2, kernels="inductor"), CUDA,
                            cuda_graph=True)
    lone = [u for s in runner.stages if isinstance(s, ParallelStage) for g in s.groups for u in g.units
            if isinstance(program.fns[u], CudnnConvRelu)]
    assert lone
    with torch.no_grad():
        got = runner.captured(x)  # type: ignore[misc]
        expected = model(x)
    assert relative_error(got, expected) <= 1e-5
    fused = [c for c in compiled_while if isinstance(c, str)]
    assert fused.count("cudnn inside a capture") >= len(lone) and fused.count("cudnn outside a capture") >= len(lone)
    assert True not in compiled_while and [g.captured for g in cuda.graphs] == [True]


@pytest.mark.slow
def test_a_search_with_inductor_kernels_checks_and_deploys_its_regions(ray_local: None, tmp_path: Path) -> None:
    result = search_tiny(tmp_path / "store.duckdb", "inductor")
    outcome = result["cpu", 2]
    assert outcome.schedule.kernels == "inductor" and outcome.schedule.device_info["kernels"] == "inductor"
    assert outcome.schedule.end_to_end is not None and outcome.measured > 0
    compiled = outcome.schedule.end_to_end.compiled  # the candidates' regions, compiled before the rounds
    # at least those of the two candidates every check runs, whatever the measurements made the DP's (which may
    # share theirs: 3 to 5 regions in all, seen)
    program = Program.from_imported(import_module(tiny(), torch.randn(1, *Tiny.input_shape)), CPU, "inductor")
    fixed = [ScheduleRunner(program, make_schedule(program.graph, BUILDERS[name], 2, kernels="inductor"), CPU)
             for name in ("greedy", "sequential")]
    assert compiled is not None and compiled.left == 0
    assert compiled.regions >= len({id(region) for runner in fixed for region in runner.regions}) == 2
    # a worker per 8 regions, none where this process's compiles were all read from Inductor's cache
    assert compiled.workers <= min(default_workers(), compiled.regions // TRACES_PER_WORKER)
    assert compiled.by_workers <= compiled.regions
    model, x = tiny(), torch.randn(2, *Tiny.input_shape)
    deployed = result.deploy(model)
    with torch.no_grad():
        assert relative_error(deployed(x), model(x)) <= 1e-5


def test_a_region_compiles_with_the_thread_count_its_code_is_specialised_to_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Inductor's C++ code runs on as many threads as torch had when it compiled; torch 2.11's FX graph cache leaves
    # that count out of its key where Inductor's setting is left at its default, so a region compiled on one thread
    # (a worker's, a stage group's) was read back for another count: the setting is named so that the cache keys by it
    from torch._inductor import compile_fx as compile_fx_module
    from torch._inductor import config

    seen: list[int] = []
    real = compile_fx_module.compile_fx

    def spied(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(config.cpp.threads)
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx", spied)
    model, x = tiny(), torch.randn(2, *Tiny.input_shape)
    imported = import_module(model, x[:1])
    runner = ScheduleRunner(Program.from_imported(imported, CPU, "inductor"),
                            make_schedule(imported.graph, BUILDERS["sequential"], 2, kernels="inductor"))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            assert relative_error(runner(x), model(x)) <= 1e-5
    finally:
        torch.set_num_threads(threads)
    assert seen == [1] and config.cpp.threads == -1  # named while it compiles, the default after
