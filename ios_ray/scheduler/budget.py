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

The walk runs on the block's :class:`~ios_ray.scheduler.arrays.BlockArrays` (the states, transitions and
candidate stages the lazy search enumerates), with each candidate's latency and what it allocates looked up once
per block. Where nothing can be pinned (no merge candidate in the block, no pins carried into it) the state is D
alone and the walk is one vectorised pass per level (:class:`_FreeWalk`); otherwise it goes entry by entry over
(D, P) (:class:`_PinnedWalk`). Both break ties alike: among equal values, the transition from the smaller rest
(by size, then mask), then the concurrent candidate before the merge one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ios_ray.ir import Graph
from ios_ray.schedule import BlockSchedule
from ios_ray.scheduler.arrays import MERGE, BlockArrays
from ios_ray.scheduler.dp import BlockResult, GraphResult, SearchStats
from ios_ray.scheduler.latency import LatencyModel
from ios_ray.scheduler.memory import BlockMemory, GraphMemory
from ios_ray.scheduler.space import BlockSpace, SearchParams, block_spaces
from ios_ray.stage import Stage

#: Merge stages still holding memory, as tuples of their unit ids.
Pins = frozenset[tuple[str, ...]]
NO_PINS: Pins = frozenset()
#: How a path's value grows through transitions, elementwise over arrays that broadcast: (values so far, stage
#: latencies, transition peaks) -> new values, ``inf`` where a transition is not allowed.
Step = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class OverBudget(ValueError):
    """No schedule keeps within the budget; ``smallest`` is the least peak any schedule reaches (elements per
    sample)."""

    def __init__(self, budget: int, smallest: int) -> None:
        super().__init__(f"no schedule peaks within {budget} elements per sample; the smallest peak is {smallest}")
        self.budget = budget
        self.smallest = smallest


def optimize_within(graph: Graph, latency: LatencyModel, budget: int, params: SearchParams = SearchParams(),
                    memory: GraphMemory | None = None) -> GraphResult:
    """The fastest schedule of ``graph`` whose peak is at most ``budget`` elements per sample; :class:`OverBudget`
    where none is."""
    memory = memory or GraphMemory(graph)
    found = _walk(graph, params, memory, latency, _within(budget))
    if found is None:
        raise OverBudget(budget, smallest_peak(graph, params, memory))
    return GraphResult(found[1])


def smallest_peak(graph: Graph, params: SearchParams = SearchParams(), memory: GraphMemory | None = None) -> int:
    """The least peak, in elements per sample, that any schedule of ``graph`` within ``params`` reaches."""
    found = _walk(graph, params, memory or GraphMemory(graph), _Flat(), _highest)
    assert found is not None, "every graph has a schedule"
    return int(found[0])


def _within(budget: int) -> Step:
    """The step of :func:`optimize_within`: latencies add up, and a transition peaking over ``budget`` is not
    allowed."""

    def step(values: np.ndarray, ms: np.ndarray, peaks: np.ndarray) -> np.ndarray:
        return np.where(peaks <= budget, values + ms, np.inf)

    return step


def _highest(values: np.ndarray, ms: np.ndarray, peaks: np.ndarray) -> np.ndarray:
    """The step of :func:`smallest_peak`: a path's value is the highest peak on it (latencies aside)."""
    highest: np.ndarray = np.maximum(values, peaks)
    return highest


class _Flat:
    """A latency model that prices every stage at zero (for walks that only look at memory)."""

    def latency(self, stage: Stage) -> float:
        """Zero."""
        return 0.0


