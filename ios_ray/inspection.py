"""The figures behind ``ios-ray inspect``: per block its size, width and the size of the search space."""

from __future__ import annotations

from typing import Any

from ios_ray.blocks import width
from ios_ray.ir import Graph


def inspect_graph(graph: Graph, r: int | None = 3, s: int | None = 8) -> dict[str, Any]:
    """A JSON-able report: per block units n, width d, and the search size unpruned and with (r, s)."""
    rows = []
    for block in graph.blocks:
        units = [graph.unit(u) for u in block.units]
        rows.append({"block": block.index, "exit": block.exit, "n": len(units), "d": width(units)})
    totals = {"parallel blocks (d > 1)": sum(1 for row in rows if row["d"] > 1)}
    return {"model": graph.name, "units": len(graph.units), "blocks": rows, "totals": totals}
