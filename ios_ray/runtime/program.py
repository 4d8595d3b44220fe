"""A graph bound to torch: one callable per unit, and sequential execution in topological order.

:class:`Program` is the executable form of an :class:`~ios_ray.frontend.Imported` graph on one device. Convs
carry their batch-norm folded into weight and bias (eval mode), separable convs likewise; pools, flattens and
opaque units call the original fx node's code; ``add`` and ``concat`` units only evaluate their input value.
Stage execution (``ios_ray.runtime.stages``) and the profiler call the very same unit callables. Binding to the
CPU keeps freed memory in the process (:mod:`~ios_ray.runtime.allocator`), for measurement and deployment alike.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ios_ray.frontend import Imported
from ios_ray.ir import GRAPH_INPUT, Graph, Unit, Value
from ios_ray.runtime.allocator import keep_freed_memory

UnitFn = Callable[[list[torch.Tensor]], torch.Tensor]
Env = dict[str, torch.Tensor]

_ACTIVATIONS: dict[str | None, Callable[[torch.Tensor], torch.Tensor]] = {
    None: lambda x: x, "relu": F.relu, "relu6": F.relu6, "silu": F.silu,
}


def activation(name: str | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The torch function of an activation name used in unit attributes (None is the identity)."""
    return _ACTIVATIONS[name]


@dataclass
class FoldedConv:
    """A conv with its batch-norm folded in, and its activations; callable on one input tensor."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    act: str | None = None
    pre_act: str | None = None

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        x = activation(self.pre_act)(inputs[0])
        y = F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return activation(self.act)(y)


@dataclass
class FoldedSepConv:
    """Depthwise conv then pointwise conv with the batch-norm folded into the pointwise one."""

    depthwise: FoldedConv
    pointwise: FoldedConv

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return self.pointwise([self.depthwise(inputs)])


@dataclass
class NodeCall:
    """Calls the original code of one fx node, with the unit's inputs in place of its tensor arguments."""

    node: fx.Node
    module: fx.GraphModule
    arg_names: tuple[str, ...]
    constants: Mapping[str, Any]

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        given = dict(zip(self.arg_names, inputs))
        lookup = lambda n: given[n.name] if n.name in given else self.constants[n.name]  # noqa: E731
        args = fx.node.map_arg(self.node.args, lookup)
        kwargs = fx.node.map_arg(self.node.kwargs, lookup)
        if self.node.op == "call_module":
            return self.module.get_submodule(self.node.target)(*args, **kwargs)
        if self.node.op == "call_method":
            return getattr(args[0], self.node.target)(*args[1:], **kwargs)
        return self.node.target(*args, **kwargs)


class Program:
    """A graph bound to torch callables on one device; :meth:`run` executes it unit by unit."""

    def __init__(self, graph: Graph, fns: Mapping[str, UnitFn], device: torch.device) -> None:
        self.graph = graph
        self.fns = dict(fns)
        self.device = device

    @staticmethod
    def from_imported(imported: Imported, device: torch.device | str = "cpu") -> "Program":
        """Bind an imported graph to its module's weights, copied onto ``device``."""
        device = torch.device(device)
        if device.type == "cpu":
            keep_freed_memory()
        module = copy.deepcopy(imported.module).to(device).eval()
        constants = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in imported.constants.items()}
        nodes = {n.name: n for n in module.graph.nodes}
        fns = {u.id: _bind(u, module, nodes, constants) for u in imported.graph.units}
        return Program(imported.graph, fns, device)

    def value(self, value: Value, env: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Evaluate a unit input: the channel concat of parts, each the sum of the named outputs."""
        parts = [_sum([env[s] for s in part]) for part in value.parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def run_unit(self, unit_id: str, env: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Run one unit on the outputs in ``env`` and return its output."""
        unit = self.graph.unit(unit_id)
        return self.fns[unit_id]([self.value(v, env) for v in unit.inputs])

    @torch.no_grad()
    def run(self, x: torch.Tensor) -> torch.Tensor:
        """Sequential execution: every unit in topological order."""
        env: Env = {GRAPH_INPUT: x}
        for unit in self.graph.units:
            env[unit.id] = self.run_unit(unit.id, env)
        return self.value(self.graph.output, env)


def _sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return total


def _bind(unit: Unit, module: fx.GraphModule, nodes: Mapping[str, fx.Node], constants: Mapping[str, Any]) -> UnitFn:
    """The callable of one unit."""
    if unit.kind == "conv":
        return _fold(module.get_submodule(unit.refs["conv"]), _bn(module, unit), unit.attrs)
    if unit.kind == "sepconv":
        depthwise = _fold(module.get_submodule(unit.refs["depthwise"]), None, {"pre_act": unit.attrs["pre_act"]})
        pointwise = _fold(module.get_submodule(unit.refs["pointwise"]), _bn(module, unit), {"act": unit.attrs["act"]})
        return FoldedSepConv(depthwise, pointwise)
    if unit.kind == "linear":
        linear = module.get_submodule(unit.refs["linear"])
        return lambda inputs: linear(inputs[0])
    if unit.kind in ("add", "concat"):
        return lambda inputs: inputs[0]
    node = nodes[unit.refs["node"]]
    arg_names = tuple(unit.refs.get("args", [n.name for n in node.all_input_nodes]))
    return NodeCall(node, module, arg_names, constants)


def _bn(module: fx.GraphModule, unit: Unit) -> nn.BatchNorm2d | None:
    return module.get_submodule(unit.refs["bn"]) if "bn" in unit.refs else None


@torch.no_grad()
def _fold(conv: nn.Conv2d, bn: nn.BatchNorm2d | None, attrs: Mapping[str, Any]) -> FoldedConv:
    """A FoldedConv from a conv module and an optional (eval-mode) batch-norm after it."""
    weight = conv.weight.detach().clone()
    bias = conv.bias.detach().clone() if conv.bias is not None else None
    if bn is not None:
        gamma = bn.weight if bn.weight is not None else torch.ones_like(bn.running_var)
        beta = bn.bias if bn.bias is not None else torch.zeros_like(bn.running_var)
        scale = gamma / torch.sqrt(bn.running_var + bn.eps)
        weight = weight * scale.reshape(-1, 1, 1, 1)
        base = bias if bias is not None else torch.zeros_like(bn.running_mean)
        bias = (base - bn.running_mean) * scale + beta
    return FoldedConv(weight, bias, tuple(conv.stride), tuple(conv.padding), tuple(conv.dilation), conv.groups,
                      attrs.get("act"), attrs.get("pre_act"))
