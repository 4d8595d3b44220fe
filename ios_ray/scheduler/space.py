"""The schedule space of one block: its states, their endings, and the candidate stages of each ending.

The DP (:mod:`ios_ray.scheduler.dp`) and the planner (:mod:`ios_ray.scheduler.plan`) both walk a :class:`BlockSpace`,
so the stages planned for measurement are exactly the stages the DP can ask for.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ios_ray.errors import UserError
from ios_ray.ir import Block, Graph
from ios_ray.scheduler.dag import BlockDag
from ios_ray.scheduler.endings import endings
from ios_ray.stage import Stage, can_merge
from ios_ray.vocabulary import DEFAULT_R, DEFAULT_S, STRATEGIES, Strategy


@dataclass(frozen=True)
class SearchParams:
    """What the search may consider.

    ``r``: the most units per group of a stage; ``s``: the most groups per stage (None: no bound).
    ``strategies``: the stage strategies to try. With ``("merge",)`` alone, an ending that cannot merge is
    still allowed as a single-unit concurrent stage when it has one unit, or no schedule would exist.
    """

    r: int | None = DEFAULT_R
    s: int | None = DEFAULT_S
    strategies: tuple[Strategy, ...] = STRATEGIES

    def __post_init__(self) -> None:
        for name in ("r", "s"):
            bound = getattr(self, name)
            if bound is not None and (type(bound) is not int or bound < 1):
                raise UserError(f"pruning bound {name} must be a positive integer or None, not {bound!r}.")
        unknown = [x for x in self.strategies if x not in STRATEGIES]
        if not self.strategies or unknown or len(set(self.strategies)) != len(self.strategies):
            raise UserError(f"strategies must be distinct names from {STRATEGIES}, not {self.strategies!r}.")

    @property
    def unpruned(self) -> SearchParams:
        """The same parameters without the bounds ``r`` and ``s``."""
        return SearchParams(None, None, self.strategies)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form, as recorded in a schedule file."""
        return {"r": self.r, "s": self.s, "strategies": list(self.strategies)}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> SearchParams:
        """The parameters a schedule file records (:meth:`to_json`), each absent one at its default."""
        return cls(params.get("r", DEFAULT_R), params.get("s", DEFAULT_S),
                   tuple(params.get("strategies", STRATEGIES)))


class BlockSpace:
    """The states, endings and candidate stages of one block under one set of :class:`SearchParams`.

    A state is a mask of the units still to schedule (see :mod:`ios_ray.scheduler.dag`); the first state is the
    full block. Blocks of the same DAG can share the endings found per state (see :func:`block_spaces`): endings
    are masks, so they depend only on the shape, not on which units fill it.
    """

    def __init__(self, graph: Graph, block: Block, params: SearchParams) -> None:
        self.graph = graph
        self.block = block
        self.params = params
        self.dag = BlockDag.of(graph, block)
        self._shared: dict[int, list[int]] | None = None
        self._allowed: dict[int, bool] = {}

    @property
    def full(self) -> int:
        """The first state: every unit of the block."""
        return self.dag.full

    def endings(self, state: int) -> list[int]:
        """The endings of ``state`` within the pruning bounds that have at least one candidate stage (do not
        change the list: blocks of one shape share it)."""
        found = self._shared.get(state) if self._shared is not None else None
        if found is None:
            found = endings(self.dag, state, self.params.r, self.params.s)
            if self._shared is not None:
                self._shared[state] = found
        if "concurrent" in self.params.strategies:
            return found
        return [ending for ending in found if self._has_stage(ending)]

    def stages(self, ending: int) -> tuple[Stage, ...]:
        """The candidate stages for running ``ending`` as one stage, one per applicable strategy.

        Concurrent: the groups are the components of ``ending``, each in topological order, ordered by their
        first unit. Merge: every unit its own group, where all units are unconnected and :func:`can_merge`.
        """
        groups = tuple(self.dag.ids(g) for g in self.dag.components(ending))
        singles = all(len(g) == 1 for g in groups)
        found = []
        if "concurrent" in self.params.strategies or (len(groups) == 1 and singles):
            found.append(Stage("concurrent", groups))
        if "merge" in self.params.strategies and singles and can_merge(self.graph, [g[0] for g in groups]):
            found.append(Stage("merge", groups))
        return tuple(found)

    def states(self) -> Iterator[tuple[int, list[int]]]:
        """Every non-empty state reachable from the full block, once each, with its endings."""
        seen = {self.full}
        todo = [self.full]
        while todo:
            state = todo.pop()
            found = self.endings(state)
            yield state, found
            for ending in found:
                rest = state & ~ending
                if rest and rest not in seen:
                    seen.add(rest)
                    todo.append(rest)

    def _has_stage(self, ending: int) -> bool:
        """Whether ``ending`` has a candidate stage (cached: only asked when ``concurrent`` is not a strategy)."""
        allowed = self._allowed.get(ending)
        if allowed is None:
            allowed = self._allowed[ending] = bool(self.stages(ending))
        return allowed


def block_spaces(graph: Graph, params: SearchParams) -> list[BlockSpace]:
    """The space of every block of ``graph``; blocks of the same DAG (NASNet's repeated cells) enumerate their
    endings once between them."""
    spaces = [BlockSpace(graph, block, params) for block in graph.blocks]
    shapes = Counter(space.dag.preds for space in spaces)
    shared: dict[tuple[int, ...], dict[int, list[int]]] = {preds: {} for preds, n in shapes.items() if n > 1}
    for space in spaces:
        space._shared = shared.get(space.dag.preds)
    return spaces
