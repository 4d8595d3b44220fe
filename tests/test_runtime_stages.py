"""Compiled stages and the schedule runner on CPU: outputs, worker threads, and freeing outputs after last use (the\npass's code drops each value right after its last reader)."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Callable

import pytest
import torch

from ios_ray.frontend import import_module
from ios_ray.ir import GRAPH_INPUT, Graph
from ios_ray.runtime import Program, ScheduleRunner, compile_stage, release_plan
from ios_ray.runtime.codegen import group_code, pass_code
from ios_ray.runtime.stages import InlineStage, MergeStage, ParallelStage
from ios_ray.runtime.workers import ThreadTeam, WorkerPool
from ios_ray.stage import Stage
from tests.test_runtime_schedules import BUILDERS, Tiny, ios_like_stages, make_schedule, tiny

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def program() -> Program:
    return Program.from_imported(import_module(tiny(), torch.randn(1, *Tiny.input_shape)))


def sequential_env(program: Program, x: torch.Tensor) -> dict[str, torch.Tensor]:
    env = {GRAPH_INPUT: x}
    for unit in program.graph.units:  # in execution order
        env[unit.id] = program.run_unit(unit.id, env)
    return env


def test_each_stage_kind_equals_sequential_execution(program: Program) -> None:
    x = torch.randn(4, *Tiny.input_shape)
    expected = sequential_env(program, x)
    env = {GRAPH_INPUT: x}
    kinds = set()
    for stage in make_schedule(program.graph, ios_like_stages, 4).stages:
        compiled = compile_stage(program, stage, CPU)
        kinds.add(type(compiled))
        assert set(compiled.inputs) <= set(env)
        outputs = compiled({s: env[s] for s in compiled.inputs})
        assert set(outputs) == set(stage.units)
        for unit_id, tensor in outputs.items():
            torch.testing.assert_close(tensor, expected[unit_id], rtol=1e-5, atol=1e-6)
        env.update(outputs)
    assert kinds == {InlineStage, MergeStage, ParallelStage}


def test_parallel_groups_run_on_persistent_workers_with_their_share_of_threads(program: Program) -> None:
    seen: list[tuple[int, int, bool]] = []

    def probe(env: object) -> dict[str, torch.Tensor]:
        seen.append((threading.get_ident(), torch.get_num_threads(), torch.is_grad_enabled()))
        return {}

    caller_threads = torch.get_num_threads()
    pool = WorkerPool(cores=4)
    team = pool.team(2)
    assert pool.team(2) is team and team.threads == 2 and pool.team(3).threads == 1
    threads_before = threading.active_count()
    for _ in range(3):
        team.run([probe, probe], {})
    assert threading.active_count() == threads_before and torch.get_num_threads() == caller_threads
    assert {threads for _, threads, _ in seen} == {2} and not any(grad for _, _, grad in seen)
    assert len({ident for ident, _, _ in seen}) <= 2 and threading.get_ident() not in {i for i, _, _ in seen}
    pool.close()


def test_a_failing_group_raises_after_every_group_has_finished() -> None:
    finished = threading.Event()

    def slow(env: object) -> dict[str, torch.Tensor]:
        finished.wait(0.2)
        finished.set()
        return {}

    def failing(env: object) -> dict[str, torch.Tensor]:
        raise KeyError("missing input")

    team = ThreadTeam(2, 1)
    with pytest.raises(KeyError, match="missing input"):
        team.run([failing, slow], {})
    assert finished.is_set()
    team.close()


def test_compile_stage_checks_the_device(program: Program) -> None:
    with pytest.raises(ValueError, match="bound to cpu"):
        compile_stage(program, Stage("concurrent", (("stem.0",),)), torch.device("meta"))


def test_release_plan_drops_each_output_after_its_last_reader(program: Program) -> None:
    graph: Graph = program.graph
    stages = make_schedule(graph, ios_like_stages, 1).stages
    plan = release_plan(graph, stages)
    place = {u: i for i, stage in enumerate(stages) for u in stage.units}
    released = {source: i for i, sources in enumerate(plan) for source in sources}
    kept = set(graph.output.sources)
    assert set(released) == ({GRAPH_INPUT} | set(place)) - kept and sum(map(len, plan)) == len(released)
    for source, index in released.items():
        readers = [place[u] for u in graph.users[source]]
        assert index == max([place.get(source, 0), *readers])


def test_a_pass_holds_each_value_until_its_last_reader_and_no_longer(program: Program) -> None:
    graph: Graph = program.graph
    stages = make_schedule(graph, ios_like_stages, 1).stages
    made: dict[str, weakref.ref[torch.Tensor]] = {}
    alive: dict[str, set[str]] = {}  # by unit: the outputs still held when it ran

    def unit(unit_id: str) -> Callable[[list[torch.Tensor]], torch.Tensor]:
        def run(inputs: list[torch.Tensor]) -> torch.Tensor:
            alive[unit_id] = {u for u, ref in made.items() if ref() is not None}
            out = torch.zeros(1, 1)
            made[unit_id] = weakref.ref(out)
            return out
        return run
    fns = {u.id: unit(u.id) for u in graph.units}
    steps = []
    for stage in stages:
        units = stage.units
        inputs = tuple(dict.fromkeys(s for u in units for s in graph.unit(u).sources if s not in units))
        steps.append((units, inputs, group_code(graph, fns, units, inputs)))
    plan = release_plan(graph, stages)
    pass_code(graph, lambda x: x, lambda y: y, steps, plan)(torch.zeros(1, 1))
    place = {u: i for i, stage in enumerate(stages) for u in stage.units}
    dropped = {source: i for i, sources in enumerate(plan) for source in sources}
    order = [u for stage in stages for u in stage.units]
    for position, unit_id in enumerate(order):
        held = {u for u in order[:position] if dropped.get(u, len(stages)) >= place[unit_id]}
        assert alive[unit_id] == held, unit_id
    assert len(alive) == len(graph.units) and any(alive[u] != set(order[:i]) for i, u in enumerate(order))


@pytest.mark.parametrize("strategy", ["sequential", "ios_like"])
def test_a_dropped_runner_frees_its_program_at_once(strategy: str) -> None:
    """No reference cycle may hold a runner's code: its program's weights would stay until a full collection."""
    program = Program.from_imported(import_module(tiny(), torch.randn(1, *Tiny.input_shape)))
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS[strategy], 2))
    runner(torch.randn(2, *Tiny.input_shape))
    dropped = weakref.ref(program)
    gc.collect()
    gc.disable()
    try:
        del runner, program
        assert dropped() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("strategy", ["sequential", "greedy", "ios_like"])
@pytest.mark.parametrize("batch", [1, 4])
def test_runner_equals_sequential_program(program: Program, strategy: str, batch: int) -> None:
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS[strategy], batch), CPU)
    assert runner.captured is None
    x = torch.randn(batch, *Tiny.input_shape)
    torch.testing.assert_close(runner(x), program.run(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(runner(x), program.run(x), rtol=1e-5, atol=1e-6)


def test_runner_refuses_cuda_graphs_on_cpu(program: Program) -> None:
    with pytest.raises(ValueError, match="pass cuda_graph=False"):
        ScheduleRunner(program, make_schedule(program.graph, BUILDERS["sequential"], 1), CPU, cuda_graph=True)
