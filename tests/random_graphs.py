"""Random one-block graphs of convs, for testing and benchmarking the search without a model.

A graph is given by, per unit, the indices of the earlier units it reads (its predecessors). Unit ``i`` is a
conv named ``u<i>`` that reads the channel concatenation of its predecessors' outputs, or the graph input when it
has none; widths and kernel sizes are drawn from a seed, and every output keeps the input's spatial size, so
units reading the same value can often merge.
"""

from __future__ import annotations

import random
from typing import Sequence

from ios_ray.ir import GRAPH_INPUT, Block, Graph, Unit, Value

INPUT_SHAPE = (32, 8, 8)


def dag_graph(preds: Sequence[Sequence[int]], seed: int = 0, name: str = "dag") -> Graph:
    """A graph with one block holding one conv per entry of ``preds`` (predecessors must come earlier)."""
    rng = random.Random(seed)
    units: list[Unit] = []
    for i, inputs in enumerate(preds):
        if any(not 0 <= j < i for j in inputs):
            raise ValueError(f"unit {i} reads {list(inputs)}: predecessors must be earlier units")
        sources = [f"u{j}" for j in sorted(set(inputs))] or [GRAPH_INPUT]
        in_channels = sum(units[j].shape[0] for j in sorted(set(inputs))) or INPUT_SHAPE[0]
        units.append(conv_unit(f"u{i}", sources, in_channels, rng.choice((16, 32, 64)), rng.choice((1, 3))))
    read = {j for inputs in preds for j in inputs}
    sinks = [u.id for i, u in enumerate(units) if i not in read]
    output = Value(tuple((s,) for s in sinks))
    ids = tuple(u.id for u in units)
    return Graph(name, INPUT_SHAPE, tuple(units), output, (Block(0, ids),))


def conv_unit(unit_id: str, sources: Sequence[str], in_channels: int, out_channels: int, kernel: int) -> Unit:
    """A size-preserving conv + ReLU over the concatenation of ``sources`` (each an 8x8 map)."""
    _, height, width = INPUT_SHAPE
    pixels = height * width
    weights = in_channels * out_channels * kernel * kernel
    return Unit(
        id=unit_id,
        kind="conv",
        inputs=(Value(tuple((s,) for s in sources)),),
        shape=(out_channels, height, width),
        attrs={
            "in_channels": in_channels, "out_channels": out_channels, "kernel": (kernel, kernel),
            "stride": (1, 1), "padding": (kernel // 2, kernel // 2), "dilation": (1, 1), "groups": 1,
            "bias": True, "act": "relu", "pre_act": None,
        },
        flops=2 * weights * pixels,
        bytes=4 * (in_channels * pixels + out_channels * pixels + weights),
    )


def randwire_preds(nodes: int = 32, k: int = 4, p: float = 0.75, seed: int = 0) -> list[list[int]]:
    """RandWire-style predecessors: a Watts-Strogatz graph oriented low to high, plus one unit reading its sinks."""
    rng = random.Random(seed)
    edges = {(i, (i + d) % nodes) for i in range(nodes) for d in range(1, k // 2 + 1)}
    for i, j in sorted(edges):
        if rng.random() < p:
            free = [t for t in range(nodes) if t != i and (i, t) not in edges and (t, i) not in edges]
            if free:
                edges.remove((i, j))
                edges.add((i, rng.choice(free)))
    preds: list[list[int]] = [[] for _ in range(nodes)]
    for a, b in edges:
        preds[max(a, b)].append(min(a, b))
    read = {j for inputs in preds for j in inputs}
    preds.append([i for i in range(nodes) if i not in read])
    return preds
