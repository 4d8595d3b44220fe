"""When each value of a graph is released as a schedule runs: right after the last stage that reads it.

One rule, read by the runtime (which drops its references there, :mod:`ios_ray.runtime.executor`) and by the memory
model (:mod:`ios_ray.scheduler.memory`), so the two cannot disagree about how long a value lives.
"""

from __future__ import annotations

from typing import Sequence

from ios_ray.ir import Graph
from ios_ray.stage import Stage


def release_plan(graph: Graph, stages: Sequence[Stage]) -> tuple[tuple[str, ...], ...]:
    """For each stage, the outputs (and graph input) to drop once it has run: those no later stage reads; the
    graph's outputs are never dropped."""
    last: dict[str, int] = {}
    for index, stage in enumerate(stages):
        for unit_id in stage.units:
            last.setdefault(unit_id, index)
            for source in graph.unit(unit_id).sources:
                last[source] = max(last.get(source, index), index)
    kept = set(graph.output.sources)
    plan: list[list[str]] = [[] for _ in stages]
    for source, index in last.items():
        if source not in kept:
            plan[index].append(source)
    return tuple(tuple(p) for p in plan)
