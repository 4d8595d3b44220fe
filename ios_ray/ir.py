"""The graph IR: units, their inputs, blocks and the graph, as plain frozen dataclasses.

A :class:`Graph` is what the frontend produces from an ``nn.Module`` and what search, profiler and runtime read.
It holds no tensors and no torch objects, round-trips through JSON and has a stable content fingerprint.

* A :class:`Unit` is one schedulable operator: a conv with its folded batch-norm and activation (and a prologue
  batch-norm and activation only it reads), a separable conv, a ``conv_transpose``, a ``conv3d``, a pool, an
  ``upsample``, a ``pad`` (or crop), an add, a linear, a flatten, a concat where one must exist, a channel
  ``shuffle`` or ``slice``, the ``scale`` of a squeeze-excitation gate, an ``elementwise`` chain on a tensor others
  read too, or an ``opaque`` unit that calls the original code of an op the importer does not know. Any unit may end
  in an epilogue of steps that keep its shape (``attrs['epilogue']``: activations, norms, arithmetic).
* A :class:`Value` is one input argument of a unit: the channel concatenation (dim 1) of *parts*, each part the
  elementwise sum of unit outputs. Concatenations and sums that feed a single consumer are folded into that
  consumer's input this way instead of becoming units of their own.
* A :class:`Block` is a single-entry single-exit region of the graph; the DP runs per block.

Shapes are per sample (no batch dimension); a unit's ``flops`` and ``bytes`` (activations read and written) are
per sample too, while ``weight_bytes`` (its parameters) does not grow with the batch. A graph's
``memory_format`` (``contiguous`` or ``channels_last``) is the layout its 4-D weights and activations are held in;
JSON and the fingerprint carry it only where it is not ``contiguous``.
"""

from __future__ import annotations

import hashlib
import json
from collections import abc
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

from ios_ray.vocabulary import DEFAULT_MEMORY_FORMAT

Shape = tuple[int, ...]

#: The name under which units refer to the graph's input tensor.
GRAPH_INPUT = "@input"

@dataclass(frozen=True)
class Value:
    """One unit input: concat (dim 1) of ``parts``, each part the elementwise sum of the named unit outputs."""

    parts: tuple[tuple[str, ...], ...]

    @staticmethod
    def of(source: str) -> "Value":
        """The plain output of one unit (or of the graph input)."""
        return Value(((source,),))

    @property
    def sources(self) -> tuple[str, ...]:
        """Every unit output this value reads, in order, without repeats."""
        return tuple(dict.fromkeys(s for part in self.parts for s in part))

    @property
    def is_plain(self) -> bool:
        """True when the value is just one unit's output (no concat, no sum)."""
        return len(self.parts) == 1 and len(self.parts[0]) == 1

    def to_json(self) -> list[list[str]]:
        """Plain JSON form: a list of parts, each a list of source names."""
        return [list(part) for part in self.parts]

    @staticmethod
    def from_json(data: list[list[str]]) -> "Value":
        """Inverse of :meth:`to_json`."""
        return Value(tuple(tuple(part) for part in data))


