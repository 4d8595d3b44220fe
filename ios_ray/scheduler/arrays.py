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
has none that is known). Each pass reads the transitions in its own order (by state, by rest, by ending), stored
that way once, so that a pass reads its arrays front to back instead of gathering through a permutation (on
PNASNet-5 Large's 5-million-transition block that is 6x faster backward and 3x through).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ios_ray.scheduler.plan import BlockCounts
from ios_ray.scheduler.space import BlockSpace
from ios_ray.stage import Stage

#: Column of an ending's concurrent candidate and of its merge candidate in ``BlockArrays.candidates``.
CONCURRENT, MERGE = 0, 1
#: The values of a run of transitions ``state -> rest`` through ``ending``: (the rests' costs, the rests' and the
#: endings' indices) -> one value per transition (``inf``: not allowed).
Transit = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class _Levels:
    """Transitions cut into runs that one vectorised step can do: per run its slice, segment starts, targets."""

    slices: tuple[tuple[int, int], ...]
    starts: tuple[np.ndarray, ...]
    targets: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class _Transitions:
    """Transitions ``state -> rest`` through ``ending`` as three parallel arrays, in one order."""

    state: np.ndarray
    rest: np.ndarray
    ending: np.ndarray

    def ordered(self, order: np.ndarray) -> _Transitions:
        """The same transitions in ``order``, copied."""
        return _Transitions(self.state[order], self.rest[order], self.ending[order])


@dataclass(frozen=True)
class BlockArrays:
    """A block's states, transitions and candidate stages as arrays (see the module docstring): ``by_state`` sorted
    by state (``state_start`` slices a state's), ``by_rest`` by rest (larger rests first), ``by_ending`` by
    ending (``ending_start`` slices an ending's); ``endings`` holds each ending's mask of the block's units,
    ``masks`` each state's (by index: by size, then mask) and ``counts`` the size of the space."""

    counts: BlockCounts
    full: int
    masks: tuple[int, ...]
    endings: tuple[int, ...]
    candidates: np.ndarray
    by_state: _Transitions
    state_start: np.ndarray
    by_rest: _Transitions
    by_ending: _Transitions
    ending_start: np.ndarray
    _forward: _Levels
    _backward: _Levels

    @staticmethod
    def of(space: BlockSpace, index_of: Callable[[Stage], int]) -> BlockArrays:
        """The arrays of ``space``; ``index_of`` gives a candidate stage's index in the latency vectors. Endings are
        numbered in the order the walk first meets them, states by size, then mask."""
        states, found = zip(*space.states())
        dtype = _mask_dtype(space.dag.size)
        state: np.ndarray = np.repeat(np.array(states, dtype=dtype), [len(endings) for endings in found])
        ending: np.ndarray = np.array(list(itertools.chain.from_iterable(found)), dtype=dtype)
        rest = state & ~ending
        endings, ending_number = _first_seen(ending)
        masks, mask_number = _by_size(np.concatenate((np.array([0, space.full], dtype=dtype), rest)))
        table = np.stack((mask_number(state), mask_number(rest), ending_number), axis=1)
        table = table[np.argsort(table[:, 0], kind="stable")]
        candidates = np.full((len(endings), 2), -1, dtype=np.int64)
        for e, mask in enumerate(endings):
            for stage in space.stages(mask):
                candidates[e, CONCURRENT if stage.strategy == "concurrent" else MERGE] = index_of(stage)
        sizes = np.array([m.bit_count() for m in masks], dtype=np.int64)
        counts = BlockCounts(space.block.index, space.dag.size, space.dag.width, len(masks) - 1, len(table),
                             int(np.count_nonzero(candidates >= 0)))
        return _assemble(counts, masks.index(space.full), masks, endings, table, candidates, sizes)

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
        return self.forward_by(lambda before, rest, ending: before + weights[ending])

    def forward_by(self, transit: Transit, start: float = 0.0) -> np.ndarray:
        """``cost[S]`` for every state: the least ``transit`` over S's transitions (``cost[0] = start``), level by
        level, so that every rest is done before the states it leads to."""
        cost = np.full(len(self.state_start) - 1, np.inf)
        cost[0] = start
        rest, ending = self.by_state.rest, self.by_state.ending
        for (a, z), starts, targets in zip(*_unpack(self._forward)):
            cost[targets] = np.minimum.reduceat(transit(cost[rest[a:z]], rest[a:z], ending[a:z]), starts)
        return cost

    def backward(self, weights: np.ndarray) -> np.ndarray:
        """``after[S]``: the best cost of the units not in state S, once S has run."""
        after = np.full(len(self.state_start) - 1, np.inf)
        after[self.full] = 0.0
        state, ending = self.by_rest.state, self.by_rest.ending
        for (a, z), starts, targets in zip(*_unpack(self._backward)):
            found = np.minimum.reduceat(after[state[a:z]] + weights[ending[a:z]], starts)
            after[targets] = np.minimum(after[targets], found)
        return after

    def through(self, cost: np.ndarray, after: np.ndarray) -> np.ndarray:
        """Per ending, the best cost of a block schedule running it as a stage, less the ending's own latency."""
        return np.minimum.reduceat(cost[self.by_ending.rest] + after[self.by_ending.state], self.ending_start)

    def best_endings(self, weights: np.ndarray, cost: np.ndarray) -> list[int]:
        """The endings of the best schedule under ``weights`` (``cost`` from :meth:`forward`), last stage first."""
        chosen = []
        state = self.full
        rest, ending = self.by_state.rest, self.by_state.ending
        while state != 0:
            a, z = self.state_start[state], self.state_start[state + 1]
            best = a + int(np.argmin(cost[rest[a:z]] + weights[ending[a:z]]))
            chosen.append(int(ending[best]))
            state = int(rest[best])
        return chosen


def _mask_dtype(units: int) -> type:
    """The array type that holds masks of ``units`` units: int64 where they fit (up to 63 units; every block
    ``find_blocks`` makes has at most 40), Python ints otherwise."""
    return np.int64 if units < 64 else object


def _first_seen(values: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
    """The distinct ``values`` in the order they first occur, and each value's number in that order."""
    distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first)
    number = np.empty(len(distinct), dtype=np.int64)
    number[order] = np.arange(len(distinct))
    return tuple(distinct[order].tolist()), number[inverse.reshape(-1)]


def _by_size(values: np.ndarray) -> tuple[tuple[int, ...], Callable[[np.ndarray], np.ndarray]]:
    """The distinct masks among ``values`` by size, then mask, and a function giving masks' places in that order."""
    distinct = np.unique(values)
    order = np.argsort([m.bit_count() for m in distinct.tolist()], kind="stable")
    place = np.empty(len(distinct), dtype=np.int64)
    place[order] = np.arange(len(distinct))
    return tuple(distinct[order].tolist()), lambda masks: place[np.searchsorted(distinct, masks)]


def _assemble(counts: BlockCounts, full: int, masks: tuple[int, ...], endings: tuple[int, ...], table: np.ndarray,
              candidates: np.ndarray, sizes: np.ndarray) -> BlockArrays:
    """Store the transitions in each pass's order and precompute the level runs of both passes."""
    by_state = _Transitions(table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy())
    state_start = np.searchsorted(by_state.state, np.arange(len(masks) + 1)).astype(np.int64)
    by_rest = by_state.ordered(np.lexsort((by_state.rest, -sizes[by_state.rest])))
    by_ending = by_state.ordered(np.argsort(by_state.ending, kind="stable"))
    ending_start = np.flatnonzero(np.r_[True, by_ending.ending[1:] != by_ending.ending[:-1]]) if len(table) else \
        np.zeros(0, dtype=np.int64)
    forward, backward = _levels(by_state.state, sizes[by_state.state]), _levels(by_rest.rest, sizes[by_rest.rest])
    return BlockArrays(counts, full, masks, endings, candidates, by_state, state_start, by_rest, by_ending,
                       ending_start, forward, backward)


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
