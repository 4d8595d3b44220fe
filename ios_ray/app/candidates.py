"""The schedules a search's end-to-end check runs for one setting (device, batch), by their names in files
(:data:`~ios_ray.schedule.CANDIDATES`):

* ``dp``: the DP's schedule over the setting's measured stages, priced by its correction
  (:mod:`~ios_ray.scheduler.correction`), within its memory budget;
* ``dp-fewer-stages`` and ``dp-fewer-groups``: the DP's schedule with a price on every stage, and on every group
  beside a stage's first, of half the mean latency of a unit alone (the sequential schedule's prediction over its
  units): the next-best schedules by prediction that run fewer stages (fewer barriers between them) or fewer groups
  at once (less interference between them), the two things a sum of stages timed alone misses;
* ``greedy``: every ready unit of a block in one stage (the paper's greedy), where it keeps within the budget (a
  stage the store lacks has no latency in its file: the search measures them on a measured device);
* ``sequential``: the baseline: a search never keeps a schedule that is not faster than it beyond noise.

A candidate that runs the same stages as one before it is left out. Every candidate runs the setting's kernels and
records its stages' latencies as measured; the check (:mod:`~ios_ray.app.check`) times them whole and keeps one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

from ios_ray.app.budgets import peak_bytes
from ios_ray.app.measuring import Measuring, Setting
from ios_ray.ir import Graph
from ios_ray.schedule import BlockSchedule, PeakMemory, Schedule
from ios_ray.scheduler import TableLatency, greedy_stages, sequential
from ios_ray.scheduler.memory import GraphMemory

#: The price of an alternative's stage, or group beside a stage's first, as a share of a unit's mean latency alone.
ALTERNATIVE_PRICE = 0.5


def candidates(measuring: Measuring, setting: Setting, graph: Graph, model: str, params: Mapping[str, Any],
               dtype: str) -> dict[str, Schedule]:
    """The candidates of one setting, by name, the DP's first and sequential last; each a :class:`Schedule` whose
    ``params`` carry ``params``, the measuring record, the kernels' choice and the correction."""
    blocks, record, memory = measuring.solve(setting, dtype)
    assert setting.kernels is not None, "a setting is solved after its kernels are chosen"
    identity = setting.identity
    base = Schedule(
        model=model, graph_fingerprint=graph.fingerprint, device=identity.label, batch=setting.batch, blocks=blocks,
        dtype=dtype, device_fingerprint=identity.fingerprint, device_info=dict(identity.info),
        params={**params, "measure": record, "kernels": setting.kernels.to_json(),
                **({"correction": setting.correction.to_json()} if setting.correction.runs else {})},
        source=identity.source, input_shape=graph.input_shape, memory_format=graph.memory_format, memory=memory,
        kernels=setting.kernels.kernels)
    measured = TableLatency(measuring.stage_keys, setting.table, missing=math.inf)
    plain = _with(base, tuple(sequential(graph, block, measured) for block in graph.blocks),
                  memory.sequential_peak_bytes)
    found = {"dp": base}
    if not setting.simulated:
        peak = functools.partial(peak_bytes, GraphMemory(graph), batch=setting.batch, dtype=dtype)
        unit_ms = (plain.predicted_latency or 0.0) / max(len(graph.units), 1) * ALTERNATIVE_PRICE
        for name, price in (("dp-fewer-stages", (unit_ms, 0.0)), ("dp-fewer-groups", (0.0, unit_ms))):
            blocks = measuring.solve(setting, dtype, price)[0]
            found[name] = _with(base, blocks, peak(blocks))
        keys, table = measuring.stage_keys, setting.table
        blocks = tuple(BlockSchedule(block.index, stages, tuple(table.get(keys.key(stage)) for stage in stages))
                       for block in graph.blocks for stages in [greedy_stages(graph, block)])
        found["greedy"] = _with(base, blocks, peak(blocks))
    found["sequential"] = plain
    return _distinct_within_budget(found)


def _with(base: Schedule, blocks: tuple[BlockSchedule, ...], peak: int) -> Schedule:
    """``base`` with other blocks, of this peak."""
    assert base.memory is not None, "a solved schedule knows its peak"
    return dataclasses.replace(base, blocks=blocks, memory=dataclasses.replace(base.memory, peak_bytes=peak))


def _distinct_within_budget(found: dict[str, Schedule]) -> dict[str, Schedule]:
    """The candidates that keep within the budget (sequential always stays: it is the baseline) and run other
    stages than every candidate before them."""
    kept: dict[str, Schedule] = {}
    for name, schedule in found.items():
        memory: PeakMemory | None = schedule.memory
        over = memory is not None and memory.budget_bytes is not None and memory.peak_bytes > memory.budget_bytes
        if name != "sequential" and (over or any(schedule.stages == other.stages for other in kept.values())):
            continue
        kept[name] = schedule
    return kept
