"""Block detection: split a graph into single-entry single-exit regions.

A unit is a *cut* when every path from the graph input to the graph output passes through it. In a
topological order that is exactly a unit that no edge jumps over. Blocks are cut at those units:

* a parallel region (units between two cuts) together with the cut it ends in forms one block, the cut
  being its exit (an Inception module and its concat, say);
* consecutive cuts with nothing in parallel between them form one chain block (a stem, a classifier).

Nothing is marked by hand in the models; the blocks follow from the wiring alone. Two kinds of block are too
big for the DP, which solves every *state* of a block (every set of its units closed under predecessors), and
are split into *parts* that run one after the other, each scheduled like a block of its own:

* a block of more than ``max_units`` units (a NASNet stack, whose cells read the two cells before them, has no
  cut at all) is split at its narrowest points: where the fewest values computed before are still read after;
* a part with more than ``max_states`` states (parallel branches that are long as well as many: HRNet's
  multi-resolution stages, PNASNet's cells) is split at depth levels, the longest-path distance from the part's
  start, as few times as keeps each part under the bound. Units of one depth never depend on each other, so
  every branch stays in each part and the branches still run side by side.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from ios_ray.bitmasks import bits
from ios_ray.ir import GRAPH_INPUT, Block, Unit, Value


#: Blocks larger than this are split into parts (the largest block of the IOS benchmarks has 33 units).
MAX_BLOCK_UNITS = 40

#: Parts with more states than this are split at depth levels. The IOS benchmarks' block with the most states,
#: RandWire's, has 12,293 (3.4 million transitions at r=3, s=8: seconds of DP); HRNet's and PNASNet's have
#: hundreds of thousands, and their DP does not finish.
MAX_BLOCK_STATES = 16384


def find_blocks(units: Sequence[Unit], output: Value, max_units: int = MAX_BLOCK_UNITS,
                max_states: int = MAX_BLOCK_STATES) -> tuple[Block, ...]:
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
    narrow = [piece for part in parts for piece in split_wide([by_id[u] for u in part], max_states)]
    return tuple(Block(i, tuple(p)) for i, p in enumerate(narrow))


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


def split_wide(units: Sequence[Unit], max_states: int) -> list[list[str]]:
    """Split a part with more than ``max_states`` states into runs of whole depth levels, each run as long as
    stays within the bound; a single level over the bound (many independent units) is cut into chunks.

    The units of each run are listed by depth, then by their order in ``units``: a topological order.
    """
    ids = [u.id for u in units]
    if count_states(units, max_states) <= max_states:
        return [ids]
    by_level: dict[int, list[Unit]] = {}
    for unit, level in zip(units, _depths(units)):
        by_level.setdefault(level, []).append(unit)
    parts: list[list[Unit]] = [[]]
    for level in sorted(by_level):
        for chunk in _chunks(by_level[level], max_states.bit_length() - 1):
            grown = parts[-1] + chunk
            if count_states(grown, max_states) <= max_states:
                parts[-1] = grown
            else:
                parts.append(list(chunk))
    return [[u.id for u in part] for part in parts if part]


def count_states(units: Sequence[Unit], limit: int) -> int:
    """The number of sets of ``units`` closed under predecessors (the DP's states: the full set included, the
    empty one not), or ``limit + 1`` where there are more than ``limit``.

    Counted, not listed: the closed sets of a set of units are those without a unit ``x`` (the closed sets of the
    units not at or after ``x``) and those with it (``x``, what comes before it, and a closed set of the rest); and
    the closed sets of unrelated parts multiply. Each set of units is counted once (memoized), and a count stops
    once one of its terms is past the limit.
    """
    before, after = _closures(units)
    related = [b | a for b, a in zip(before, after)]
    past = limit + 1  # closed sets, the empty one included, past which there are more states than the limit
    counted: dict[int, int] = {0: 1}  # by set of units (a bit mask): its closed sets, or fewer where over ``past``

    def closed_sets(units_left: int) -> int:
        if units_left in counted:
            return counted[units_left]
        part = _connected(units_left & -units_left, units_left, related)
        if part != units_left:
            first = closed_sets(part)
            found = first if first > past else first * closed_sets(units_left & ~part)
        else:
            members = list(bits(units_left))
            x = members[len(members) // 2]
            first = closed_sets(units_left & ~after[x])
            found = first if first > past else first + closed_sets(units_left & ~before[x])
        counted[units_left] = found
        return found

    return min(closed_sets((1 << len(units)) - 1) - 1, limit + 1)


def _closures(units: Sequence[Unit]) -> tuple[list[int], list[int]]:
    """Per unit (by position), the bit mask of itself and every unit of ``units`` it depends on, and of itself and
    every unit that depends on it."""
    index = {u.id: i for i, u in enumerate(units)}
    before: list[int | None] = [None] * len(units)

    def upstream(i: int) -> int:
        if before[i] is None:
            mask = 1 << i
            for source in units[i].sources:
                if source in index:
                    mask |= upstream(index[source])
            before[i] = mask
        return before[i]  # type: ignore[return-value]

    masks = [upstream(i) for i in range(len(units))]
    after = [1 << i for i in range(len(units))]
    for i, mask in enumerate(masks):
        for j in bits(mask & ~(1 << i)):
            after[j] |= 1 << i
    return masks, after


def _connected(start: int, within: int, related: list[int]) -> int:
    """The units of ``within`` connected to ``start`` (bit masks) through units that depend on one another."""
    part, done = start, 0
    while part != done:
        new, done = part & ~done, part
        for i in bits(new):
            part |= related[i] & within
    return part


def _depths(units: Sequence[Unit]) -> list[int]:
    """Each unit's longest-path distance from the units that read nothing inside ``units`` (those are 0)."""
    depth: dict[str, int] = {}
    for unit in units:
        depth[unit.id] = max((depth[s] + 1 for s in unit.sources if s in depth), default=0)
    return [depth[u.id] for u in units]


def _chunks(level: list[Unit], size: int) -> list[list[Unit]]:
    """A depth level cut into chunks of at most ``size`` units (2**size states), in order."""
    return [level[i:i + size] for i in range(0, len(level), max(size, 1))]


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

