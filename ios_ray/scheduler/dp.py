"""The IOS dynamic program: the fastest schedule of each block under a latency model.

For a state S (the units still to schedule) the last stage must run an ending S' of S, so

    cost[S] = min over endings S' of S of (cost[S - S'] + stage_latency[S']),    cost[{}] = 0,

where ``stage_latency[S']`` is the better of the candidate stages of S' (``concurrent``, and ``merge`` where it
applies). States are memoised, and so is each ending's best latency: the same S' appears under many S, and the
latency model is asked about it once per block. The hot loop works on int masks only; stages are built for an
ending only when it is first priced, and again for the chosen endings when the schedule is rebuilt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ios_ray.ir import Block, Graph
from ios_ray.schedule import BlockSchedule
from ios_ray.scheduler.latency import LatencyModel
from ios_ray.scheduler.space import BlockSpace, SearchParams, block_spaces
from ios_ray.stage import Stage


@dataclass(frozen=True)
class SearchStats:
    """How much work a search did: states solved, (state, ending) transitions, stages asked of the model."""

    states: int = 0
    transitions: int = 0
    stages: int = 0

    def __add__(self, other: SearchStats) -> SearchStats:
        return SearchStats(
            self.states + other.states, self.transitions + other.transitions, self.stages + other.stages
        )


@dataclass(frozen=True)
class BlockResult:
    """The best schedule found for one block, its cost in ms, and the search statistics."""

    schedule: BlockSchedule
    cost: float
    stats: SearchStats


@dataclass(frozen=True)
class GraphResult:
    """The best schedule of every block of a graph."""

    blocks: tuple[BlockResult, ...]

    @property
    def schedules(self) -> tuple[BlockSchedule, ...]:
        """The block schedules, in block order."""
        return tuple(b.schedule for b in self.blocks)

    @property
    def cost(self) -> float:
        """The predicted latency of the whole graph in ms."""
        return sum(b.cost for b in self.blocks)

    @property
    def stats(self) -> SearchStats:
        """The statistics summed over blocks."""
        return sum((b.stats for b in self.blocks), SearchStats())


def optimize_graph(graph: Graph, latency: LatencyModel, params: SearchParams = SearchParams()) -> GraphResult:
    """Run the DP on every block of ``graph``."""
    if not graph.blocks:
        raise ValueError(f"graph {graph.name!r} has no blocks to schedule")
    return GraphResult(tuple(_optimize(space, latency) for space in block_spaces(graph, params)))


def optimize_block(
    graph: Graph, block: Block, latency: LatencyModel, params: SearchParams = SearchParams()
) -> BlockResult:
    """Run the DP on one block and rebuild its best schedule."""
    return _optimize(BlockSpace(graph, block, params), latency)


def _optimize(space: BlockSpace, latency: LatencyModel) -> BlockResult:
    """Run the DP on one block's space and rebuild its best schedule."""
    dp = _BlockDP(space, latency)
    cost = dp.solve(space.full)
    if math.isinf(cost):
        raise ValueError(f"block {space.block.index} has no schedule of finite latency")
    stats = SearchStats(states=len(dp.cost) - 1, transitions=dp.transitions, stages=dp.asked)
    return BlockResult(dp.schedule(space.block.index), cost, stats)


class _BlockDP:
    """The memo tables of one DP run: cost and choice per state, best latency per ending, endings that merge."""

    def __init__(self, space: BlockSpace, model: LatencyModel) -> None:
        self.space = space
        self.model = model
        self.cost: dict[int, float] = {0: 0.0}
        self.choice: dict[int, int] = {}
        self.stage_latency: dict[int, float] = {}
        self.merged: set[int] = set()
        self.transitions = 0
        self.asked = 0

    def solve(self, state: int) -> float:
        """``cost[state]``, solving the states it depends on first (recursion depth <= units in the block)."""
        cost, stage_latency = self.cost, self.stage_latency
        best, choice = math.inf, 0
        found = self.space.endings(state)
        for ending in found:
            latency = stage_latency.get(ending)
            if latency is None:
                latency = self._price(ending)
            rest = state & ~ending
            before = cost.get(rest)
            if before is None:
                before = self.solve(rest)
            if before + latency < best:
                best, choice = before + latency, ending
        self.transitions += len(found)
        cost[state] = best
        self.choice[state] = choice
        return best

    def _price(self, ending: int) -> float:
        """Ask the model about each candidate stage of ``ending``; remember the fastest."""
        best, fastest = math.inf, "concurrent"
        for stage in self.space.stages(ending):
            latency = self.model.latency(stage)
            self.asked += 1
            if latency < best:
                best, fastest = latency, stage.strategy
        if fastest == "merge":
            self.merged.add(ending)
        self.stage_latency[ending] = best
        return best

    def schedule(self, block: int) -> BlockSchedule:
        """The schedule of the full block, rebuilt from the choices (last stage first, then reversed)."""
        stages: list[Stage] = []
        latencies: list[float] = []
        state = self.space.full
        while state:
            ending = self.choice[state]
            strategy = "merge" if ending in self.merged else "concurrent"
            stages.append(next(s for s in self.space.stages(ending) if s.strategy == strategy))
            latencies.append(self.stage_latency[ending])
            state &= ~ending
        return BlockSchedule(block, tuple(reversed(stages)), tuple(reversed(latencies)))
