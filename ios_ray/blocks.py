"""Block detection: split a graph into single-entry single-exit regions.

A unit is a *cut* when every path from the graph input to the graph output passes through it. In a
topological order that is exactly a unit that no edge jumps over. Blocks are cut at those units:

* a parallel region (units between two cuts) together with the cut it ends in forms one block, the cut
  being its exit (an Inception module and its concat, say);
* consecutive cuts with nothing in parallel between them form one chain block (a stem, a classifier).

Nothing is marked by hand in the models; the blocks follow from the wiring alone. A block of more than
``max_units`` units (a NASNet stack, whose cells read the two cells before them, has no cut at all) is split
into parts at its narrowest points: where the fewest values computed before are still read after. Parts of a
block run one after the other, each is scheduled like a block of its own.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from ios_ray.ir import GRAPH_INPUT, Block, Unit, Value


#: Blocks larger than this are split into parts (the largest block of the IOS benchmarks has 33 units).
MAX_BLOCK_UNITS = 40


def find_blocks(units: Sequence[Unit], output: Value, max_units: int = MAX_BLOCK_UNITS) -> tuple[Block, ...]:
    """The blocks of units given in topological order, with the graph output read from ``output``."""
    cuts = cut_units(units, output)
    blocks: list[list[str]] = []
    current: list[str] = []
    for unit in units:
        is_cut = unit.id in cuts
        in_chain = all(u in cuts for u in current)
        if not is_cut and in_chain and current:
            blocks.append(current)
            current = []
        current.append(unit.id)
        if is_cut and not in_chain:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    by_id = {u.id: u for u in units}
    parts = [part for block in blocks for part in split_block([by_id[u] for u in block], max_units)]
    return tuple(Block(i, tuple(p)) for i, p in enumerate(parts))


def split_block(units: Sequence[Unit], max_units: int) -> list[list[str]]:
    """Split a block into consecutive parts of at most ``max_units`` units, cutting where the fewest values cross.

    It cuts at every position crossed by at most ``limit`` live values, for the smallest ``limit`` that keeps
    every part small enough; in a NASNet stack that is every cell boundary.
    """
    ids = [u.id for u in units]
    if len(ids) <= max_units:
        return [ids]
    live = _live_counts(units)
    for limit in range(1, max(live) + 2):
        cuts = [i for i in range(1, len(ids)) if live[i] <= limit]
        bounds = [0, *cuts, len(ids)]
        if all(b - a <= max_units for a, b in zip(bounds, bounds[1:])):
            return _absorb_small([ids[a:b] for a, b in zip(bounds, bounds[1:])], max_units)
    return [ids]


def _absorb_small(parts: list[list[str]], max_units: int, small: int = 2) -> list[list[str]]:
    """Join parts of at most ``small`` units to the part after them (a cell's lone input conv, say)."""
    joined: list[list[str]] = []
    carry: list[str] = []
    for part in parts:
        if len(part) <= small and len(carry) + len(part) < max_units:
            carry += part
            continue
        if len(carry) + len(part) <= max_units:
            joined.append(carry + part)
        else:
            joined.extend([carry, part] if carry else [part])
        carry = []
    if carry:
        joined.append(carry)
    return joined


def _live_counts(units: Sequence[Unit]) -> list[int]:
    """For each position i, how many values computed before i (or outside the block) are read at i or later."""
    position = {u.id: i for i, u in enumerate(units)}
    last_read: dict[str, int] = {}
    first_seen: dict[str, int] = {}
    for i, unit in enumerate(units):
        for source in unit.sources:
            last_read[source] = i
            first_seen.setdefault(source, position.get(source, -1))
    live = [0] * (len(units) + 1)
    for source, last in last_read.items():
        for i in range(first_seen[source] + 1, last + 1):
            live[i] += 1
    return live


def cut_units(units: Sequence[Unit], output: Value) -> set[str]:
    """Ids of the units that every input-to-output path passes through."""
    position = {GRAPH_INPUT: -1, **{u.id: i for i, u in enumerate(units)}}
    edges = [(position[s], i) for i, u in enumerate(units) for s in u.sources]
    edges += [(position[s], len(units)) for s in output.sources]
    furthest_from = [-1] * (len(units) + 1)
    for start, end in edges:
        furthest_from[start + 1] = max(furthest_from[start + 1], end)
    reach = list(itertools.accumulate(furthest_from, max))  # reach[i]: furthest end of an edge starting before i
    return {u.id for i, u in enumerate(units) if reach[i] <= i}

