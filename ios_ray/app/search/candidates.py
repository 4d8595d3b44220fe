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
records its stages' latencies as measured; the check (:mod:`~ios_ray.app.search.check`) times them whole and keeps one.
"""

from __future__ import annotations

from ios_ray.app.search.measuring import Setting
from ios_ray.app.search.solver import Solver
from ios_ray.schedule import BlockSchedule, PeakMemory, Schedule
from ios_ray.scheduler import greedy_stages

#: The price of an alternative's stage, or group beside a stage's first, as a share of a unit's mean latency alone.
ALTERNATIVE_PRICE = 0.5


def candidates(solver: Solver, setting: Setting) -> dict[str, Schedule]:
    """The candidates of one setting (its kernels chosen), by name, the DP's first and sequential last, each solved
    by ``solver`` (:class:`~ios_ray.app.search.solver.Solver`: its file carries the DP's bounds, the measuring record, the
    kernels' choice and the correction)."""
    assert setting.kernels is not None, "a setting is solved after its kernels are chosen"
    base = solver.solve(setting)
    plain = solver.sequential(base, setting)
    found = {"dp": base}
    if not setting.simulated:
        graph = solver.graph
        unit_ms = (plain.predicted_latency or 0.0) / max(len(graph.units), 1) * ALTERNATIVE_PRICE
        for name, price in (("dp-fewer-stages", (unit_ms, 0.0)), ("dp-fewer-groups", (0.0, unit_ms))):
            found[name] = solver.solve(setting, price)
        keys, table = solver.measuring.stage_keys, setting.table
        blocks = tuple(BlockSchedule(block.index, stages, tuple(table.get(keys.key(stage)) for stage in stages))
                       for block in graph.blocks for stages in [greedy_stages(graph, block)])
        found["greedy"] = solver.alternative(base, blocks)
    found["sequential"] = plain
    return _distinct_within_budget(found)


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
