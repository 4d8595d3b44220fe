"""The figures behind ``ios-ray inspect``: per block its size, width and the size of the search space; the opaque
units (:func:`~ios_ray.frontend.opaque_report`)."""

from __future__ import annotations

from typing import Any

from ios_ray.frontend import opaque_report
from ios_ray.ir import Graph
from ios_ray.scheduler import SearchParams, count_block, plan_graph
from ios_ray.vocabulary import DEFAULT_R, DEFAULT_S


def inspect_graph(graph: Graph, r: int | None = DEFAULT_R, s: int | None = DEFAULT_S) -> dict[str, Any]:
    """A JSON-able report: per block units n, width d, and states, transitions, candidate stages unpruned and pruned;
    the opaque units (``opaque``: count, shares of units and FLOPs, most frequent op kinds, and a one-line summary).

    ``stages`` counts candidate stages by position in the block; ``keys`` counts them by stage key, so identical
    stages count once (within the block, and in the totals across the whole model).
    """
    params = SearchParams(r=r, s=s)
    plan = plan_graph(graph, params)
    rows: list[dict[str, Any]] = []
    for block, block_plan in zip(graph.blocks, plan.blocks):
        full = count_block(graph, block, params.unpruned)
        pruned = block_plan.counts
        rows.append({
            "block": block.index, "exit": block.exit, "n": full.units, "d": full.width, "states": full.states,
            "transitions": full.transitions, "stages": full.stages,
            f"transitions r={r} s={s}": pruned.transitions, f"stages r={r} s={s}": pruned.stages,
            f"keys r={r} s={s}": len(block_plan.keys),
        })
    totals = {
        "parallel blocks (d > 1)": sum(1 for row in rows if row["d"] > 1),
        f"distinct stages to measure (r={r}, s={s}), whole model": len(plan.stages),
        f"distinct stages summed over blocks (r={r}, s={s})": plan.block_stage_sum,
    }
    opaque = opaque_report(graph)
    return {"model": graph.name, "units": len(graph.units), "params": params.to_json(), "blocks": rows,
            "totals": totals, "opaque": {**opaque.to_json(), "summary": opaque.summary()}}