@dataclass(frozen=True)
class Unit:
    """One schedulable operator.

    ``attrs`` are the hyper-parameters that decide what it computes and how fast (they enter stage keys);
    ``refs`` bind it to the original module (submodule paths, fx node names) and never enter stage keys.
    """

    id: str
    kind: str
    inputs: tuple[Value, ...]
    shape: Shape
    attrs: Mapping[str, Any] = field(default_factory=dict)
    refs: Mapping[str, Any] = field(default_factory=dict)
    flops: int = 0
    bytes: int = 0
    weight_bytes: int = 0

    @property
    def sources(self) -> tuple[str, ...]:
        """Every unit output (or ``GRAPH_INPUT``) this unit reads, without repeats."""
        return tuple(dict.fromkeys(s for value in self.inputs for s in value.sources))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {
            "id": self.id,
            "kind": self.kind,
            "inputs": [v.to_json() for v in self.inputs],
            "shape": list(self.shape),
            "attrs": _jsonable(self.attrs),
            "refs": _jsonable(self.refs),
            "flops": self.flops,
            "bytes": self.bytes,
            "weight_bytes": self.weight_bytes,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Unit":
        """Inverse of :meth:`to_json`."""
        return Unit(
            id=data["id"],
            kind=data["kind"],
            inputs=tuple(Value.from_json(v) for v in data["inputs"]),
            shape=tuple(data["shape"]),
            attrs=_tupled(data.get("attrs", {})),
            refs=_tupled(data.get("refs", {})),
            flops=int(data.get("flops", 0)),
            bytes=int(data.get("bytes", 0)),
            weight_bytes=int(data.get("weight_bytes", 0)),
        )


@dataclass(frozen=True)
class Block:
    """A single-entry single-exit region: its units in topological order; the last one is its exit."""

    index: int
    units: tuple[str, ...]

    @property
    def exit(self) -> str:
        """The unit every path through the block ends in."""
        return self.units[-1]


@dataclass(frozen=True)
class Graph:
    """A CNN as units in topological order, the graph output, and the blocks the DP runs on."""

    name: str
    input_shape: Shape
    units: tuple[Unit, ...]
    output: Value
    blocks: tuple[Block, ...] = ()
    memory_format: str = DEFAULT_MEMORY_FORMAT

    def __post_init__(self) -> None:
        seen = {GRAPH_INPUT}
        for unit in self.units:
            missing = [s for s in unit.sources if s not in seen]
            if missing:
                raise ValueError(f"unit {unit.id!r} reads {missing} before they are computed")
            if unit.id in seen:
                raise ValueError(f"unit id {unit.id!r} appears twice")
            seen.add(unit.id)

    @cached_property
    def by_id(self) -> dict[str, Unit]:
        """Units by id."""
        return {u.id: u for u in self.units}

    def unit(self, unit_id: str) -> Unit:
        """The unit with this id."""
        return self.by_id[unit_id]

    @cached_property
    def users(self) -> dict[str, tuple[str, ...]]:
        """For each unit id (and ``GRAPH_INPUT``), the ids of the units that read its output."""
        users: dict[str, list[str]] = {GRAPH_INPUT: [], **{u.id: [] for u in self.units}}
        for unit in self.units:
            for source in unit.sources:
                users[source].append(unit.id)
        return {k: tuple(v) for k, v in users.items()}

    def shape_of(self, source: str) -> Shape:
        """The per-sample shape of a unit output or of the graph input."""
        return self.input_shape if source == GRAPH_INPUT else self.unit(source).shape

    def value_shape(self, value: Value) -> Shape:
        """The per-sample shape of a value (parts concatenated along channels)."""
        shapes = [self.shape_of(part[0]) for part in value.parts]
        if len(shapes) == 1:
            return shapes[0]
        return (sum(s[0] for s in shapes), *shapes[0][1:])

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (see :meth:`from_json`)."""
        data = {
            "format": "ios-ray-graph",
            "version": 1,
            "name": self.name,
            "input_shape": list(self.input_shape),
            "units": [u.to_json() for u in self.units],
            "output": self.output.to_json(),
            "blocks": [list(b.units) for b in self.blocks],
        }
        if self.memory_format != DEFAULT_MEMORY_FORMAT:
            data["memory_format"] = self.memory_format
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Graph":
        """Inverse of :meth:`to_json`."""
        if data.get("format") != "ios-ray-graph":
            raise ValueError("not an ios-ray graph")
        return Graph(
            name=data["name"],
            input_shape=tuple(data["input_shape"]),
            units=tuple(Unit.from_json(u) for u in data["units"]),
            output=Value.from_json(data["output"]),
            blocks=tuple(Block(i, tuple(b)) for i, b in enumerate(data["blocks"])),
            memory_format=data.get("memory_format", DEFAULT_MEMORY_FORMAT),
        )

    @cached_property
    def fingerprint(self) -> str:
        """A stable content hash of the graph's structure (names, kinds, attributes, inputs, shapes, memory format).

        It ignores ``refs`` and the graph's name, so re-importing the same module gives the same fingerprint
        and schedules can be checked against the graph they were made for.
        """
        data = self.to_json()
        for unit in data["units"]:
            del unit["refs"]
        del data["name"]
        return content_hash(data)


def content_hash(data: Any) -> str:
    """A short, stable hex digest of JSON-able data (dict keys sorted)."""
    text = json.dumps(_jsonable(data), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _jsonable(data: Any) -> Any:
    """Tuples to lists, mappings to dicts, recursively."""
    if isinstance(data, (str, int, float)) or data is None:
        return data
    if isinstance(data, abc.Mapping):
        return {str(k): _jsonable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_jsonable(v) for v in data]
    return data


def _tupled(data: Any) -> Any:
    """Lists back to tuples, recursively, so attributes compare equal after a JSON round trip."""
    if isinstance(data, abc.Mapping):
        return {k: _tupled(v) for k, v in data.items()}
    if isinstance(data, list):
        return tuple(_tupled(v) for v in data)
    return data
