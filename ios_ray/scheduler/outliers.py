"""Stages measured slower than they can be: a unit alone measured much slower than a stage that does its work and more.

A latency measured during a burst of load from elsewhere (another process on the node, a pause of the measuring
process) is stored, and every later search reuses it; the median of one measurement's samples cannot help where the
burst outlasts them. Such an outlier shows in the measurements themselves: a stage that runs a unit with others
(in a chain, beside other groups, merged into one conv) does all of that unit's work, so a unit alone measured
several times slower than such a stage was measured slow. Units alone matter most: they make the sequential
schedule, and the lazy search bounds every larger stage from them. The search measures each unit :func:`inflated`
finds once more (the store keeps the new row), on measured devices only.

::

    parts = unit_parts(plan.stages, keys)           # once per search
    again = inflated(table, parts)                  # per device and batch, from the store's latencies
"""

from __future__ import annotations

from typing import Mapping

from ios_ray.scheduler.plan import PlannedStage
from ios_ray.stage import Stage, StageKeys

#: How many times slower than a measured stage containing it, and by how many ms at least, a unit alone must be to
#: be measured again: far beyond timing noise (a burst of load slowed a 0.1 ms conv to 17 ms here), so that a quiet
#: store is never measured again. Fixed, not derived from the device's spread: it detects gross errors rather than
#: modelling noise. A machine whose rows spread widely is one where bursts are common, and a factor raised with the
#: spread would hide exactly the outliers it is there to catch; a false alarm costs one unit measured once more per
#: search, a miss a latency several times too high in every later search. Ordinary noise stays far below it: this
#: machine's speed drifts by at most 25% (bench/RESULTS.md, prediction).
SLOWER_THAN_CONTAINING = 3.0
SLOWER_BY_MS = 0.05


def unit_parts(planned: Mapping[str, PlannedStage], keys: StageKeys) -> dict[str, tuple[str, ...]]:
    """For every planned stage of several units (by key), the stage keys of its units alone."""
    alone: dict[str, str] = {}

    def key_alone(unit_id: str) -> str:
        if unit_id not in alone:
            alone[unit_id] = keys.key(Stage("concurrent", ((unit_id,),)))
        return alone[unit_id]

    return {key: tuple(dict.fromkeys(key_alone(u) for u in p.stage.units))
            for key, p in planned.items() if len(p.stage.units) > 1}


def inflated(table: Mapping[str, float], parts: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The keys of units alone in ``table`` (key -> ms) measured more than :data:`SLOWER_THAN_CONTAINING` times and
    :data:`SLOWER_BY_MS` slower than some measured stage that contains them, the most inflated first."""
    fastest: dict[str, float] = {}
    for key, unit_keys in parts.items():
        latency = table.get(key)
        if latency is None:
            continue
        for unit_key in unit_keys:
            if latency < fastest.get(unit_key, float("inf")):
                fastest[unit_key] = latency
    ratios = {k: table[k] / fast for k, fast in fastest.items()
              if fast > 0 and k in table and table[k] > max(SLOWER_THAN_CONTAINING * fast, fast + SLOWER_BY_MS)}
    return sorted(ratios, key=lambda k: -ratios[k])
