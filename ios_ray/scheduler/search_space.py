"""The search space of a graph as arrays, built once (:class:`SearchSpace`): numbered stages, each block's states,
transitions and candidates (:mod:`~ios_ray.scheduler.arrays`), identical blocks once, and the plan of the search.
Every search solves its DP over measured stages here (:meth:`SearchSpace.optimize`); the lazy search
(:mod:`~ios_ray.scheduler.lazy`) extends it with what its estimates relate.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

from ios_ray.ir import Graph
from ios_ray.schedule import BlockSchedule
from ios_ray.scheduler.arrays import BlockArrays
from ios_ray.scheduler.dp import BlockResult, GraphResult, SearchStats
from ios_ray.scheduler.plan import Plan, PlannedStage, plan_found
from ios_ray.scheduler.relations import StageIndex
from ios_ray.scheduler.space import BlockSpace, SearchParams, block_spaces
from ios_ray.stage import StageKeys

#: How many :func:`collection_paused` bodies run now, under a lock, and whether the collector ran before the first.
_paused = 0
_paused_lock = threading.Lock()
_enabled_before = False


@dataclass(frozen=True)
class SearchSpace:
    """The search space of a graph as arrays, built once: numbered stages, the blocks as arrays (identical ones
    once: ``copies`` counts them, ``arrays_of`` maps each of the graph's blocks to its arrays), and the plan of the
    search (as :func:`~ios_ray.scheduler.plan.plan_graph` gives it, found by the same walk). Every search solves its
    DP over measured stages here (:meth:`optimize`): one DP path, one tie-break."""

    graph: Graph
    params: SearchParams
    planned: tuple[PlannedStage, ...]
    blocks: tuple[BlockArrays, ...]
    copies: tuple[int, ...]
    arrays_of: tuple[int, ...]
    plan: Plan

    @staticmethod
    def build(graph: Graph, params: SearchParams, keys: StageKeys | None = None) -> SearchSpace:
        """The search space of ``graph`` under ``params``."""
        with collection_paused():
            return walked(graph, params, keys)[1]

    @functools.cached_property
    def keys(self) -> list[str]:
        """Every stage key the lazy search may ask for, by stage number."""
        return [p.key for p in self.planned]

    @functools.cached_property
    def audit_rank(self) -> np.ndarray:
        """Per stage number, its place in the fixed random order audit samples are drawn in."""
        return np.random.default_rng(0).permutation(len(self.planned))

    @functools.cached_property
    def numbers(self) -> dict[str, int]:
        """Stage number by key."""
        return {key: number for number, key in enumerate(self.keys)}

    def vector(self, table: Mapping[str, float]) -> np.ndarray:
        """Latencies by stage number from a table by key; NaN where the table has none (keys of other stages in
        the table are ignored)."""
        latency = np.full(len(self.planned), math.nan)
        numbers = self.numbers
        for key, ms in table.items():
            if key in numbers:
                latency[numbers[key]] = ms
        return latency

    def optimize(self, table: Mapping[str, float]) -> GraphResult:
        """The DP's best schedule of every block over the stages ``table`` has (by key): what
        :func:`~ios_ray.scheduler.dp.optimize_graph` finds with every other stage at ``inf``, from the arrays
        instead of walking the spaces again."""
        latency = self.vector(table)
        latency[np.isnan(latency)] = math.inf
        return GraphResult(tuple(_best_schedule(BlockSpace(self.graph, block, self.params), self.blocks[unique],
                                                latency) for block, unique in zip(self.graph.blocks, self.arrays_of)))


def _best_schedule(space: BlockSpace, arrays: BlockArrays, latency: np.ndarray) -> BlockResult:
    """The best schedule of ``space``'s block (whose arrays are ``arrays``) under stage latencies by number; among
    an ending's candidates the faster, the concurrent one where they tie (as the DP picks)."""
    weights = arrays.ending_weights(latency)
    cost = arrays.forward(weights)
    if math.isinf(cost[arrays.full]):
        raise ValueError(f"block {space.block.index} has no schedule of finite latency")
    stages, latencies = [], []
    for ending in reversed(arrays.best_endings(weights, cost)):
        concurrent, merge = arrays.candidates[ending]
        faster = merge >= 0 and (concurrent < 0 or latency[merge] < latency[concurrent])
        strategy = "merge" if faster else "concurrent"
        stages.append(next(s for s in space.stages(arrays.endings[ending]) if s.strategy == strategy))
        latencies.append(float(weights[ending]))
    counts = arrays.counts
    return BlockResult(BlockSchedule(space.block.index, tuple(stages), tuple(latencies)), float(cost[arrays.full]),
                       SearchStats(counts.states, counts.transitions, counts.stages))


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collection off in the body, as it was after (for the whole process, until the last of
    several bodies at once ends): a space's build makes millions of small objects that live on, and the collector
    traversed them again and again (RandWire: 12.4 s with it, 10.2 s without, on a 2-core CPU)."""
    global _paused, _enabled_before
    with _paused_lock:
        if _paused == 0:
            _enabled_before = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _enabled_before:
                gc.enable()


def walked(graph: Graph, params: SearchParams, keys: StageKeys | None = None) -> tuple[StageIndex, SearchSpace]:
    """The search space of ``graph`` under ``params``, with the index of the stages its walk numbered (what the lazy
    search relates): every block's candidate stages numbered, its arrays built, and the plan they make."""
    index = StageIndex(keys or StageKeys(graph))
    arrays = [BlockArrays.of(space, index.add) for space in block_spaces(graph, params)]
    found = [(a.counts, [index.planned[n] for n in np.unique(a.candidates[a.candidates >= 0])]) for a in arrays]
    plan = plan_found(graph, params, index.keys, found)
    return index, SearchSpace(graph, params, tuple(index.planned), *_unique(arrays), plan)


def _unique(arrays: list[BlockArrays]) -> tuple[tuple[BlockArrays, ...], tuple[int, ...], tuple[int, ...]]:
    """Blocks with the same transitions, endings and candidate stages, once each, with how many times each occurs,
    and for each block the index of its unique arrays."""
    found: dict[str, int] = {}
    unique: list[BlockArrays] = []
    copies: list[int] = []
    arrays_of: list[int] = []
    for block in arrays:
        transitions = block.by_state
        parts = [a.tobytes() for a in (transitions.state, transitions.rest, transitions.ending, block.candidates)]
        digest = hashlib.sha256(b"".join([*parts, repr(block.endings).encode()])).hexdigest()
        if digest in found:
            copies[found[digest]] += 1
        else:
            found[digest] = len(unique)
            unique.append(block)
            copies.append(1)
        arrays_of.append(found[digest])
    return tuple(unique), tuple(copies), tuple(arrays_of)
