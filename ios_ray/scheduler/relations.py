"""How the candidate stages of a search relate: which smaller stages each one is made of.

Estimates of a stage's latency (:mod:`~ios_ray.scheduler.estimate`) come from smaller stages measured on the same
device and batch. For a stage with groups ``g1 .. gk`` those are, each itself a candidate stage with its own key:

* its *groups*: each group run alone as a one-group stage (a unit alone is the one-group stage of one unit);
* its *units*: each unit alone;
* for ``k >= 3`` its *sub-stages*: the stage without one of its groups (``k`` of them), and its *pairs*: every
  two of its groups as a stage.

Dropping whole groups from an ending leaves an ending of the same state within the same pruning bounds, so these
are candidates of the same search (a unit alone is a stage of the sequential schedule). Stages are numbered by
:class:`StageIndex`; relations are flat index arrays, one run per group count, so a pass over all stages of one
size is one vectorised step.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from ios_ray.scheduler.plan import PlannedStage
from ios_ray.stage import Stage, StageKeys
from ios_ray.vocabulary import Strategy


class StageIndex:
    """Stages numbered by stage key: identical stages in two places share one number and one latency."""

    def __init__(self, keys: StageKeys) -> None:
        self.keys = keys
        self.planned: list[PlannedStage] = []
        self._number: dict[str, int] = {}  # by description: one key is one description
        self._seen: dict[tuple[str, tuple[tuple[str, ...], ...]], int] = {}

    def __len__(self) -> int:
        return len(self.planned)

    def add(self, stage: Stage) -> int:
        """The number of ``stage``'s key, numbering it if it is new."""
        return self.number(stage.strategy, stage.groups)

    def number(self, strategy: Strategy, groups: tuple[tuple[str, ...], ...]) -> int:
        """The number of the stage of ``groups`` under ``strategy`` (as :meth:`add`; no stage is made where it is
        known: relating asks for millions)."""
        seen = self._seen.get((strategy, groups))
        if seen is not None:
            return seen
        stage = Stage(strategy, groups)
        description = self.keys.describe_json(stage)
        number = self._number.get(description)
        if number is None:
            number = self._number[description] = len(self.planned)
            self.planned.append(PlannedStage(self.keys.key_of(description), stage, description))
        self._seen[strategy, groups] = number
        return number


@dataclass(frozen=True)
class SizeRun:
    """The concurrent stages with ``size >= 3`` groups: per stage its sub-stages and its ordered pairs.

    ``subs[:, j]`` is the stage without its group ``j``. ``pairs[:, m]`` is the pair of groups ``(j, h)`` in the
    m-th ordered combination (``j`` major: group ``j`` with each other group is ``m`` in ``j * (size - 1) ..
    (j + 1) * (size - 1) - 1``) and ``others[:, m]`` the one-group stage of ``h``, so ``latency[pairs] -
    latency[others]`` is what adding group ``j`` to ``h`` cost.
    """

    size: int
    stages: np.ndarray
    subs: np.ndarray
    pairs: np.ndarray
    others: np.ndarray


@dataclass(frozen=True)
class StageRelations:
    """Per numbered stage: merge or not, its groups and units as stage numbers, and the runs of larger stages."""

    merge: np.ndarray
    group_count: np.ndarray
    groups: tuple[np.ndarray, np.ndarray]
    units: tuple[np.ndarray, np.ndarray]
    one_group: np.ndarray
    pairs: np.ndarray
    runs: tuple[SizeRun, ...]


def relate(index: StageIndex) -> StageRelations:
    """The relations of every stage of ``index``, numbering the related stages it lacks (until none is new)."""
    groups: list[list[int]] = []
    units: list[list[int]] = []
    larger: dict[int, list[tuple[int, list[int], list[int], list[int]]]] = {}
    done = 0
    while done < len(index):
        stage = index.planned[done].stage
        unit_numbers = [index.number("concurrent", ((u,),)) for u in stage.units]
        units.append(unit_numbers)
        if stage.strategy == "merge":
            groups.append(unit_numbers)
        else:
            groups.append([index.number("concurrent", (g,)) for g in stage.groups])
            if len(stage.groups) >= 3:
                larger.setdefault(len(stage.groups), []).append((done, *_composition(index, stage, groups[-1])))
        done += 1
    merge = np.array([p.stage.strategy == "merge" for p in index.planned], dtype=bool)
    count = np.array([len(p.stage.groups) for p in index.planned], dtype=np.int64)
    concurrent = ~merge
    return StageRelations(
        merge, count, _flat(groups), _flat(units), np.flatnonzero(concurrent & (count == 1)),
        np.flatnonzero(concurrent & (count == 2)), tuple(_run(size, rows) for size, rows in sorted(larger.items())))


def _composition(index: StageIndex, stage: Stage, one_group: list[int]) -> tuple[list[int], list[int], list[int]]:
    """A stage's sub-stages (one group dropped), its ordered pairs of groups, and the other group of each pair."""
    groups = stage.groups
    k = len(groups)
    subs = [index.number("concurrent", groups[:j] + groups[j + 1:]) for j in range(k)]
    pairs = [index.number("concurrent", (groups[j], groups[h])) for j, h in itertools.combinations(range(k), 2)]
    which, others = _ordered_pairs(k)
    return subs, [pairs[i] for i in which], [one_group[h] for h in others]


@functools.cache
def _ordered_pairs(k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """For the ordered pairs ``(j, h)`` of ``k`` groups (``j`` major), each one's place among the unordered pairs in
    ``itertools.combinations`` order, and its ``h``."""
    place = {pair: i for i, pair in enumerate(itertools.combinations(range(k), 2))}
    ordered = [(j, h) for j in range(k) for h in range(k) if j != h]
    return tuple(place[min(j, h), max(j, h)] for j, h in ordered), tuple(h for _, h in ordered)


def _run(size: int, rows: list[tuple[int, list[int], list[int], list[int]]]) -> SizeRun:
    """One :class:`SizeRun` from per-stage rows of (stage, sub-stages, pairs, others)."""
    return SizeRun(size, np.array([r[0] for r in rows], dtype=np.int64), np.array([r[1] for r in rows], dtype=np.int64),
                   np.array([r[2] for r in rows], dtype=np.int64), np.array([r[3] for r in rows], dtype=np.int64))


def _flat(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length lists as (flat values, start of each list), for ``np.maximum.reduceat`` and friends."""
    lengths = np.array([len(x) for x in lists], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    return np.array([v for x in lists for v in x], dtype=np.int64), starts
