"""Property tests of the budgeted DP against brute force, on random DAGs of convs.

Every schedule of the block is enumerated front to back (the brute force of ``test_search_props``) and its peak
replayed stage by stage (:meth:`GraphMemory.schedule_peak`, which follows what the runtime allocates and frees,
and does not share the DP's per-state view); the budgeted DP must find the least latency among the schedules
within the budget, and fail exactly where none is.
"""

from __future__ import annotations

import dataclasses
import math
from itertools import product

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from bench.synthetic import SyntheticCost
from ios_ray.ir import Block, Graph
from ios_ray.scheduler import SearchParams, optimize_block, optimize_graph
from ios_ray.scheduler.budget import (NO_PINS, OverBudget, _Block, _Flat, _FreeWalk, _highest, _PinnedWalk,
                                      _within, optimize_within, smallest_peak)
from ios_ray.scheduler.memory import BlockMemory, GraphMemory
from ios_ray.scheduler.space import block_spaces
from tests.test_search_props import PROPS, all_schedules, count_schedules, dags, params_strategy, schedule_space


def brute(graph: Graph, params: SearchParams) -> list[tuple[float, int]]:
    """(latency, peak in elements per sample) of every schedule of the graph: every block's schedules, chained."""
    stages_from = schedule_space(graph, params)
    blocks = [frozenset(block.units) for block in graph.blocks]
    assume(math.prod(count_schedules(stages_from, units) for units in blocks) <= 2000)
    cost, memory = SyntheticCost(graph), GraphMemory(graph)
    found = []
    for parts in product(*(list(all_schedules(stages_from, units)) for units in blocks)):
        schedule = [stage for part in parts for stage in part]
        found.append((sum(cost.latency(s) for s in schedule), memory.schedule_peak(schedule).elements))
    return found


def split(graph: Graph, where: float) -> Graph:
    """The graph with its one block cut in two at a point in topological order (values and merges then cross)."""
    units = graph.blocks[0].units
    cut = max(1, min(len(units) - 1, round(where * len(units))))
    if len(units) < 2:
        return graph
    return dataclasses.replace(graph, blocks=(Block(0, units[:cut]), Block(1, units[cut:])))


@PROPS
@given(dags(8), params_strategy(), st.floats(0.0, 1.0), st.none() | st.floats(0.0, 1.0))
def test_budgeted_dp_equals_brute_force(graph: Graph, params: SearchParams, where: float, cut: float | None
                                        ) -> None:
    graph = graph if cut is None else split(graph, cut)
    found = brute(graph, params)
    peaks = sorted({peak for _, peak in found})
    budget = peaks[0] - 1 + int(where * (peaks[-1] - peaks[0] + 2))
    within = [ms for ms, peak in found if peak <= budget]
    assert smallest_peak(graph, params) == peaks[0]
    assert GraphMemory(graph).least_peak() <= peaks[0]
    cost = SyntheticCost(graph)
    if not within:
        with pytest.raises(OverBudget) as error:
            optimize_within(graph, cost, budget, params)
        assert error.value.smallest == peaks[0]
        return
    result = optimize_within(graph, cost, budget, params)
    assert math.isclose(result.cost, min(within), rel_tol=1e-9)
    stages = [stage for block in result.schedules for stage in block.stages]
    assert GraphMemory(graph).schedule_peak(stages).elements <= budget


@PROPS
@given(dags(9), params_strategy())
def test_a_budget_every_schedule_meets_changes_nothing(graph: Graph, params: SearchParams) -> None:
    cost = SyntheticCost(graph)
    unbudgeted = optimize_block(graph, graph.blocks[0], cost, params)
    loose = optimize_within(graph, cost, 10**12, params)
    assert math.isclose(loose.cost, unbudgeted.cost, rel_tol=1e-9)
    assert optimize_graph(graph, cost, params).schedules == (unbudgeted.schedule,)


@PROPS
@given(dags(9), st.sampled_from([None, 1, 2, 3]), st.floats(-0.1, 1.0), st.booleans())
def test_where_nothing_pins_the_vectorised_walk_is_the_general_one(graph: Graph, bound: int | None, where: float,
                                                                    flat: bool) -> None:
    """A block without merge candidates is walked level by level as arrays; the walk over (D, P) entry by entry
    must give the same values, schedules and state counts, ties included (at 0 ms every schedule ties)."""
    params = SearchParams(bound, bound, ("concurrent",))
    space = block_spaces(graph, params)[0]
    memory = GraphMemory(graph)
    block = _Block.of(space, BlockMemory(memory, space.block), _Flat() if flat else SyntheticCost(graph))
    assert not block.merges
    least = smallest_peak(graph, params, memory)
    for step in (_highest, _within(least + int(where * least))):
        free, general = _FreeWalk(block, step, 0.0), _PinnedWalk(block, step, {NO_PINS: 0.0})
        assert free.ends() == general.ends()
        if free.ends():
            assert free.rebuild(NO_PINS) == general.rebuild(NO_PINS)
