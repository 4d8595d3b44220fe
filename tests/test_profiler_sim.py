"""The sim device model: deterministic, bounded by the device, and qualitatively like the GPUs it stands for."""

from __future__ import annotations

import itertools
import time
from typing import Iterator, Sequence

import pytest

from ios_ray.devices import parse_device
from ios_ray.errors import UserError
from ios_ray.frontend import import_model
from ios_ray.ir import GRAPH_INPUT, Graph, Value
from ios_ray.profiler.jobs import MeasureJob, ModelSource
from ios_ray.store.schema import STORE_SCHEMA
from ios_ray.gpu_sheets import SHEETS
from ios_ray.profiler.sim_model import stage_kernels, stage_latency_ms
from ios_ray.profiler.sim_backend import STAGE_OVERHEAD_S, SimBackend
from ios_ray.scheduler.baselines import sequential
from ios_ray.scheduler import SearchParams, plan_graph
from ios_ray.scheduler.dp import optimize_graph
from ios_ray.stage import Stage, StageKeys
from tests.conftest import conv_unit, inception_c_graph

HEADS = ("b1", "b7a", "bda", "bp")


def one_stage(*groups: Sequence[str]) -> Stage:
    """A concurrent stage of these groups."""
    return Stage("concurrent", tuple(tuple(g) for g in groups))


def sequential_ms(graph: Graph, units: Sequence[str], batch: int, gpu: str) -> float:
    """One stage per unit, summed."""
    return sum(stage_latency_ms(graph, one_stage([u]), batch, gpu) for u in units)


def schedule_ms(graph: Graph, stages: Sequence[Stage], batch: int, gpu: str) -> float:
    """A schedule's latency: its stages summed."""
    return sum(stage_latency_ms(graph, stage, batch, gpu) for stage in stages)


