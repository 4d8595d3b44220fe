"""The IOS DP under a peak-memory budget: the fastest schedule whose peak (:mod:`~ios_ray.scheduler.memory`) stays
within it, exactly: a transition over the budget is pruned, not penalised.

Within a block the values alive between two stages are a function of the units done, D, except for one thing:
a merged conv's outputs are slices of one tensor, freed only when the last of them is released, so a merge run
earlier can *pin* memory. The DP's state is therefore (D, P), where P is the set of merge stages run so far whose
memory is still held; the memory between stages is :meth:`~ios_ray.scheduler.memory.BlockMemory.alive` of D plus
what P pins, and a transition D -> D + S' through a candidate stage of S' peaks at that plus what the stage
allocates. The DP runs forward over states by size; the (P, cost) pairs that end one block start the next, so
pins that outlive a block are carried exactly, and the end of the graph adds putting its output together.

The same walk, minimising the highest peak instead of the latency, gives the smallest peak any schedule reaches
(:func:`smallest_peak`), which is what a budget no schedule meets is answered with. Without a budget the search is
:func:`~ios_ray.scheduler.dp.optimize_graph`, unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ios_ray.ir import Graph
from ios_ray.schedule import BlockSchedule
from ios_ray.scheduler.dp import BlockResult, GraphResult, SearchStats
from ios_ray.scheduler.latency import LatencyModel
from ios_ray.scheduler.memory import BlockMemory, GraphMemory
from ios_ray.scheduler.space import BlockSpace, SearchParams, block_spaces
from ios_ray.stage import Stage

#: Merge stages still holding memory, as tuples of their unit ids.
Pins = frozenset[tuple[str, ...]]
#: How a path's value grows through a transition: (value so far, stage latency, transition peak) -> new value,
#: or None where the transition is not allowed.
Step = Callable[[float, float, int], "float | None"]


class OverBudget(ValueError):
    """No schedule keeps within the budget; ``smallest`` is the least peak any schedule reaches (elements per
    sample)."""

    def __init__(self, budget: int, smallest: int) -> None:
        super().__init__(f"no schedule peaks within {budget} elements per sample; the smallest peak is {smallest}")
        self.budget = budget
        self.smallest = smallest


@dataclass(frozen=True)
class _Entry:
    """The best way found to reach one (block, D, P): its value and the step that reached it."""

    value: float
    before: tuple[int, Pins] | None
    stage: Stage | None
    latency: float


def optimize_within(graph: Graph, latency: LatencyModel, budget: int, params: SearchParams = SearchParams(),
                    memory: GraphMemory | None = None) -> GraphResult:
    """The fastest schedule of ``graph`` whose peak is at most ``budget`` elements per sample; :class:`OverBudget`
    where none is."""
    memory = memory or GraphMemory(graph)

    def step(value: float, ms: float, peak: int) -> float | None:
        return value + ms if peak <= budget else None

    found = _walk(graph, params, memory, latency, step)
    if found is None:
        raise OverBudget(budget, smallest_peak(graph, params, memory))
    return GraphResult(found[1])


def smallest_peak(graph: Graph, params: SearchParams = SearchParams(), memory: GraphMemory | None = None) -> int:
    """The least peak, in elements per sample, that any schedule of ``graph`` within ``params`` reaches."""
    found = _walk(graph, params, memory or GraphMemory(graph), _Flat(), lambda value, ms, peak: max(value, peak))
    assert found is not None, "every graph has a schedule"
    return int(found[0])


class _Flat:
    """A latency model that prices every stage at zero (for walks that only look at memory)."""

    def latency(self, stage: Stage) -> float:
        """Zero."""
        return 0.0


def _walk(graph: Graph, params: SearchParams, memory: GraphMemory, latency: LatencyModel, step: Step
          ) -> tuple[float, tuple[BlockResult, ...]] | None:
    """The best path through every block's (D, P) states under ``step``: its value and its blocks' schedules;
    None where no path is allowed."""
    spaces = block_spaces(graph, params)
    starts: dict[Pins, float] = {frozenset(): 0.0}
    tables = []
    prices: dict[Stage, float] = {}
    for number, space in enumerate(spaces):
        block_memory = BlockMemory(memory, space.block)
        table = _block_walk(space, block_memory, latency, prices, step, starts)
        ends: dict[Pins, float | None] = {p: e.value for (state, p), e in table.items() if state == space.full}
        if number == len(spaces) - 1:  # the graph's output is put together after the last stage
            ends = {p: step(v, 0.0, block_memory.between(space.full, p) + memory.output.peak)  # type: ignore[arg-type]
                    for p, v in ends.items()}
        starts = {p: v for p, v in ends.items() if v is not None}
        if not starts:
            return None
        tables.append(table)
    pins = min(starts, key=lambda p: (starts[p], sorted(p)))
    value = starts[pins]
    blocks = []
    for space, table in zip(reversed(spaces), reversed(tables)):
        result, pins = _rebuild(space, table, pins)
        blocks.append(result)
    return value, tuple(reversed(blocks))


def _block_walk(space: BlockSpace, memory: BlockMemory, latency: LatencyModel, prices: dict[Stage, float],
                step: Step, starts: dict[Pins, float]) -> dict[tuple[int, Pins], _Entry]:
    """Forward over one block's states by size, from each start's pins; the best entry per (D, P)."""
    forward: dict[int, list[tuple[int, int]]] = {}
    for state, found in space.states():
        for ending in found:
            forward.setdefault(state & ~ending, []).append((ending, state))
    table = {(0, pins): _Entry(value, None, None, 0.0) for pins, value in starts.items()}
    by_state: dict[int, list[Pins]] = {0: list(starts)}
    for done in sorted(forward, key=lambda m: (m.bit_count(), m)):
        for pins in by_state.get(done, ()):
            entry = table[(done, pins)]
            held = memory.between(done, pins)
            for ending, state in forward[done]:
                for stage in space.stages(ending):
                    ms = prices.get(stage)
                    if ms is None:
                        ms = prices[stage] = latency.latency(stage)
                    value = step(entry.value, ms, held + memory.graph.stage(stage).peak)
                    if value is None or math.isinf(value):
                        continue
                    after = memory.pins_after(state, pins, stage)
                    key = (state, after)
                    old = table.get(key)
                    if old is None or value < old.value:
                        if old is None:
                            by_state.setdefault(state, []).append(after)
                        table[key] = _Entry(value, (done, pins), stage, ms)
    return table


def _rebuild(space: BlockSpace, table: dict[tuple[int, Pins], _Entry], pins: Pins) -> tuple[BlockResult, Pins]:
    """The block's stages on the best path ending in (full, ``pins``), and the pins the block started with."""
    stages: list[Stage] = []
    latencies: list[float] = []
    key = (space.full, pins)
    while True:
        entry = table[key]
        if entry.before is None:
            break
        stages.append(entry.stage)  # type: ignore[arg-type]
        latencies.append(entry.latency)
        key = entry.before
    stages.reverse()
    latencies.reverse()
    schedule = BlockSchedule(space.block.index, tuple(stages), tuple(latencies))
    return BlockResult(schedule, float(sum(latencies)), SearchStats(states=len(table))), key[1]


def fit(graph: Graph, found: GraphResult, latency: LatencyModel, budget: int | None,
        params: SearchParams = SearchParams(), memory: GraphMemory | None = None) -> GraphResult:
    """``found`` (the unbudgeted DP's schedule) where it keeps within ``budget`` elements per sample (or there is no
    budget), else the fastest schedule that does (:func:`optimize_within`): a budget the DP's schedule meets changes
    nothing."""
    memory = memory or GraphMemory(graph)
    if budget is None or memory.schedule_peak([s for b in found.schedules for s in b.stages]).elements <= budget:
        return found
    return optimize_within(graph, latency, budget, params, memory)
