"""Planning: every stage the search can ask about, known before anything is measured.

The planner walks the same :class:`~ios_ray.scheduler.space.BlockSpace` as the DP, so it lists exactly the
candidate stages the DP may ask for, plus the stages of the sequential and greedy baselines. Stages are
deduplicated by stage key, within a block and across blocks (identical stages share one key and one
measurement). :func:`count_block` gives the sizes of a block's search space without computing any key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from ios_ray.ir import Block, Graph
from ios_ray.scheduler.baselines import greedy_stages, sequential_stages
from ios_ray.scheduler.space import BlockSpace, SearchParams, block_spaces
from ios_ray.stage import Stage, StageKeys


@dataclass(frozen=True)
class BlockCounts:
    """The size of one block's search space: units n, width d, states, transitions, distinct candidate stages."""

    block: int
    units: int
    width: int
    states: int
    transitions: int
    stages: int


@dataclass(frozen=True)
class PlannedStage:
    """One stage to measure: its key, a representative stage, and its canonical description (JSON text)."""

    key: str
    stage: Stage
    description: str


@dataclass(frozen=True)
class BlockPlan:
    """The counts of one block and the keys of the stages it needs (DP candidates and baselines)."""

    counts: BlockCounts
    keys: frozenset[str]


@dataclass(frozen=True)
class Plan:
    """Every stage a search of a graph under ``params`` can ask about, by key, and the per-block plans."""

    params: SearchParams
    stages: Mapping[str, PlannedStage]
    blocks: tuple[BlockPlan, ...]

    @property
    def block_stage_sum(self) -> int:
        """Distinct stages summed over blocks; more than ``len(stages)`` where blocks share stages."""
        return sum(len(b.keys) for b in self.blocks)


def count_block(graph: Graph, block: Block, params: SearchParams) -> BlockCounts:
    """The size of ``block``'s search space under ``params`` (no stage keys are computed)."""
    space = BlockSpace(graph, block, params)
    walk = _walk(space)
    return walk.counts(space, sum(len(space.stages(ending)) for ending in walk.endings))


def plan_graph(graph: Graph, params: SearchParams, keys: StageKeys | None = None) -> Plan:
    """The stages to measure before searching ``graph`` under ``params``, deduplicated by stage key."""
    keys = keys or StageKeys(graph)
    stages: dict[str, PlannedStage] = {}
    blocks = []
    for space in block_spaces(graph, params):
        walk = _walk(space)
        candidates = [stage for ending in walk.endings for stage in space.stages(ending)]
        counts = walk.counts(space, len(candidates))
        blocks.append(_block_plan(graph, space.block, counts, _add_stages(keys, candidates, stages), keys, stages))
    return Plan(params, stages, tuple(blocks))


def plan_found(graph: Graph, params: SearchParams, keys: StageKeys,
               found: Iterable[tuple[BlockCounts, Iterable[PlannedStage]]]) -> Plan:
    """The plan :func:`plan_graph` gives, from each block's counts and candidate stages as another walk of the same
    spaces found them (the lazy search's, which then need not walk them twice)."""
    stages: dict[str, PlannedStage] = {}
    blocks = []
    for block, (counts, candidates) in zip(graph.blocks, found, strict=True):
        candidate_keys = set()
        for planned in candidates:
            stages.setdefault(planned.key, planned)
            candidate_keys.add(planned.key)
        blocks.append(_block_plan(graph, block, counts, candidate_keys, keys, stages))
    return Plan(params, stages, tuple(blocks))


def _block_plan(graph: Graph, block: Block, counts: BlockCounts, candidate_keys: set[str], keys: StageKeys,
                stages: dict[str, PlannedStage]) -> BlockPlan:
    """A block's plan: its counts and the keys of its candidates and of its baselines' stages (added to ``stages``)."""
    baselines = sequential_stages(graph, block) + greedy_stages(graph, block)
    return BlockPlan(counts, frozenset(candidate_keys | _add_stages(keys, baselines, stages)))


@dataclass(frozen=True)
class _Walk:
    """What a walk over a block's reachable states met: states, (state, ending) transitions, distinct endings."""

    states: int
    transitions: int
    endings: frozenset[int]

    def counts(self, space: BlockSpace, stages: int) -> BlockCounts:
        """The block's counts, from this walk of ``space`` and its number of distinct candidate stages."""
        return BlockCounts(space.block.index, space.dag.size, space.dag.width, self.states, self.transitions, stages)


def _walk(space: BlockSpace) -> _Walk:
    """Visit every reachable state of ``space`` once."""
    states = transitions = 0
    met: set[int] = set()
    for _, endings in space.states():
        states += 1
        transitions += len(endings)
        met.update(endings)
    return _Walk(states, transitions, frozenset(met))


def _add_stages(keys: StageKeys, stages: Iterable[Stage], into: dict[str, PlannedStage]) -> set[str]:
    """Key each stage, add the ones not yet in ``into``, and return the keys of all of them."""
    found = set()
    for stage in stages:
        key = keys.key(stage)
        if key not in into:
            into[key] = PlannedStage(key, stage, keys.describe_json(stage))
        found.add(key)
    return found
