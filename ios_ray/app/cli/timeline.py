"""A schedule as a timeline, for the picture ``ios-ray show --plot`` draws (:mod:`ios_ray.app.cli.plot`): which units run
on which stream or thread, from when to when, which of them make the critical path, and the sequential schedule's
timeline beside it.

Times come from latencies measured one stage at a time (simulated on a ``sim:`` device): a stage lasts its latency
in the schedule file and starts where the stage before it ends (the barrier between them). Inside a concurrent
stage, group ``g`` runs on stream (GPU) or thread (CPU) ``g``; how long a group takes on its own is the store's
latency of that group as a stage of its own where the store holds it (a lazy search measures every one-group stage),
else the sum of its units alone; a group never outlasts its stage. Each unit of a group takes the share of the group
that its latency alone takes of the units' together. The group that takes longest holds the stage until its
barrier, so the critical path runs through it; in a merge stage one wider conv does every unit's work. The
sequential schedule runs every unit alone, one after another, each for its latency alone (all of it critical, so
none of it is marked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ios_ray.app.search.budgets import Lookup
from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.schedule import Schedule
from ios_ray.scheduler import sequential_stages
from ios_ray.stage import Stage, StageKeys

@dataclass(frozen=True)
class Bar:
    """One unit's span on a lane (milliseconds from the start), the stage it belongs to, and how it runs."""

    unit: str
    kind: str
    lane: int
    start_ms: float
    ms: float
    stage: int
    merged: bool = False
    critical: bool = False
    known: bool = True  # False: the store lacks the group's latencies, so it is drawn across its whole stage


@dataclass(frozen=True)
class Timeline:
    """The bars of one schedule, the start and length of each of its stages, and its lanes."""

    bars: tuple[Bar, ...]
    stages: tuple[tuple[float, float], ...]
    lanes: int

    @property
    def total_ms(self) -> float:
        """When the last stage ends."""
        return sum(ms for _, ms in self.stages)


def timelines(schedule: Schedule, graph: Graph, lookup: Lookup | None) -> tuple[Timeline, Timeline | None]:
    """The timeline of ``schedule`` and that of the sequential schedule of its graph (None where the store, or no
    store, does not hold every unit alone at the schedule's setting)."""
    keys = StageKeys(graph)
    alone = {unit.id: Stage("concurrent", ((unit.id,),)) for unit in graph.units}
    groups = {group: Stage("concurrent", (group,)) for stage in schedule.stages for group in stage.groups
              if stage.strategy == "concurrent" and len(stage.groups) > 1 and len(group) > 1}
    key = {stage: keys.key(stage) for stage in (*alone.values(), *groups.values())}
    table = lookup(sorted(set(key.values())), schedule.device_fingerprint, schedule.batch, schedule.dtype) \
        if lookup is not None else {}
    units_alone = {unit: table[key[stage]] for unit, stage in alone.items() if key[stage] in table}
    group_alone = {group: table[key[stage]] for group, stage in groups.items() if key[stage] in table}
    return (_scheduled(schedule, graph, units_alone, group_alone),
            _sequential(graph, units_alone) if len(units_alone) == len(graph.units) else None)


def _scheduled(schedule: Schedule, graph: Graph, units_alone: Mapping[str, float],
               group_alone: Mapping[tuple[str, ...], float]) -> Timeline:
    """The timeline of the stages of a schedule file, each as long as its latency in the file."""
    bars: list[Bar] = []
    spans: list[tuple[float, float]] = []
    start = 0.0
    for index, (stage, ms) in enumerate(_stage_latencies(schedule)):
        if stage.strategy == "merge":
            units = [unit for group in stage.groups for unit in group]
            bars += _split(graph, units, units_alone, 0, start, ms, index, merged=True, critical=True, known=True)
        else:
            own = [ms if len(stage.groups) == 1 else _group_ms(group, units_alone, group_alone)
                   for group in stage.groups]
            known = [ms if group_ms is None else group_ms for group_ms in own]
            longest = max(range(len(own)), key=known.__getitem__)
            for lane, (group, group_ms) in enumerate(zip(stage.groups, own)):
                span = ms if group_ms is None else min(group_ms, ms)
                bars += _split(graph, group, units_alone, lane, start, span, index, merged=False,
                               critical=lane == longest, known=group_ms is not None)
        spans.append((start, ms))
        start += ms
    lanes = max((len(stage.groups) if stage.strategy == "concurrent" else 1) for stage in schedule.stages)
    return Timeline(tuple(bars), tuple(spans), lanes)


def _sequential(graph: Graph, units_alone: Mapping[str, float]) -> Timeline:
    """The sequential schedule's timeline: every unit alone, in order, on one lane."""
    bars, spans, start = [], [], 0.0
    for index, stage in enumerate(s for block in graph.blocks for s in sequential_stages(graph, block)):
        [[unit]] = stage.groups
        ms = units_alone[unit]
        bars.append(Bar(unit, graph.unit(unit).kind, 0, start, ms, index))
        spans.append((start, ms))
        start += ms
    return Timeline(tuple(bars), tuple(spans), 1)


def _stage_latencies(schedule: Schedule) -> list[tuple[Stage, float]]:
    """Every stage of a schedule with its latency in the file; UserError where the file lacks one."""
    pairs = []
    for block in schedule.blocks:
        latencies = block.latencies or (None,) * len(block.stages)
        for stage, ms in zip(block.stages, latencies):
            if ms is None:
                raise UserError(f"the schedule of {schedule.model} on {schedule.device} lacks the latency of a stage "
                                f"of block {block.block}, so it cannot be drawn on a time axis; write it again with "
                                "ios-ray search.")
            pairs.append((stage, ms))
    return pairs


def _group_ms(group: tuple[str, ...], units_alone: Mapping[str, float],
              group_alone: Mapping[tuple[str, ...], float]) -> float | None:
    """A group's latency on its own: measured as a stage, else its units' alone summed, else None."""
    if group in group_alone:
        return group_alone[group]
    if all(unit in units_alone for unit in group):
        return sum(units_alone[unit] for unit in group)
    return None


def _split(graph: Graph, units: Sequence[str], units_alone: Mapping[str, float], lane: int, start: float, ms: float,
           stage: int, *, merged: bool, critical: bool, known: bool) -> list[Bar]:
    """The bars of units that run one after another (or merged) for ``ms`` from ``start``, each its share."""
    weights = [units_alone.get(unit, 0.0) for unit in units]
    total = sum(weights)
    shares = [w / total for w in weights] if total > 0 else [1 / len(units)] * len(units)
    bars, at = [], start
    for unit, share in zip(units, shares):
        bars.append(Bar(unit, graph.unit(unit).kind, lane, at, ms * share, stage, merged, critical, known))
        at += ms * share
    return bars
