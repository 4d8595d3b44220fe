"""Block detection: split a graph into single-entry single-exit regions, and measure their width.

A unit is a *cut* when every path from the graph input to the graph output passes through it. In a
topological order that is exactly a unit that no edge jumps over. Blocks are cut at those units:

* a parallel region (units between two cuts) together with the cut it ends in forms one block, the cut
  being its exit (an Inception module and its concat, say);
* consecutive cuts with nothing in parallel between them form one chain block (a stem, a classifier).

Nothing is marked by hand in the models; the blocks follow from the wiring alone.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import networkx as nx

from ios_ray.ir import GRAPH_INPUT, Block, Unit, Value


def find_blocks(units: Sequence[Unit], output: Value) -> tuple[Block, ...]:
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
    return tuple(Block(i, tuple(b)) for i, b in enumerate(blocks))


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


def width(units: Sequence[Unit]) -> int:
    """The width of the DAG formed by these units: the size of its largest antichain (Dilworth's theorem)."""
    ids = [u.id for u in units]
    inside = set(ids)
    dag = nx.DiGraph()
    dag.add_nodes_from(ids)
    dag.add_edges_from((s, u.id) for u in units for s in u.sources if s in inside)
    closure = nx.transitive_closure_dag(dag)
    bipartite = nx.Graph()
    top = [("out", i) for i in ids]
    bipartite.add_nodes_from(top)
    bipartite.add_nodes_from(("in", i) for i in ids)
    bipartite.add_edges_from((("out", a), ("in", b)) for a, b in closure.edges)
    matching = nx.bipartite.hopcroft_karp_matching(bipartite, top_nodes=top)
    return len(ids) - len(matching) // 2
