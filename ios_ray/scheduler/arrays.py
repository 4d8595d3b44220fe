"""A block's DP as numpy arrays, for running it many times under changing stage latencies.

The lazy search (:mod:`~ios_ray.scheduler.lazy`) runs the IOS DP once per round and setting, each time with
other latencies. Enumerating states, endings and stage keys is the costly part and does not depend on latencies,
so it is done once: :class:`BlockArrays` holds a block's reachable states (sorted by size), its transitions
``state -> rest`` through an ending, and per ending the index of each candidate stage. A run is then a few
vectorised min-plus passes:

* :meth:`BlockArrays.forward`: ``cost[S]``, the cheapest way to run the units of state S (the DP of
  :mod:`~ios_ray.scheduler.dp`, level by level: a state's rests are smaller, so they are done first);
* :meth:`BlockArrays.backward`: ``after[S]``, the cheapest way to run the rest of the block once S is done;
* :meth:`BlockArrays.through`: per ending, the cheapest schedule that runs it as a stage (``cost[rest] +
  after[state]``, without the ending's own latency).

Latencies are a vector over stage indices; an ending's weight is the least of its candidates' (``inf`` where it
has none that is known).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ios_ray.scheduler.space import BlockSpace
from ios_ray.stage import Stage

#: Column of an ending's concurrent candidate and of its merge candidate in ``BlockArrays.candidates``.
CONCURRENT, MERGE = 0, 1


@dataclass(frozen=True)
class _Levels:
    """Transitions cut into runs that one vectorised step can do: per run its slice, segment starts, targets."""

    slices: tuple[tuple[int, int], ...]
    starts: tuple[np.ndarray, ...]
    targets: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class BlockArrays:
    """A block's states, transitions and candidate stages as arrays (see the module docstring)."""

    block: int
    full: int
    state: np.ndarray
    rest: np.ndarray
    ending: np.ndarray
    candidates: np.ndarray
    state_start: np.ndarray
    _forward: _Levels
    _backward: _Levels
    _backward_order: np.ndarray
    _ending_order: np.ndarray
    _ending_starts: np.ndarray

    @staticmethod
    def of(space: BlockSpace, index_of: Callable[[Stage], int]) -> BlockArrays:
        """The arrays of ``space``; ``index_of`` gives a candidate stage's index in the latency vectors."""
        transitions: list[tuple[int, int, int]] = []
        endings: dict[int, int] = {}
        for state, found in space.states():
            for mask in found:
                transitions.append((state, state & ~mask, endings.setdefault(mask, len(endings))))
        masks = sorted({0, space.full, *(r for _, r, _ in transitions)}, key=lambda m: (m.bit_count(), m))
        order = {mask: i for i, mask in enumerate(masks)}
        table = np.array([(order[s], order[r], e) for s, r, e in transitions], dtype=np.int64).reshape(-1, 3)
        table = table[np.argsort(table[:, 0], kind="stable")]
        candidates = np.full((len(endings), 2), -1, dtype=np.int64)
        for mask, e in endings.items():
            for stage in space.stages(mask):
                candidates[e, CONCURRENT if stage.strategy == "concurrent" else MERGE] = index_of(stage)
        sizes = np.array([m.bit_count() for m in masks], dtype=np.int64)
        return _assemble(space.block.index, order[space.full], table, candidates, sizes, len(masks))

    @property
    def transitions(self) -> int:
        """The number of (state, ending) transitions."""
        return len(self.state)

    def ending_weights(self, latency: np.ndarray) -> np.ndarray:
        """Per ending, the least latency of its candidate stages (``inf`` where none is finite)."""
        found = np.full(len(self.candidates), np.inf)
        for column in (CONCURRENT, MERGE):
            index = self.candidates[:, column]
            has = index >= 0
            found[has] = np.minimum(found[has], latency[index[has]])
        return found

    def forward(self, weights: np.ndarray) -> np.ndarray:
        """``cost[S]`` for every state under these ending weights; ``cost[full]`` is the block's best cost."""
        cost = np.full(len(self.state_start) - 1, np.inf)
        cost[0] = 0.0
        for (a, z), starts, targets in zip(*_unpack(self._forward)):
            cost[targets] = np.minimum.reduceat(cost[self.rest[a:z]] + weights[self.ending[a:z]], starts)
        return cost

    def backward(self, weights: np.ndarray) -> np.ndarray:
        """``after[S]``: the best cost of the units not in state S, once S has run."""
        after = np.full(len(self.state_start) - 1, np.inf)
        after[self.full] = 0.0
        order = self._backward_order
        for (a, z), starts, targets in zip(*_unpack(self._backward)):
            run = order[a:z]
            found = np.minimum.reduceat(after[self.state[run]] + weights[self.ending[run]], starts)
            after[targets] = np.minimum(after[targets], found)
        return after

    def through(self, cost: np.ndarray, after: np.ndarray) -> np.ndarray:
        """Per ending, the best cost of a block schedule running it as a stage, less the ending's own latency."""
        order = self._ending_order
        return np.minimum.reduceat(cost[self.rest[order]] + after[self.state[order]], self._ending_starts)

    def best_endings(self, weights: np.ndarray, cost: np.ndarray) -> list[int]:
        """The endings of the best schedule under ``weights`` (``cost`` from :meth:`forward`), last stage first."""
        chosen = []
        state = self.full
        while state != 0:
            a, z = self.state_start[state], self.state_start[state + 1]
            best = a + int(np.argmin(cost[self.rest[a:z]] + weights[self.ending[a:z]]))
            chosen.append(int(self.ending[best]))
            state = int(self.rest[best])
        return chosen


def _assemble(block: int, full: int, table: np.ndarray, candidates: np.ndarray, sizes: np.ndarray,
              states: int) -> BlockArrays:
    """Precompute the level runs of both passes and the per-ending grouping."""
    state, rest, ending = table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy()
    state_start = np.searchsorted(state, np.arange(states + 1)).astype(np.int64)
    backward_order = np.lexsort((rest, -sizes[rest])).astype(np.int64)
    ending_order = np.argsort(ending, kind="stable").astype(np.int64)
    sorted_endings = ending[ending_order]
    ending_starts = np.flatnonzero(np.r_[True, sorted_endings[1:] != sorted_endings[:-1]]) if len(ending) else \
        np.zeros(0, dtype=np.int64)
    return BlockArrays(block, full, state, rest, ending, candidates, state_start,
                       _levels(state, sizes[state]), _levels(rest[backward_order], sizes[rest[backward_order]]),
                       backward_order, ending_order, ending_starts)


def _levels(targets: np.ndarray, sizes: np.ndarray) -> _Levels:
    """Cut transitions (already grouped by target, targets of one size together) into one run per size."""
    slices, starts, found = [], [], []
    bounds = np.flatnonzero(np.r_[True, sizes[1:] != sizes[:-1], True])
    for a, z in zip(bounds[:-1], bounds[1:]):
        run = targets[a:z]
        first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
        slices.append((int(a), int(z)))
        starts.append(first)
        found.append(run[first])
    return _Levels(tuple(slices), tuple(starts), tuple(found))


def _unpack(levels: _Levels) -> tuple[tuple[tuple[int, int], ...], tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The three parallel sequences of a :class:`_Levels`."""
    return levels.slices, levels.starts, levels.targets
