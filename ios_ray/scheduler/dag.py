"""A block as a small DAG of bitmasks: the data every search pass runs on.

Bit ``i`` of a mask stands for the block's ``i``-th unit, and the block's units are in topological order, so
edges always go from a lower bit to a higher one. Sets of units (states, endings, groups) are plain ints, and
set operations are integer operations: ``a | b`` is the union, ``a & ~b`` the difference, ``a & b == a`` the
subset test. Only edges between units of the block count; inputs from outside the block are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

from ios_ray.bitmasks import bits
from ios_ray.ir import Block, Graph


@dataclass(frozen=True)
class BlockDag:
    """The units of one block and, per unit, bitmasks of its neighbours within the block."""

    units: tuple[str, ...]
    preds: tuple[int, ...]
    succs: tuple[int, ...]

    @staticmethod
    def of(graph: Graph, block: Block) -> BlockDag:
        """The DAG of ``block``'s units; raises ValueError if they are not in topological order."""
        index = {unit_id: i for i, unit_id in enumerate(block.units)}
        preds = [0] * len(index)
        succs = [0] * len(index)
        for i, unit_id in enumerate(block.units):
            for source in graph.unit(unit_id).sources:
                j = index.get(source)
                if j is None:
                    continue
                if j >= i:
                    raise ValueError(f"block {block.index} lists unit {unit_id!r} before its input {source!r}")
                preds[i] |= 1 << j
                succs[j] |= 1 << i
        return BlockDag(tuple(block.units), tuple(preds), tuple(succs))

    @property
    def size(self) -> int:
        """The number of units."""
        return len(self.units)

    @property
    def full(self) -> int:
        """The mask of all units of the block."""
        return (1 << len(self.units)) - 1

    @cached_property
    def descendants(self) -> tuple[int, ...]:
        """Per unit, the mask of the units reachable from it, itself included."""
        desc = [0] * self.size
        for i in reversed(range(self.size)):
            reach = 1 << i
            for j in bits(self.succs[i]):
                reach |= desc[j]
            desc[i] = reach
        return tuple(desc)

    @cached_property
    def ancestors(self) -> tuple[int, ...]:
        """Per unit, the mask of the units it is reachable from, itself included."""
        anc = [0] * self.size
        for i in range(self.size):
            reach = 1 << i
            for j in bits(self.preds[i]):
                reach |= anc[j]
            anc[i] = reach
        return tuple(anc)

    @cached_property
    def incomparable(self) -> tuple[int, ...]:
        """Per unit, the mask of the units with no path to or from it."""
        return tuple(self.full & ~(d | a) for d, a in zip(self.descendants, self.ancestors))

    @cached_property
    def neighbours(self) -> tuple[int, ...]:
        """Per unit, the mask of its direct predecessors and successors."""
        return tuple(p | s for p, s in zip(self.preds, self.succs))

    @cached_property
    def width(self) -> int:
        """The size of the largest antichain (the paper's width d), by Dilworth's theorem."""
        return self.size - _max_matching([d & ~(1 << i) for i, d in enumerate(self.descendants)])

    def ids(self, mask: int) -> tuple[str, ...]:
        """The unit ids of a mask, in topological order."""
        found = self._ids.get(mask)
        if found is None:
            units = self.units
            found = self._ids[mask] = tuple(units[i] for i in bits(mask))
        return found

    @cached_property
    def _ids(self) -> dict[int, tuple[str, ...]]:
        """:meth:`ids` by mask, as asked (a search asks for the same groups in many endings)."""
        return {}

    def mask(self, unit_ids: Iterable[str]) -> int:
        """The mask of these unit ids."""
        index = {unit_id: i for i, unit_id in enumerate(self.units)}
        return sum(1 << index[u] for u in set(unit_ids))

    def components(self, mask: int) -> list[int]:
        """The weakly connected components of the units in ``mask`` (edges inside ``mask`` only), by first unit."""
        found = []
        rest = mask
        while rest:
            component = frontier = rest & -rest
            while frontier:
                low = frontier & -frontier
                frontier ^= low
                new = self.neighbours[low.bit_length() - 1] & mask & ~component
                component |= new
                frontier |= new
            found.append(component)
            rest &= ~component
        return found


def _max_matching(right: list[int]) -> int:
    """The size of a maximum matching of a bipartite graph given as, per left vertex, a mask of right vertices."""
    owner: dict[int, int] = {}

    def augment(left: int, tried: set[int]) -> bool:
        for r in bits(right[left]):
            if r in tried:
                continue
            tried.add(r)
            if r not in owner or augment(owner[r], tried):
                owner[r] = left
                return True
        return False

    return sum(augment(left, set()) for left in range(len(right)))