@dataclass(frozen=True)
class _Block:
    """One block's space as arrays, with per ending and candidate column (``CONCURRENT``, ``MERGE`` of
    :mod:`~ios_ray.scheduler.arrays`) the stage's ``latency`` and ``peak`` (what it allocates on top of what is
    alive before it), ``inf`` where the ending has no such candidate."""

    space: BlockSpace
    memory: BlockMemory
    arrays: BlockArrays
    stages: tuple[Stage, ...]
    latency: np.ndarray
    peak: np.ndarray

    @staticmethod
    def of(space: BlockSpace, memory: BlockMemory, latency: LatencyModel) -> _Block:
        """The block's arrays, each candidate stage priced once and its allocation computed once."""
        stages: list[Stage] = []

        def number(stage: Stage) -> int:
            stages.append(stage)
            return len(stages) - 1

        arrays = BlockArrays.of(space, number)
        has = arrays.candidates >= 0
        ms = np.array([latency.latency(stage) for stage in stages], dtype=np.float64)
        peaks = np.array([memory.graph.stage(stage).peak for stage in stages], dtype=np.float64)
        return _Block(space, memory, arrays, tuple(stages), np.where(has, ms[arrays.candidates], np.inf),
                      np.where(has, peaks[arrays.candidates], np.inf))

    @property
    def merges(self) -> bool:
        """Whether some ending has a merge candidate (whose slices can pin memory)."""
        return bool((self.arrays.candidates[:, MERGE] >= 0).any())

    def stage(self, ending: int, column: int) -> Stage:
        """The candidate stage of ``ending`` (an index) in ``column``."""
        return self.stages[int(self.arrays.candidates[ending, column])]

    def result(self, stages: list[Stage], latencies: list[float], states: int) -> BlockResult:
        """The block's result for its stages in order (with their latencies), having reached ``states`` entries."""
        schedule = BlockSchedule(self.space.block.index, tuple(stages), tuple(latencies))
        return BlockResult(schedule, float(sum(latencies)), SearchStats(states=states))


def _walk(graph: Graph, params: SearchParams, memory: GraphMemory, latency: LatencyModel, step: Step
          ) -> tuple[float, tuple[BlockResult, ...]] | None:
    """The best path through every block's (D, P) states under ``step``: its value and its blocks' schedules;
    None where no path is allowed."""
    spaces = block_spaces(graph, params)
    starts: dict[Pins, float] = {NO_PINS: 0.0}
    walks: list[_FreeWalk | _PinnedWalk] = []
    for number, space in enumerate(spaces):
        block = _Block.of(space, BlockMemory(memory, space.block), latency)
        if set(starts) == {NO_PINS} and not block.merges:
            walked: _FreeWalk | _PinnedWalk = _FreeWalk(block, step, starts[NO_PINS])
        else:
            walked = _PinnedWalk(block, step, starts)
        starts = walked.ends()
        if number == len(spaces) - 1:  # the graph's output is put together after the last stage
            starts = {p: _output_step(step, v, block.memory.between(space.full, p) + memory.output.peak)
                      for p, v in starts.items()}
            starts = {p: v for p, v in starts.items() if math.isfinite(v)}
        if not starts:
            return None
        walks.append(walked)
    pins = min(starts, key=lambda p: (starts[p], sorted(p)))
    value = starts[pins]
    blocks = []
    for walked in reversed(walks):
        result, pins = walked.rebuild(pins)
        blocks.append(result)
    return value, tuple(reversed(blocks))


def _output_step(step: Step, value: float, held: int) -> float:
    """A path's value once the graph's output is put together, ``held`` elements alive at the highest point."""
    return float(step(np.float64(value), np.float64(0.0), np.float64(held)))


class _FreeWalk:
    """A block where nothing is pinned, walked over D alone: the best value per state (by index), each level of
    states in one vectorised pass (:meth:`~ios_ray.scheduler.arrays.BlockArrays.forward_by`) from ``start``."""

    def __init__(self, block: _Block, step: Step, start: float) -> None:
        self.block, self.step = block, step
        self.held = np.array([block.memory.alive(mask)[0] for mask in block.arrays.masks], dtype=np.float64)
        self.cost = block.arrays.forward_by(lambda before, rest, ending: self._values(before, rest, ending).min(1),
                                            start)

    def _values(self, before: np.ndarray, rest: np.ndarray, ending: np.ndarray) -> np.ndarray:
        """Per transition (from ``rest``, valued ``before``, through ``ending``) and candidate column, its value."""
        block = self.block
        return self.step(before[:, None], block.latency[ending], self.held[rest][:, None] + block.peak[ending])

    def ends(self) -> dict[Pins, float]:
        """The value of the full block (none where it is not reached), all without pins."""
        value = float(self.cost[self.block.arrays.full])
        return {NO_PINS: value} if math.isfinite(value) else {}

    def rebuild(self, pins: Pins) -> tuple[BlockResult, Pins]:
        """The block's stages on the best path to the full block, and the pins it started with (none)."""
        block, arrays = self.block, self.block.arrays
        stages: list[Stage] = []
        latencies: list[float] = []
        state = arrays.full
        while state != 0:
            a, z = arrays.state_start[state], arrays.state_start[state + 1]
            rest, ending = arrays.by_state.rest[a:z], arrays.by_state.ending[a:z]
            rows, columns = np.nonzero(self._values(self.cost[rest], rest, ending) == self.cost[state])
            first = np.lexsort((columns, rest[rows]))[0]
            row, column = rows[first], columns[first]
            stages.append(block.stage(ending[row], column))
            latencies.append(float(block.latency[ending[row], column]))
            state = rest[row]
        stages.reverse()
        latencies.reverse()
        return block.result(stages, latencies, int(np.isfinite(self.cost).sum())), pins


