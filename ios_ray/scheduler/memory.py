"""Peak memory of a schedule: the activations the runtime holds at once while it runs the schedule.

The model follows what :mod:`ios_ray.runtime` allocates, counted in elements per sample (every activation grows
with the batch; :func:`to_bytes` scales a count to a batch and dtype):

* a value is alive from the stage that computes it to the end of the last stage that reads it
  (:func:`ios_ray.lifetimes.release_plan`); the graph's outputs to the end; the graph input throughout (the caller
  holds it);
* a *view* shares the memory of the value it reads: a ``flatten`` (of an NCHW map, or of any 1x1 one), a ``slice``,
  and an ``add``, ``concat`` or ``elementwise`` unit without epilogue on a plain value; memory is freed once every
  value on it is released;
* inside a stage every unit's output is held to the stage's end; a group runs its units one after another, and
  the groups of a concurrent stage run at once, so the stage needs every group's highest point at the same time;
* while a unit runs it also holds its materialised inputs (a concatenation or sum of several outputs; a sum of
  three or more holds two partial sums for a moment), the temporaries of its prologue (batch-norm scale and shift,
  pre-activation: the input's size each), a conv's output beside its activation's, a separable conv's depthwise
  output, and an epilogue's previous step beside the next;
* a merge stage materialises its shared input once and computes one wide output; its units' outputs are slices of
  it, so that memory is freed only when the last of them is released (the other slices are *pinned* until then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

from ios_ray.ir import GRAPH_INPUT, Block, Graph, Unit, Value
from ios_ray.lifetimes import release_plan
from ios_ray.stage import Stage
from ios_ray.vocabulary import DEFAULT_MEMORY_FORMAT, DTYPE_BYTES

#: Unit kinds whose output is their (materialised) input itself, without an epilogue.
IDENTITY_KINDS = ("add", "concat", "elementwise")
#: Unit kinds that allocate their output and nothing else while they run (beyond their materialised inputs).
PLAIN_KINDS = ("linear", "conv_transpose", "conv3d", "scale", "shuffle", "pool", "upsample", "pad", "opaque")


@dataclass(frozen=True)
class Alloc:
    """What running a unit or stage allocates, in elements per sample: ``peak`` at its highest point (its outputs
    included) and ``keep``, what it leaves allocated."""

    peak: int
    keep: int


@dataclass(frozen=True)
class Peak:
    """A schedule's peak, in elements per sample, and the stage it is reached in (``None``: after the last, where
    the graph's output is put together)."""

    elements: int
    stage: int | None


def to_bytes(elements: int, batch: int, dtype: str) -> int:
    """Bytes of ``elements`` per sample at batch size ``batch`` in ``dtype``."""
    return elements * batch * DTYPE_BYTES[dtype]