def partitions(items: Sequence[str]) -> Iterator[list[list[str]]]:
    """Every set partition of ``items``."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for smaller in partitions(rest):
        yield [[first], *smaller]
        for i in range(len(smaller)):
            yield [*smaller[:i], [first, *smaller[i]], *smaller[i + 1:]]


def best_schedule(graph: Graph, units: Sequence[str], batch: int, gpu: str) -> tuple[tuple[int, ...], ...]:
    """The fastest way to run independent units as concurrent stages of chains, as sorted group sizes per stage."""
    best: tuple[float, tuple[tuple[int, ...], ...]] | None = None
    for stages in partitions(units):
        for layout in _layouts(stages):
            cost = schedule_ms(graph, [one_stage(*groups) for groups in layout], batch, gpu)
            shape = tuple(sorted(tuple(sorted(len(g) for g in groups)) for groups in layout))
            best = min(best, (cost, shape)) if best else (cost, shape)
    assert best is not None
    return best[1]


def _layouts(stages: list[list[str]]) -> Iterator[list[list[list[str]]]]:
    """Every way to split each stage of a partition into groups."""
    if not stages:
        yield []
        return
    for groups in partitions(stages[0]):
        for rest in _layouts(stages[1:]):
            yield [groups, *rest]


@pytest.fixture(scope="module")
def graph() -> Graph:
    return inception_c_graph()


def test_deterministic(graph: Graph) -> None:
    stage = one_stage(["b1"], ["b7a", "b7b", "b7c"], ["bda"])
    first = stage_latency_ms(graph, stage, 8, "v100")
    assert stage_latency_ms(inception_c_graph(), stage, 8, "v100") == first > 0


@pytest.mark.parametrize("gpu", sorted(SHEETS))
def test_small_batches_underutilise_large_ones_do_not(graph: Graph, gpu: str) -> None:
    heads = one_stage(*([u] for u in HEADS))
    speedup_1 = sequential_ms(graph, HEADS, 1, gpu) / stage_latency_ms(graph, heads, 1, gpu)
    speedup_128 = sequential_ms(graph, HEADS, 128, gpu) / stage_latency_ms(graph, heads, 128, gpu)
    assert speedup_1 >= 1.4
    assert speedup_128 <= 1.05
    assert stage_latency_ms(graph, heads, 1, gpu) < stage_latency_ms(graph, heads, 128, gpu)


@pytest.mark.parametrize("gpu", sorted(SHEETS))
@pytest.mark.parametrize("batch", [1, 8, 128])
def test_concurrency_is_bounded_by_the_device(graph: Graph, gpu: str, batch: int) -> None:
    sheet = SHEETS[gpu]
    groups = [["b1"], ["b7a", "b7b", "b7c"], ["bda"], ["bp"]]
    stage = one_stage(*groups)
    full_device_ms = sum(
        max(k.flops / (sheet.peak_tflops * 1e12), k.bytes / (sheet.bandwidth_gbs * 1e9)) * 1e3
        for group in stage_kernels(graph, stage, batch) for k in group
    )
    latency = stage_latency_ms(graph, stage, batch, gpu)
    assert latency >= full_device_ms
    assert latency >= max(stage_latency_ms(graph, one_stage(g), batch, gpu) for g in groups)


@pytest.mark.parametrize("batch", [1, 32])
def test_a_stage_has_one_price_whatever_its_group_order(graph: Graph, batch: int) -> None:
    groups = [["b1"], ["b7a", "b7b", "b7c"], ["bda"], ["bp"]]
    prices = {stage_latency_ms(graph, one_stage(*order), batch, gpu)
              for gpu in sorted(SHEETS) for order in itertools.permutations(groups)}
    assert len(prices) == len(SHEETS)


@pytest.mark.slow
def test_dropping_a_group_never_makes_a_stage_slower() -> None:
    """Over every concurrent candidate stage of three or more groups of Inception V3, on sim:v100 at batch 1 and
    sim:k80 at batch 32 (the lazy search's structural bound relies on it: a stage is at least as slow as each of
    its sub-stages)."""
    graph = import_model("inception_v3").graph
    stages = [p.stage for p in plan_graph(graph, SearchParams(), StageKeys(graph)).stages.values()
              if p.stage.strategy == "concurrent" and len(p.stage.groups) >= 3]
    assert len(stages) > 2000
    for gpu, batch in (("v100", 1), ("k80", 32)):
        for stage in stages:
            latency = stage_latency_ms(graph, stage, batch, gpu)
            for j in range(len(stage.groups)):
                sub = one_stage(*stage.groups[:j], *stage.groups[j + 1:])
                assert latency >= stage_latency_ms(graph, sub, batch, gpu), (gpu, batch, stage, j)


def test_stage_barriers_cost_time(graph: Graph) -> None:
    chain = stage_latency_ms(graph, one_stage(["b7a", "b7b"]), 1, "v100")
    assert chain < sequential_ms(graph, ["b7a", "b7b"], 1, "v100")


def test_k80_saturates_sooner_than_v100(graph: Graph) -> None:
    def gain(gpu: str) -> float:
        heads = one_stage(*([u] for u in HEADS))
        return sequential_ms(graph, HEADS, 1, gpu) / stage_latency_ms(graph, heads, 1, gpu)

    assert gain("k80") < gain("v100")


def test_k80_and_v100_prefer_different_schedules(graph: Graph) -> None:
    v100 = best_schedule(graph, HEADS, 8, "v100")
    k80 = best_schedule(graph, HEADS, 8, "k80")
    assert v100 != k80
    assert len(v100[0]) > len(k80[0])


def test_merge_trades_padded_flops_for_one_read_and_one_launch() -> None:
    shape = (384, 8, 8)
    units = (
        conv_unit("a", GRAPH_INPUT, shape, 384, (1, 3), (0, 1)),
        conv_unit("b", GRAPH_INPUT, shape, 384, (3, 1), (1, 0)),
        conv_unit("c", GRAPH_INPUT, shape, 384),
        conv_unit("d", GRAPH_INPUT, shape, 384),
    )
    graph = Graph("merge", shape, units, Value((("a",), ("b",), ("c",), ("d",))))
    merged = stage_kernels(graph, Stage("merge", (("a",), ("b",))), 1)
    assert len(merged) == 1 and len(merged[0]) == 1
    assert merged[0][0].flops == 3 * (units[0].flops + units[1].flops)
    for batch in (1, 128):
        merge_1x1 = stage_latency_ms(graph, Stage("merge", (("c",), ("d",))), batch, "v100")
        assert merge_1x1 < stage_latency_ms(graph, one_stage(["c"], ["d"]), batch, "v100")
    padded = stage_latency_ms(graph, Stage("merge", (("a",), ("b",))), 128, "v100")
    assert padded > sequential_ms(graph, ["a", "b"], 128, "v100")


def test_bad_input_is_a_user_error(graph: Graph) -> None:
    with pytest.raises(UserError, match="knows"):
        stage_latency_ms(graph, one_stage(["b1"]), 1, "t4")
    with pytest.raises(UserError, match="float32"):
        stage_latency_ms(graph, one_stage(["b1"]), 1, "v100", "float16")
    with pytest.raises(ValueError):
        stage_kernels(graph, Stage("merge", (("b1",), ("b7b",))), 1)


def test_sim_backend_rows_are_simulated_and_take_device_time(graph: Graph) -> None:
    backend = SimBackend(parse_device("sim:k80"), warmup=2, repeat=5)
    identity = backend.start()
    stage = one_stage(*([u] for u in HEADS))
    keys = StageKeys(graph)
    job = MeasureJob(keys.key(stage), stage, keys.describe_json(stage), graph,
                     ModelSource(graph.name, graph.input_shape), 32)
    start = time.perf_counter()
    row = backend.measure(job)
    elapsed = time.perf_counter() - start
    assert tuple(row) == tuple(STORE_SCHEMA.names)
    assert row["source"] == "simulated" and row["device"] == "sim:k80"
    assert row["device_fingerprint"] == identity.fingerprint
    assert row["median_ms"] == row["p10_ms"] == row["p90_ms"] == stage_latency_ms(graph, stage, 32, "k80")
    assert (row["samples"], row["warmup"], row["repeat"]) == (5, 2, 5)
    assert elapsed >= 7 * row["median_ms"] / 1e3 + STAGE_OVERHEAD_S


@pytest.mark.slow
def test_inception_v3_schedules() -> None:
    graph = import_model("inception_v3").graph

    class Sim:
        def __init__(self, gpu: str, batch: int) -> None:
            self.gpu, self.batch = gpu, batch

        def latency(self, stage: Stage) -> float:
            return stage_latency_ms(graph, stage, self.batch, self.gpu)

    def speedup(gpu: str, batch: int) -> tuple[float, list[list[Stage]]]:
        model = Sim(gpu, batch)
        best = optimize_graph(graph, model)
        baseline = sum(sequential(graph, block, model).latency or 0.0 for block in graph.blocks)
        return baseline / best.cost, [list(s.stages) for s in best.schedules]

    v100_1, v100_plan = speedup("v100", 1)
    v100_128, v100_128_plan = speedup("v100", 128)
    k80_1, k80_plan = speedup("k80", 1)
    assert v100_1 >= 1.2
    assert v100_128 < 1.05
    assert k80_1 > 1.0 and k80_plan != v100_plan and v100_128_plan != v100_plan

    plans = {("v100", 1): v100_plan, ("v100", 128): v100_128_plan, ("k80", 1): k80_plan}

    def cost(plan: list[list[Stage]], gpu: str, batch: int) -> float:
        return sum(stage_latency_ms(graph, stage, batch, gpu) for stages in plan for stage in stages)

    for setting, own in plans.items():  # the shape of the paper's Table 3: each schedule wins on its own setting
        assert all(cost(own, *setting) <= cost(other, *setting) for other in plans.values())
        assert any(cost(own, *setting) < cost(other, *setting) for other in plans.values())
