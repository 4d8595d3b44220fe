"""Example tests of the search: endings, width, merge, baselines, latency tables, planning, parameters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.synthetic import SyntheticCost
from ios_ray.errors import UserError
from ios_ray.ir import GRAPH_INPUT, Block, Graph, Unit, Value
from ios_ray.scheduler import (
    BlockDag,
    MissingLatencyError,
    SearchParams,
    TableLatency,
    BlockSpace,
    count_block,
    endings,
    greedy,
    optimize_block,
    optimize_graph,
    plan_graph,
    sequential,
)
from tests.random_graphs import conv_unit, dag_graph, randwire_preds
from ios_ray.scheduler import space as space_module
from ios_ray.scheduler.space import block_spaces
from ios_ray.stage import Stage, StageKeys

UNPRUNED = SearchParams(r=None, s=None)

# p=0, q=1 and x=2 are incomparable; a=3 reads p and x, b=4 reads q and x. The ending grown from p and q has two
# groups, and adding x joins them into one: pruning on the group count mid-way would lose {p, q, x, a, b}.
JOINED = [[], [], [], [0, 2], [1, 2]]


def ending_sets(graph: Graph, state: int | None = None, params: SearchParams = UNPRUNED) -> set[tuple[str, ...]]:
    """The endings of ``state`` (default: the whole block) as tuples of unit ids."""
    dag = BlockDag.of(graph, graph.blocks[0])
    return {dag.ids(e) for e in endings(dag, dag.full if state is None else state, params.r, params.s)}


def fan_graph(kernels: tuple[int, ...], acts: tuple[str | None, ...] | None = None) -> Graph:
    """Convs with these kernel sizes (and activations) all reading the graph input, then one conv reading them."""
    branches = [conv_unit(f"b{i}", [GRAPH_INPUT], 32, 64, k) for i, k in enumerate(kernels)]
    if acts is not None:
        branches = [replace(b, attrs={**b.attrs, "act": act}) for b, act in zip(branches, acts)]
    join = conv_unit("join", [b.id for b in branches], 64 * len(branches), 32, 1)
    units = (*branches, join)
    return Graph("fan", (32, 8, 8), units, Value.of("join"), (Block(0, tuple(u.id for u in units)),))


def twin_blocks_graph() -> Graph:
    """Two identical diamond blocks in a row: two convs on the block input, joined by a third."""
    units: list[Unit] = []
    blocks = []
    source = GRAPH_INPUT
    for index in range(2):
        a = conv_unit(f"a{index}", [source], 32, 64, 3)
        b = conv_unit(f"b{index}", [source], 32, 16, 1)
        c = conv_unit(f"c{index}", [a.id, b.id], 80, 32, 3)
        units += [a, b, c]
        blocks.append(Block(index, (a.id, b.id, c.id)))
        source = c.id
    return Graph("twins", (32, 8, 8), tuple(units), Value.of(source), tuple(blocks))


def test_endings_keep_groups_joined_by_a_later_unit() -> None:
    graph = dag_graph(JOINED)
    assert ("u0", "u1", "u2", "u3", "u4") in ending_sets(graph, params=SearchParams(r=None, s=1))
    assert ("u0", "u1", "u3", "u4") not in ending_sets(graph, params=SearchParams(r=None, s=1))
    assert ("u0", "u1", "u3", "u4") in ending_sets(graph, params=SearchParams(r=None, s=2))


def test_endings_of_a_diamond() -> None:
    graph = dag_graph([[], [0], [0], [1, 2]])
    assert ending_sets(graph) == {
        ("u3",), ("u1", "u3"), ("u2", "u3"), ("u1", "u2", "u3"), ("u0", "u1", "u2", "u3"),
    }
    assert ending_sets(graph, params=SearchParams(r=2, s=None)) == {("u3",), ("u1", "u3"), ("u2", "u3")}
    assert ending_sets(graph, state=0b0111) == {("u1",), ("u2",), ("u1", "u2"), ("u0", "u1", "u2")}


@pytest.mark.parametrize(
    ("preds", "width"),
    [([[]], 1), ([[], [0], [1]], 1), ([[], [], [], []], 4), ([[], [0], [0], [1, 2]], 2), (JOINED, 3)],
)
def test_width_is_the_largest_antichain(preds: list[list[int]], width: int) -> None:
    graph = dag_graph(preds)
    assert BlockDag.of(graph, graph.blocks[0]).width == width


def test_block_out_of_topological_order_is_rejected() -> None:
    graph = dag_graph([[], [0]])
    with pytest.raises(ValueError, match="before its input"):
        BlockDag.of(graph, Block(0, ("u1", "u0")))


def test_merge_is_chosen_when_it_pays() -> None:
    graph = fan_graph((1, 3, 3))
    cost = SyntheticCost(graph)
    stages = optimize_block(graph, graph.blocks[0], cost, SearchParams()).schedule.stages
    assert Stage("merge", (("b0",), ("b1",), ("b2",))) in stages
    without = optimize_block(graph, graph.blocks[0], cost, SearchParams(strategies=("concurrent",)))
    assert all(s.strategy == "concurrent" for s in without.schedule.stages)


def test_merge_only_falls_back_to_single_units() -> None:
    graph = fan_graph((1, 3), acts=("relu", None))
    result = optimize_block(graph, graph.blocks[0], SyntheticCost(graph), SearchParams(strategies=("merge",)))
    assert [s.units for s in result.schedule.stages][-1] == ("join",)
    assert all(s.strategy == "concurrent" and len(s.units) == 1 for s in result.schedule.stages)


def test_synthetic_cost_is_not_additive() -> None:
    graph = fan_graph((3, 3))
    cost = SyntheticCost(graph)
    alone = [cost.latency(Stage("concurrent", ((u,),))) for u in ("b0", "b1")]
    together = cost.latency(Stage("concurrent", (("b0",), ("b1",))))
    merged = cost.latency(Stage("merge", (("b0",), ("b1",))))
    assert merged < together < sum(alone)


def test_baselines() -> None:
    graph = dag_graph([[], [0], [0], [1, 2]])
    cost = SyntheticCost(graph)
    block = graph.blocks[0]
    assert [s.units for s in sequential(graph, block, cost).stages] == [("u0",), ("u1",), ("u2",), ("u3",)]
    greedy_schedule = greedy(graph, block, cost)
    assert [s.groups for s in greedy_schedule.stages] == [(("u0",),), (("u1",), ("u2",)), (("u3",),)]
    assert greedy_schedule.latencies == tuple(cost.latency(s) for s in greedy_schedule.stages)


def test_table_latency_reproduces_the_model_it_was_filled_from() -> None:
    graph = dag_graph(randwire_preds(nodes=10, seed=3), seed=3)
    keys = StageKeys(graph)
    cost = SyntheticCost(graph)
    plan = plan_graph(graph, SearchParams(), keys)
    table = TableLatency(keys, {key: cost.latency(p.stage) for key, p in plan.stages.items()})
    from_table = optimize_graph(graph, table, SearchParams())
    assert from_table.cost == optimize_graph(graph, cost, SearchParams()).cost


def test_table_latency_names_the_missing_stage() -> None:
    graph = fan_graph((1, 3))
    keys = StageKeys(graph)
    stage = Stage("concurrent", (("b0",),))
    with pytest.raises(MissingLatencyError, match=keys.key(stage)) as error:
        TableLatency(keys, {}).latency(stage)
    assert isinstance(error.value, KeyError)


def test_plan_shares_stages_across_identical_blocks() -> None:
    graph = twin_blocks_graph()
    plan = plan_graph(graph, SearchParams())
    assert plan.blocks[0].keys == plan.blocks[1].keys
    assert len(plan.stages) == len(plan.blocks[0].keys) < plan.block_stage_sum
    assert all(p.description.startswith('{"groups"') for p in plan.stages.values())


def same_shape_blocks_graph() -> Graph:
    """Three blocks: two fans of the same DAG (the first's branches can merge, the second's cannot: their
    activations differ), then a two-conv chain."""
    units: list[Unit] = []
    blocks = []
    source = GRAPH_INPUT
    for index, acts in enumerate((("relu", "relu"), ("relu", None))):
        branches = [replace(conv_unit(f"f{index}b{i}", [source], 32, 32, 3), attrs={
            **conv_unit("x", [source], 32, 32, 3).attrs, "act": act}) for i, act in enumerate(acts)]
        join = conv_unit(f"f{index}j", [b.id for b in branches], 64, 32, 1)
        units += [*branches, join]
        blocks.append(Block(index, tuple(u.id for u in (*branches, join))))
        source = join.id
    chain = [conv_unit("c0", [source], 32, 32, 3), conv_unit("c1", ["c0"], 32, 32, 3)]
    units += chain
    blocks.append(Block(2, ("c0", "c1")))
    return Graph("same_shapes", (32, 8, 8), tuple(units), Value.of("c1"), tuple(blocks))


@pytest.mark.parametrize("params", [SearchParams(), SearchParams(strategies=("merge",)), SearchParams(r=1, s=2)])
def test_blocks_of_one_shape_share_their_endings_and_keep_their_own_stages(
    params: SearchParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = same_shape_blocks_graph()
    calls = []
    monkeypatch.setattr(space_module, "endings", lambda *args: calls.append(args[1]) or endings(*args))
    shared = block_spaces(graph, params)
    walked = [dict(space.states()) for space in shared]
    alone = [dict(BlockSpace(graph, block, params).states()) for block in graph.blocks]
    assert walked == alone
    # Shared: the second fan asked for no endings of its own; the chain has its own shape.
    assert len(calls) == len(walked[0]) + len(walked[2]) + sum(map(len, alone))
    result = optimize_graph(graph, SyntheticCost(graph), params)
    assert result.schedules == tuple(
        optimize_block(graph, block, SyntheticCost(graph), params).schedule for block in graph.blocks)
    branches = 0b011  # the two convs of a fan: a merge candidate in the first fan only
    merges = [[s.strategy for s in space.stages(branches)].count("merge") for space in shared[:2]]
    assert merges == ([1, 0] if "merge" in params.strategies else [0, 0])


def test_graph_result_sums_its_blocks() -> None:
    graph = twin_blocks_graph()
    result = optimize_graph(graph, SyntheticCost(graph))
    assert [s.block for s in result.schedules] == [0, 1]
    assert result.cost == pytest.approx(sum(s.latency for s in result.schedules))
    assert result.stats.states == sum(b.stats.states for b in result.blocks)


def test_counts_with_and_without_pruning() -> None:
    graph = dag_graph([[], [], [], [0, 1, 2]])
    params = SearchParams(r=1, s=2)
    pruned = count_block(graph, graph.blocks[0], params)
    unpruned = count_block(graph, graph.blocks[0], params.unpruned)
    assert (unpruned.units, unpruned.width) == (4, 3)
    assert unpruned.states == 8  # {u0,u1,u2,u3} and the 7 non-empty subsets of {u0,u1,u2}
    assert pruned.transitions < unpruned.transitions
    assert unpruned.stages > unpruned.transitions / unpruned.states


@pytest.mark.parametrize(
    "kwargs", [{"r": 0}, {"s": -1}, {"r": 2.5}, {"strategies": ()}, {"strategies": ("fuse",)}]
)
def test_bad_params_are_user_errors(kwargs: dict) -> None:
    with pytest.raises(UserError):
        SearchParams(**kwargs)