class GraphMemory:
    """The memory model of one graph (see the module docstring): what each unit and stage allocates, which values
    share memory, and the peak of any schedule, in elements per sample."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.units: dict[str, Alloc] = {}
        #: For a view unit, the value whose memory it shares.
        self.view_of: dict[str, str] = {}
        for unit in graph.units:
            self.units[unit.id], viewed = _unit_alloc(graph, unit)
            if viewed is not None:
                self.view_of[unit.id] = viewed
        self._stages: dict[Stage, Alloc] = {}

    def root(self, value: str) -> str:
        """The value that owns the memory ``value`` lives in (itself, unless it is a view)."""
        while value in self.view_of:
            value = self.view_of[value]
        return value

    def elements(self, root: str) -> int:
        """The elements per sample of the memory a root value owns."""
        return numel(self.graph.input_shape) if root == GRAPH_INPUT else self.units[root].keep

    @cached_property
    def members(self) -> dict[str, tuple[str, ...]]:
        """For each root value, every value that lives in its memory (itself and its views)."""
        found: dict[str, list[str]] = {GRAPH_INPUT: [GRAPH_INPUT]}
        for unit in self.graph.units:
            found.setdefault(self.root(unit.id), []).append(unit.id)
        return {root: tuple(values) for root, values in found.items()}

    @cached_property
    def output(self) -> Alloc:
        """What putting the graph's output together after the last stage allocates."""
        peak, keep = _materialised(self.graph, self.graph.output)
        return Alloc(peak, keep)

    def stage(self, stage: Stage) -> Alloc:
        """What running ``stage`` allocates on top of what is alive before it (cached)."""
        found = self._stages.get(stage)
        if found is None:
            found = self._stages[stage] = self._merge(stage) if stage.strategy == "merge" else self._concurrent(stage)
        return found

    def _concurrent(self, stage: Stage) -> Alloc:
        """Groups at once, each unit after unit holding the outputs before it: the sum of the groups' highest points."""
        peak = keep = 0
        for group in stage.groups:
            held = top = 0
            for unit_id in group:
                alloc = self.units[unit_id]
                top = max(top, held + alloc.peak)
                held += alloc.keep
            peak += top
            keep += held
        return Alloc(peak, keep)

    def _merge(self, stage: Stage) -> Alloc:
        """The shared input materialised once, then one conv over all output channels (with its activation)."""
        units = [self.graph.unit(u) for u in stage.units]
        first = units[0]
        mat_peak, held = _materialised(self.graph, first.inputs[0])
        wide = sum(numel(u.shape) for u in units)
        pre = self._input_size(first) if first.attrs.get("pre_act") else 0
        body = pre + wide * (2 if first.attrs.get("act") else 1)
        return Alloc(max(mat_peak, held + body), wide)

    def _input_size(self, unit: Unit) -> int:
        return numel(self.graph.value_shape(unit.inputs[0]))

    def least_peak(self) -> int:
        """A lower bound on every schedule's peak: the graph input (held throughout) with the sources and the
        allocation of the unit that needs most while it runs (whatever runs beside it comes on top)."""
        most = 0
        for unit in self.graph.units:
            roots = {self.root(source) for source in unit.sources} - {GRAPH_INPUT}
            most = max(most, sum(self.elements(root) for root in roots) + self.units[unit.id].peak)
        return numel(self.graph.input_shape) + most

    def schedule_peak(self, stages: Sequence[Stage]) -> Peak:
        """The peak of running ``stages`` (a whole graph's, in order), by replaying what the runtime allocates and
        frees: a direct simulation, independent of the DP's per-state view of the same model."""
        storage_of: dict[str, object] = {GRAPH_INPUT: GRAPH_INPUT}
        storages: dict[object, tuple[int, set[str]]] = {GRAPH_INPUT: (numel(self.graph.input_shape), {GRAPH_INPUT})}
        alive = storages[GRAPH_INPUT][0]
        peak = Peak(0, None)
        for index, (stage, released) in enumerate(zip(stages, release_plan(self.graph, stages))):
            alloc = self.stage(stage)
            if alive + alloc.peak > peak.elements:
                peak = Peak(alive + alloc.peak, index)
            merged = stage.strategy == "merge"
            if merged:
                storages[index] = (alloc.keep, set(stage.units))
            for unit_id in stage.units:
                viewed = self.view_of.get(unit_id)
                key = index if merged else storage_of[viewed] if viewed is not None else unit_id
                storage_of[unit_id] = key
                if key not in storages:
                    storages[key] = (self.units[unit_id].keep, set())
                storages[key][1].add(unit_id)
            alive += alloc.keep
            for value in released:
                size, values = storages[storage_of[value]]
                values.discard(value)
                if not values and storage_of[value] != GRAPH_INPUT:
                    alive -= size
                    del storages[storage_of[value]]
        return peak if alive + self.output.peak <= peak.elements else Peak(alive + self.output.peak, None)


class BlockMemory:
    """What is alive between two stages of one block, as the budgeted DP (:mod:`~ios_ray.scheduler.budget`) needs
    it: a function of the units done (a mask over the block's units, bit ``i`` for its ``i``-th unit) and of the
    merge stages whose outputs still pin memory, in elements per sample.

    A value's memory (its root's, with every view on it) is alive once one of its values is computed and while
    one of them is still to be read: by a unit of the block not done yet, by a later block, as the graph's
    output, or as the graph input (held by the caller). Earlier blocks are done, later ones not started.
    """

    def __init__(self, memory: GraphMemory, block: Block) -> None:
        self.graph = memory
        graph = memory.graph
        position = next(i for i, b in enumerate(graph.blocks) if b.index == block.index)
        before = {u for b in graph.blocks[:position] for u in b.units} | {GRAPH_INPUT}
        bit = {unit_id: i for i, unit_id in enumerate(block.units)}
        kept = set(graph.output.sources) | {GRAPH_INPUT}
        #: Per root that can be alive during the block: its size and, per computed value on it, (the bit that
        #: computes it, 0 where it is computed before the block; whether it is read after the block; the mask of
        #: its readers in the block).
        self.roots: dict[str, tuple[int, list[tuple[int, bool, int]]]] = {}
        for root, members in memory.members.items():
            terms = []
            for value in members:
                if value not in before and value not in bit:
                    continue
                readers = graph.users[value]
                later = value in kept or any(r not in bit and r not in before for r in readers)
                inside = sum(1 << bit[r] for r in readers if r in bit)
                if later or inside:
                    terms.append((1 << bit[value] if value in bit else 0, later, inside))
            if terms:
                self.roots[root] = (memory.elements(root), terms)
        self._alive: dict[int, tuple[int, frozenset[str]]] = {}

    def alive(self, done: int) -> tuple[int, frozenset[str]]:
        """The elements alive once the units of ``done`` have run (merges aside), and the roots holding them."""
        found = self._alive.get(done)
        if found is None:
            total, roots = 0, []
            for root, (size, terms) in self.roots.items():
                if any((made == 0 or made & done) and (later or inside & ~done) for made, later, inside in terms):
                    total += size
                    roots.append(root)
            found = self._alive[done] = (total, frozenset(roots))
        return found

    def between(self, done: int, pins: frozenset[tuple[str, ...]]) -> int:
        """The elements alive once ``done`` has run, with the slices that the merge stages ``pins`` still hold."""
        total, roots = self.alive(done)
        for merged in pins:
            total += sum(self.graph.elements(u) for u in merged if u not in roots)
        return total

    def pins_after(self, done: int, pins: frozenset[tuple[str, ...]], stage: Stage
                   ) -> frozenset[tuple[str, ...]]:
        """The merge stages that pin memory once ``stage`` has run and the units of ``done`` (which include it)
        are done: those of ``pins`` and ``stage`` itself (if it merges) with a slice still alive."""
        candidates = pins | {stage.units} if stage.strategy == "merge" else pins
        _, roots = self.alive(done)
        return frozenset(m for m in candidates if any(u in roots for u in m))


