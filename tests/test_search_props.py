"""Property tests of the search against brute force, on random DAGs of convs.

The brute forces here are written from the definitions, not from the search code: endings are every subset with
no edge leaving it, groups are networkx's weakly connected components, and schedules are enumerated front to
back (each stage closed under predecessors within what remains), the opposite direction from the DP.
"""

from __future__ import annotations

import math
from functools import cache
from itertools import combinations
from typing import Iterator

import networkx as nx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bench.synthetic import SyntheticCost
from ios_ray.ir import Graph
from ios_ray.schedule import Schedule, check_schedule
from ios_ray.scheduler import (
    BlockDag,
    SearchParams,
    endings,
    greedy,
    optimize_block,
    plan_graph,
    sequential,
)
from tests.random_graphs import dag_graph
from ios_ray.stage import Stage, StageKeys, can_merge

BOUNDS = st.sampled_from([None, 1, 2, 3])
STRATEGIES = st.sampled_from([("concurrent", "merge"), ("concurrent",), ("merge",)])
PROPS = settings(max_examples=100, deadline=None,  # no timing limits: load on a shared machine would break them
                 suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
MANY = settings(PROPS, max_examples=300)


@st.composite
def dags(draw: st.DrawFn, max_units: int) -> Graph:
    """A one-block graph of ``1..max_units`` convs, each reading up to three earlier units."""
    units = draw(st.integers(1, max_units))
    preds = [sorted(draw(st.sets(st.integers(0, j - 1), max_size=3))) if j else [] for j in range(units)]
    return dag_graph(preds, seed=draw(st.integers(0, 1000)))


def digraph(graph: Graph) -> nx.DiGraph:
    """The block's units and the edges between them, as networkx sees them."""
    g = nx.DiGraph()
    g.add_nodes_from(u.id for u in graph.units)
    g.add_edges_from((s, u.id) for u in graph.units for s in u.sources if s in g)
    return g


def groups_of(g: nx.DiGraph, units: frozenset[str]) -> list[tuple[str, ...]]:
    """The weakly connected components of ``units``, each in topological order, by first unit."""
    order = {u: i for i, u in enumerate(g.nodes)}
    found = [tuple(sorted(c, key=order.__getitem__)) for c in nx.weakly_connected_components(g.subgraph(units))]
    return sorted(found, key=lambda c: order[c[0]])


def within_bounds(groups: list[tuple[str, ...]], params: SearchParams) -> bool:
    """Whether a stage with these groups passes the pruning of ``params``."""
    return (params.r is None or all(len(c) <= params.r for c in groups)) and (
        params.s is None or len(groups) <= params.s
    )


def subsets(units: frozenset[str]) -> Iterator[frozenset[str]]:
    """Every non-empty subset."""
    items = sorted(units)
    return (frozenset(c) for k in range(1, len(items) + 1) for c in combinations(items, k))


def brute_endings(g: nx.DiGraph, state: frozenset[str], params: SearchParams) -> set[frozenset[str]]:
    """Every subset of ``state`` with no edge into the rest of ``state``, within the pruning bounds."""
    return {
        part
        for part in subsets(state)
        if not any(v in state - part for u in part for v in g.successors(u))
        and within_bounds(groups_of(g, part), params)
    }


def candidate_stages(graph: Graph, g: nx.DiGraph, part: frozenset[str], params: SearchParams) -> list[Stage]:
    """The stages that may run ``part``, straight from the rules in SearchParams' docstring."""
    groups = groups_of(g, part)
    found = []
    if "concurrent" in params.strategies or len(part) == 1:
        found.append(Stage("concurrent", tuple(groups)))
    if "merge" in params.strategies and all(len(c) == 1 for c in groups) and can_merge(graph, [c[0] for c in groups]):
        found.append(Stage("merge", tuple(groups)))
    return found


def schedule_space(graph: Graph, params: SearchParams):
    """``stages_from(remaining)``: every stage that can run first among ``remaining`` units (front to back)."""
    g = digraph(graph)

    @cache
    def stages_from(remaining: frozenset[str]) -> tuple[Stage, ...]:
        found = []
        for part in subsets(remaining):
            closed = not any(p in remaining - part for u in part for p in g.predecessors(u))
            if closed and within_bounds(groups_of(g, part), params):
                found += candidate_stages(graph, g, part, params)
        return tuple(found)

    return stages_from


def count_schedules(stages_from, remaining: frozenset[str]) -> int:
    """How many schedules the brute force would enumerate."""

    @cache
    def count(rest: frozenset[str]) -> int:
        return 1 if not rest else sum(count(rest - set(s.units)) for s in stages_from(rest))

    return count(remaining)


def all_schedules(stages_from, remaining: frozenset[str]) -> Iterator[tuple[Stage, ...]]:
    """Every schedule of ``remaining``, as a sequence of stages."""
    if not remaining:
        yield ()
        return
    for stage in stages_from(remaining):
        for rest in all_schedules(stages_from, remaining - set(stage.units)):
            yield (stage, *rest)


def params_strategy() -> st.SearchStrategy[SearchParams]:
    """Search parameters with every combination of bounds and strategies."""
    return st.builds(SearchParams, r=BOUNDS, s=BOUNDS, strategies=STRATEGIES)


class Recorder:
    """A latency model that answers with the synthetic cost and records every stage it is asked about."""

    def __init__(self, graph: Graph) -> None:
        self.cost = SyntheticCost(graph)
        self.asked: list[Stage] = []

    def latency(self, stage: Stage) -> float:
        """The synthetic latency of ``stage``, recorded."""
        self.asked.append(stage)
        return self.cost.latency(stage)


@MANY
@given(dags(12), params_strategy(), st.data())
def test_endings_equal_brute_force(graph: Graph, params: SearchParams, data: st.DataObject) -> None:
    dag = BlockDag.of(graph, graph.blocks[0])
    g = digraph(graph)
    picked = data.draw(st.sets(st.sampled_from(dag.units), min_size=1))
    state_ids = frozenset(picked).union(*(nx.ancestors(g, u) for u in picked))
    state = dag.mask(state_ids)
    for s in (dag.full, state):
        found = endings(dag, s, params.r, params.s)
        assert len(found) == len(set(found)), "an ending was enumerated twice"
        expected = brute_endings(g, frozenset(dag.ids(s)), params)
        assert {frozenset(dag.ids(e)) for e in found} == expected


@PROPS
@given(dags(9), params_strategy())
def test_dp_equals_brute_force(graph: Graph, params: SearchParams) -> None:
    stages_from = schedule_space(graph, params)
    units = frozenset(graph.blocks[0].units)
    assume(count_schedules(stages_from, units) <= 3000)
    cost = SyntheticCost(graph)
    best = min(sum(cost.latency(s) for s in schedule) for schedule in all_schedules(stages_from, units))
    result = optimize_block(graph, graph.blocks[0], cost, params)
    assert math.isclose(result.cost, best, rel_tol=1e-9)


def at_most(cost: float, bound: float) -> bool:
    """``cost <= bound`` up to float rounding (the DP and a baseline sum the same stages in different orders)."""
    return cost <= bound or math.isclose(cost, bound, rel_tol=1e-9)


@PROPS
@given(dags(10), params_strategy())
def test_schedule_is_valid_and_priced(graph: Graph, params: SearchParams) -> None:
    block = graph.blocks[0]
    cost = SyntheticCost(graph)
    result = optimize_block(graph, block, cost, params)
    schedule = result.schedule
    check_schedule(Schedule(graph.name, graph.fingerprint, "cpu", 1, (schedule,)), graph)
    assert schedule.latency == pytest.approx(result.cost, rel=1e-9)  # the DP sums the stages in another order
    assert schedule.latencies == tuple(cost.latency(s) for s in schedule.stages)
    g = digraph(graph)
    for stage in schedule.stages:
        part = frozenset(stage.units)
        assert stage in candidate_stages(graph, g, part, params)
        assert within_bounds(groups_of(g, part), params)
    assert at_most(result.cost, sequential(graph, block, cost).latency)
    if params.r is None and params.s is None and "concurrent" in params.strategies:
        assert at_most(result.cost, greedy(graph, block, cost).latency)


@PROPS
@given(dags(10), params_strategy())
def test_plan_covers_what_the_dp_asks(graph: Graph, params: SearchParams) -> None:
    keys = StageKeys(graph)
    plan = plan_graph(graph, params, keys)
    recorder = Recorder(graph)
    result = optimize_block(graph, graph.blocks[0], recorder, params)
    asked = {keys.key(stage) for stage in recorder.asked}
    assert asked <= set(plan.stages)
    for baseline in (sequential, greedy):
        assert {keys.key(s) for s in baseline(graph, graph.blocks[0], recorder).stages} <= set(plan.stages)
    counts = plan.blocks[0].counts
    stats = result.stats
    assert (counts.states, counts.transitions, counts.stages) == (stats.states, stats.transitions, stats.stages)
    assert len(recorder.asked) >= stats.stages
