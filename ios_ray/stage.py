"""Stages, their canonical descriptions and stage keys, and the operator-merge rule.

A :class:`Stage` is a set of units that runs between two barriers, split into groups. Its *key* is a content
hash of what it computes (unit kinds, attributes, shapes, the wiring inside each group, the strategy), with
unit names and the stage's position left out, so identical stages in two blocks, two models or two runs share
one key and one measurement.

Groups of a ``concurrent`` stage are unordered (they run at once), so their descriptions are sorted before
hashing. Inputs coming from outside the stage are described by their shape only: whether two groups read the
same tensor or two equal-shaped tensors does not enter the key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ios_ray.ir import Graph, Unit
from ios_ray.vocabulary import DEFAULT_MEMORY_FORMAT, STRATEGIES, Strategy


@dataclass(frozen=True)
class Stage:
    """Units between two barriers: ``groups`` of unit ids (each in execution order) and a strategy.

    ``concurrent``: the groups run at once, the units of a group one after another.
    ``merge``: every group is a single conv and all of them run as one wider conv (see :func:`can_merge`).
    """

    strategy: Strategy
    groups: tuple[tuple[str, ...], ...]

    @property
    def units(self) -> tuple[str, ...]:
        """All unit ids of the stage, group after group."""
        return tuple(u for g in self.groups for u in g)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {"strategy": self.strategy, "groups": [list(g) for g in self.groups]}

    @staticmethod
    def from_json(data: dict[str, Any]) -> "Stage":
        """Inverse of :meth:`to_json`."""
        if data["strategy"] not in STRATEGIES:
            raise ValueError(f"unknown stage strategy {data['strategy']!r}")
        return Stage(data["strategy"], tuple(tuple(g) for g in data["groups"]))


def can_merge(graph: Graph, unit_ids: Sequence[str]) -> bool:
    """Whether these convs can run as one conv: same input, stride, dilation, output size, activations; groups 1;
    no prologue batch-norm, no residual sum and no epilogue (those are per conv).

    Smaller kernels are zero-padded and centred to the largest, so each conv's padding must sit at the same
    offset from the merged kernel's centre (e.g. 1x3 pad (0,1) with 3x1 pad (1,0), or 1x1 pad 0 with 3x3 pad 1).
    """
    if len(unit_ids) < 2:
        return False
    units = [graph.unit(u) for u in unit_ids]
    first = units[0]
    if any(u.kind != "conv" or u.attrs["groups"] != 1 or "pre_norm" in u.attrs or "epilogue" in u.attrs
           or "residual" in u.attrs for u in units):
        return False
    same = ("stride", "dilation", "act", "pre_act")
    if any(u.inputs != first.inputs or u.shape[1:] != first.shape[1:] for u in units):
        return False
    if any(u.attrs[k] != first.attrs[k] for u in units for k in same):
        return False
    return merged_padding(units) is not None


def merged_padding(units: Sequence[Unit]) -> tuple[int, int] | None:
    """The padding of the merged conv of these convs, or None where their kernels cannot be centred together.

    A kernel of size k zero-padded to K (centred) with dilation d moves its taps by d * (K - k) / 2, so each conv's
    padding plus that shift must be the same for all of them.
    """
    kernel = tuple(max(u.attrs["kernel"][d] for u in units) for d in (0, 1))
    padding: set[tuple[int, ...]] = set()
    for unit in units:
        extra = [kernel[d] - unit.attrs["kernel"][d] for d in (0, 1)]
        if any(e % 2 for e in extra):
            return None
        dilation = unit.attrs["dilation"]
        padding.add(tuple(unit.attrs["padding"][d] + dilation[d] * extra[d] // 2 for d in (0, 1)))
    return padding.pop() if len(padding) == 1 else None  # type: ignore[return-value]


class StageKeys:
    """Computes canonical stage descriptions and keys for one graph, caching per-unit work.

    The description is compact JSON text built directly from cached per-unit pieces (this runs once per distinct
    candidate stage of a search, hundreds of thousands of times for a RandWire block), and the key is its hash.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        #: The graph's memory format as a description field, where it is not the default (NCHW keys predate it).
        layout = graph.memory_format
        self._layout = "" if layout == DEFAULT_MEMORY_FORMAT else f'"memory_format":"{layout}",'
        self._unit_core: dict[str, tuple[str, str]] = {}
        self._groups: dict[tuple[str, ...], str] = {}

    def describe_json(self, stage: Stage) -> str:
        """The canonical, name-free description of a stage as compact JSON text; its hash is the stage key."""
        groups = [self._group_json(g) for g in stage.groups]
        if stage.strategy == "concurrent":
            groups.sort()
        return f'{{"groups":[{",".join(groups)}],{self._layout}"strategy":"{stage.strategy}"}}'

    def describe(self, stage: Stage) -> dict[str, Any]:
        """:meth:`describe_json` parsed: strategy and, per group, each unit's kind, attrs, shape and inputs."""
        described: dict[str, Any] = json.loads(self.describe_json(stage))
        return described

    def key(self, stage: Stage) -> str:
        """The stage key: a content hash of :meth:`describe_json`."""
        return self.key_of(self.describe_json(stage))

    @staticmethod
    def key_of(description: str) -> str:
        """The stage key of a description from :meth:`describe_json`."""
        return hashlib.sha256(description.encode()).hexdigest()[:24]

    def _group_json(self, group: tuple[str, ...]) -> str:
        """A group's description (cached: a group appears in many stages)."""
        found = self._groups.get(group)
        if found is None:
            found = self._groups[group] = self._describe_group(group)
        return found

    def _describe_group(self, group: Iterable[str]) -> str:
        local = {unit_id: i for i, unit_id in enumerate(group)}
        units = []
        for unit_id in local:
            attrs, rest = self._core(unit_id)
            units.append(f'{{"attrs":{attrs},"inputs":{self._inputs_json(unit_id, local)},{rest}}}')
        return f"[{','.join(units)}]"

    def _inputs_json(self, unit_id: str, local: dict[str, int]) -> str:
        graph = self.graph
        return json.dumps([
            [[["local", local[s]] if s in local else ["ext", list(graph.shape_of(s))] for s in part] for part in v.parts]
            for v in graph.unit(unit_id).inputs
        ], separators=(",", ":"))

    def _core(self, unit_id: str) -> tuple[str, str]:
        """The unit's attrs as JSON text, and its kind and shape as JSON members (cached)."""
        core = self._unit_core.get(unit_id)
        if core is None:
            unit = self.graph.unit(unit_id)
            attrs = json.dumps(unit.attrs, sort_keys=True, separators=(",", ":"))
            rest = f'"kind":{json.dumps(unit.kind)},"shape":{json.dumps(list(unit.shape), separators=(",", ":"))}'
            core = self._unit_core[unit_id] = (attrs, rest)
        return core