def numel(shape: Sequence[int]) -> int:
    """Elements of a per-sample shape."""
    return math.prod(shape)


def _materialised(graph: Graph, value: Value) -> tuple[int, int]:
    """What evaluating a unit input allocates (:meth:`ios_ray.runtime.program.Program.value`): its highest point
    and what it holds after, in elements per sample; nothing for a plain value, which is read where it is."""
    if value.is_plain:
        return 0, 0
    peak = held = 0
    for part in value.parts:
        if len(part) == 1:
            continue
        size = numel(graph.shape_of(part[0]))
        peak = max(peak, held + size * (2 if len(part) >= 3 else 1))
        held += size
    if len(value.parts) == 1:
        return peak, held
    total = numel(graph.value_shape(value))
    return max(peak, held + total), total


def _unit_alloc(graph: Graph, unit: Unit) -> tuple[Alloc, str | None]:
    """What running ``unit`` allocates (beyond its inputs) and, for a view, the value whose memory it shares."""
    mat_peak, held = 0, 0
    for value in unit.inputs:
        value_peak, value_keep = _materialised(graph, value)
        mat_peak = max(mat_peak, held + value_peak)
        held += value_keep
    out = numel(unit.shape)
    steps = len(unit.attrs.get("epilogue", ()))
    body_peak, body_keep = _body(graph, unit, out)
    if body_peak == 0 and not steps:  # the output is the (materialised) input, or a view of it
        plain = unit.inputs[0].is_plain
        return Alloc(mat_peak, held), unit.inputs[0].sources[0] if plain else None
    peak = max(mat_peak, held + body_peak)
    if steps:
        peak = max(peak, held + body_keep + out, held + 2 * out if steps > 1 else 0)
        return Alloc(peak, out), None
    return Alloc(peak, body_keep), None


def _body(graph: Graph, unit: Unit, out: int) -> tuple[int, int]:
    """A unit's own callable (:mod:`ios_ray.runtime.units`): its highest point and its output's new memory, on top
    of its materialised inputs; (0, 0) where its output is its input or a view of it."""
    kind, attrs = unit.kind, unit.attrs
    size = numel(graph.value_shape(unit.inputs[0])) if unit.inputs else 0
    act = 2 if attrs.get("act") else 1
    if kind in ("conv", "sepconv"):
        scaled, activated = "pre_norm" in attrs, attrs.get("pre_act") is not None
        pre = size if scaled or activated else 0
        prologue = 2 * size if scaled and activated else pre
        if kind == "conv":
            return max(prologue, pre + out * act), out
        depthwise = attrs["in_channels"] * out // attrs["out_channels"]
        return max(prologue, pre + depthwise, depthwise + out * act), out
    if kind in IDENTITY_KINDS or kind == "slice" or (kind == "flatten" and _flattens_in_place(graph, unit)):
        return 0, 0
    return out, out


def _flattens_in_place(graph: Graph, unit: Unit) -> bool:
    """Whether ``torch.flatten`` returns a view of this unit's input: in NCHW always, in NHWC where the map is 1x1."""
    shape = graph.value_shape(unit.inputs[0])
    return graph.memory_format == DEFAULT_MEMORY_FORMAT or len(shape) != 3 or shape[1:] == (1, 1)
