"""A match (a run of fx nodes that becomes one unit, and how its epilogue grows), and the scope rules match in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx


@dataclass
class Scope:
    """What the rules of one import share: the module, the nodes units have claimed, the constant nodes."""

    gm: fx.GraphModule
    constants: set[fx.Node]
    taken: set[fx.Node] = field(default_factory=set)

    def free(self, node: object) -> bool:
        """Whether ``node`` is a computed node (not a constant) that no unit has claimed yet."""
        return isinstance(node, fx.Node) and node not in self.taken and node not in self.constants


@dataclass
class Match:
    """Fx nodes that become one unit of ``kind``: it reads ``inputs``; ``main`` computes its op, ``tail`` its output.

    ``nodes`` are all the nodes the unit stands for (prologue, main op, folded batch-norm and activation, epilogue);
    ``attrs`` and ``refs`` become the unit's (``attrs`` enter stage keys, ``refs`` bind it to the module).
    """

    kind: str
    id: str
    inputs: list[fx.Node]
    main: fx.Node
    tail: fx.Node
    nodes: list[fx.Node]
    attrs: dict[str, Any]
    refs: dict[str, Any]

    @staticmethod
    def single(kind: str, node: fx.Node, inputs: list[fx.Node], attrs: dict[str, Any]) -> "Match":
        """A unit of one node that runs the node's own code (a pool, a flatten...)."""
        return Match(kind, node.name, inputs, node, node, [node], attrs, {"node": node.name})

    def add_epilogue(self, chain: list[tuple[fx.Node, str]]) -> None:
        """Append elementwise steps (node, text) after the unit's output."""
        if not chain:
            return
        self.nodes += [node for node, _ in chain]
        self.tail = chain[-1][0]
        self.attrs["epilogue"] = tuple(self.attrs.get("epilogue", ())) + tuple(text for _, text in chain)
        self.refs["epilogue"] = tuple(self.refs.get("epilogue", ())) + tuple(node.name for node, _ in chain)