@dataclass(frozen=True)
class _Entry:
    """The best way found to reach one (D, P) of a block: its value and the step that reached it."""

    value: float
    before: tuple[int, Pins] | None
    stage: Stage | None
    latency: float


class _PinnedWalk:
    """A block walked over (D, P), forward over states by size from each start's pins: the best entry per (state
    index, P), the first found among equal values."""

    def __init__(self, block: _Block, step: Step, starts: dict[Pins, float]) -> None:
        self.block = block
        self.table = {(0, pins): _Entry(value, None, None, 0.0) for pins, value in starts.items()}
        self.by_state: dict[int, list[Pins]] = {0: list(starts)}
        by_state = block.arrays.by_state
        order = np.argsort(by_state.rest, kind="stable")
        endings, states = by_state.ending[order], by_state.state[order]
        bounds = np.searchsorted(by_state.rest[order], np.arange(len(block.arrays.masks) + 1))
        for done in range(len(block.arrays.masks)):
            a, z = bounds[done], bounds[done + 1]
            for pins in self.by_state.get(done, ()):
                self._expand(done, pins, endings[a:z], states[a:z], step)

    def _expand(self, done: int, pins: Pins, endings: np.ndarray, states: np.ndarray, step: Step) -> None:
        """Every allowed transition from (``done``, ``pins``) through each candidate of ``endings`` (leading to
        ``states``), kept where it improves on the entry it reaches."""
        block, table = self.block, self.table
        masks = block.arrays.masks
        entry = table[(done, pins)]
        held = block.memory.between(masks[done], pins)
        values = step(np.float64(entry.value), block.latency[endings], held + block.peak[endings])
        for row, column in zip(*np.nonzero(np.isfinite(values))):
            state, stage, value = int(states[row]), block.stage(endings[row], column), float(values[row, column])
            key = (state, block.memory.pins_after(masks[state], pins, stage))
            old = table.get(key)
            if old is None or value < old.value:
                if old is None:
                    self.by_state.setdefault(state, []).append(key[1])
                table[key] = _Entry(value, (done, pins), stage, float(block.latency[endings[row], column]))

    def ends(self) -> dict[Pins, float]:
        """The value of each pins the full block is reached with."""
        full = self.block.arrays.full
        return {p: e.value for (state, p), e in self.table.items() if state == full}

    def rebuild(self, pins: Pins) -> tuple[BlockResult, Pins]:
        """The block's stages on the best path ending in (full, ``pins``), and the pins the block started with."""
        stages: list[Stage] = []
        latencies: list[float] = []
        key = (self.block.arrays.full, pins)
        while True:
            entry = self.table[key]
            if entry.before is None:
                break
            stages.append(entry.stage)  # type: ignore[arg-type]
            latencies.append(entry.latency)
            key = entry.before
        stages.reverse()
        latencies.reverse()
        return self.block.result(stages, latencies, len(self.table)), key[1]


def fit(graph: Graph, found: GraphResult, latency: LatencyModel, budget: int | None,
        params: SearchParams = SearchParams(), memory: GraphMemory | None = None) -> GraphResult:
    """``found`` (the unbudgeted DP's schedule) where it keeps within ``budget`` elements per sample (or there is no
    budget), else the fastest schedule that does (:func:`optimize_within`): a budget the DP's schedule meets changes
    nothing."""
    memory = memory or GraphMemory(graph)
    if budget is None or memory.schedule_peak([s for b in found.schedules for s in b.stages]).elements <= budget:
        return found
    return optimize_within(graph, latency, budget, params, memory)
