"""torch.fx frontend: import any fx-traceable ``nn.Module`` and an example input into the graph IR.

The import runs in three passes over the traced fx graph:

1. :func:`trace` runs torch.fx (naming the submodule that failed, if it fails) and propagates shapes.
2. :func:`_match_patterns` groups fx nodes into units: a conv with its following batch-norm and activation
   (and a leading ReLU that only it reads), a depthwise + pointwise pair as one separable conv, pools,
   linear, flatten. Sums and channel concatenations are folded into the input of the unit that reads them
   (nested concatenations are flattened); one that several units read becomes an ``add`` or ``concat`` unit.
3. Every other op becomes an ``opaque`` unit that calls the original code: an unknown op is never an error.

The result, :class:`Imported`, pairs the :class:`~ios_ray.ir.Graph` (plain data) with the traced module that
the runtime binds it to.
"""

from __future__ import annotations

import contextlib
import io
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from ios_ray.blocks import find_blocks
from ios_ray.errors import UserError, first_line
from ios_ray.ir import GRAPH_INPUT, Graph, Unit, Value

#: Activations folded into the unit before them, by fx target.
ACTIVATIONS: dict[Any, str] = {
    nn.ReLU: "relu", F.relu: "relu", torch.relu: "relu", "relu": "relu",
    nn.ReLU6: "relu6", F.relu6: "relu6",
    nn.SiLU: "silu", F.silu: "silu",
}
_ADDS = (operator.add, torch.add, "add")
_CATS = (torch.cat, torch.concat)
_POOL_MODULES = {nn.MaxPool2d: "max", nn.AvgPool2d: "avg", nn.AdaptiveAvgPool2d: "adaptive_avg"}
_POOL_FUNCTIONS = {F.max_pool2d: "max", F.avg_pool2d: "avg", F.adaptive_avg_pool2d: "adaptive_avg"}
_FLATTENS = (torch.flatten, "flatten")
_F32 = 4


@dataclass
class Imported:
    """A graph and the traced module it was imported from (what the runtime needs to execute it)."""

    graph: Graph
    module: fx.GraphModule
    constants: dict[str, torch.Tensor] = field(default_factory=dict)


def import_module(module: nn.Module, example_input: torch.Tensor, name: str | None = None) -> Imported:
    """Import an fx-traceable module (put in eval mode) and an example input (batch first) into the IR."""
    module = module.eval()
    name = name or type(module).__name__
    gm = trace(module)
    with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints a traceback on failure
        try:
            ShapeProp(gm).propagate(example_input)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's forward is reported in one line
            cause = exc.__cause__ or exc  # ShapeProp wraps the model's own error
            raise UserError(f"running {name} on an input of shape {tuple(example_input.shape)} failed: "
                            f"{type(cause).__name__}: {first_line(cause)}") from cause
    return _Importer(gm, name, tuple(example_input.shape[1:])).run()


def import_model(spec: str, batch: int = 1) -> Imported:
    """Build a zoo model or ``package.module:factory`` and import it with a random input of this batch size."""
    from ios_ray.models import resolve_model

    model = resolve_model(spec)
    torch.manual_seed(0)
    example = torch.randn(batch, *model.input_shape)
    return import_module(model.build(), example, model.name)


class _StackTracer(fx.Tracer):
    """An fx tracer that remembers which submodule it was inside when tracing failed."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.failed_in: str | None = None

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        path = self.path_of_module(m)
        self.stack.append(path)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            self.failed_in = self.failed_in or path
            raise
        finally:
            self.stack.pop()


def trace(module: nn.Module) -> fx.GraphModule:
    """Symbolically trace a module; failure raises UserError naming the submodule that could not be traced."""
    tracer = _StackTracer()
    try:
        graph = tracer.trace(module)
    except Exception as exc:  # noqa: BLE001 - fx raises many kinds; all become one sentence
        where = f"submodule {tracer.failed_in!r} ({type(module.get_submodule(tracer.failed_in)).__name__})" \
            if tracer.failed_in else f"module {type(module).__name__}"
        raise UserError(f"torch.fx cannot trace {where}: {first_line(exc)}") from exc
    return fx.GraphModule(tracer.root, graph)


@dataclass
class _Match:
    """A run of fx nodes that becomes one unit: ``head`` reads the unit's input, ``tail`` is its output."""

    kind: str
    head: fx.Node
    tail: fx.Node
    nodes: list[fx.Node]
    attrs: dict[str, Any]
    refs: dict[str, Any]


class _Importer:
    """One import: fx nodes in, units out (state lives only for the duration of :meth:`run`)."""

    def __init__(self, gm: fx.GraphModule, name: str, input_shape: tuple[int, ...]) -> None:
        self.gm = gm
        self.name = name
        self.input_shape = input_shape
        self.values: dict[fx.Node, Value] = {}
        self.units: list[Unit] = []
        self.constants: dict[str, torch.Tensor] = {}

    def run(self) -> Imported:
        """Turn the fx nodes, in order, into units; returns the graph with its blocks."""
        matches = _match_patterns(self.gm)
        absorbed = {n for m in matches.values() for n in m.nodes if n is not m.tail}
        output: Value | None = None
        for node in self.gm.graph.nodes:
            if node in absorbed:
                continue
            if node.op == "placeholder":
                if self.values:
                    raise UserError(f"{self.name} takes more than one input; ios-ray imports single-input models.")
                self.values[node] = Value.of(GRAPH_INPUT)
            elif node.op == "output":
                output = self.values.get(node.args[0]) if isinstance(node.args[0], fx.Node) else None
            elif self._is_constant(node):
                continue
            elif node in matches:
                self._add_match(matches[node])
            elif _target_in(node, _ADDS) and self._foldable_add(node):
                self._fold(node, (tuple(s for a in node.args for s in self.values[a].parts[0]),))
            elif _target_in(node, _CATS) and self._foldable_cat(node):
                self._fold(node, tuple(p for a in node.args[0] for p in self.values[a].parts))
            else:
                self._add_opaque(node)
        if output is None:
            raise UserError(f"{self.name} must return a single tensor.")
        graph = Graph(self.name, self.input_shape, tuple(self.units), output, find_blocks(self.units, output))
        return Imported(graph, self.gm, self.constants)

    def _is_constant(self, node: fx.Node) -> bool:
        """Nodes that do not depend on the input (parameters and what is computed from them only)."""
        if node.op == "get_attr" or (node.op != "placeholder" and not node.all_input_nodes and node.op != "output"):
            self.constants[node.name] = _fetch_constant(self.gm, node, self.constants)
            return True
        if all(n.name in self.constants for n in node.all_input_nodes) and node.all_input_nodes:
            self.constants[node.name] = _fetch_constant(self.gm, node, self.constants)
            return True
        return False

    def _foldable_add(self, node: fx.Node) -> bool:
        args = node.args
        return (
            len(args) == 2 and not node.kwargs and all(isinstance(a, fx.Node) and a in self.values for a in args)
            and _shape(args[0]) == _shape(args[1]) == _shape(node)
            and all(len(self._plain_parts(a)) == 1 for a in args)
        )

    def _foldable_cat(self, node: fx.Node) -> bool:
        tensors = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        rank = len(_shape(node))
        return (
            isinstance(tensors, (list, tuple)) and all(isinstance(t, fx.Node) and t in self.values for t in tensors)
            and rank >= 2 and dim in (1, 1 - rank)
        )

    def _plain_parts(self, node: fx.Node) -> tuple[tuple[str, ...], ...]:
        """The parts of a node's value; a concatenation that a sum reads is turned into a unit first."""
        if len(self.values[node].parts) > 1:
            self._materialise(node)
        return self.values[node].parts

    def _fold(self, node: fx.Node, parts: tuple[tuple[str, ...], ...]) -> None:
        """Keep a sum or concat as an expression; one that is read more than once becomes a unit."""
        self.values[node] = Value(parts)
        if len(node.users) != 1 or next(iter(node.users)).op == "output":
            self._materialise(node)

    def _materialise(self, node: fx.Node) -> None:
        value = self.values[node]
        kind = "concat" if len(value.parts) > 1 else "add"
        elements = _numel(_shape(node))
        self._append(Unit(node.name, kind, (value,), _shape(node), flops=elements * (len(value.sources) - 1),
                          bytes=_F32 * elements * (len(value.sources) + 1)), node)

    def _inputs(self, nodes: list[fx.Node]) -> tuple[Value, ...]:
        return tuple(self.values[n] for n in nodes if n.name not in self.constants)

    def _append(self, unit: Unit, tail: fx.Node) -> None:
        self.units.append(unit)
        self.values[tail] = Value.of(unit.id)

    def _add_match(self, match: _Match) -> None:
        inputs = self._inputs(match.head.all_input_nodes)
        shape = _shape(match.tail)
        in_elements = sum(_numel(_shape(n)) for n in match.head.all_input_nodes)
        weights = sum(p.numel() for key in ("conv", "depthwise", "pointwise", "linear") if key in match.refs
                      for p in self.gm.get_submodule(match.refs[key]).parameters())
        unit = Unit(match.refs.get("id", match.tail.name), match.kind, inputs, shape, match.attrs, match.refs,
                    flops=_flops(match, shape, self.gm), bytes=_F32 * (in_elements + _numel(shape)),
                    weight_bytes=_F32 * weights)
        self._append(unit, match.tail)

    def _add_opaque(self, node: fx.Node) -> None:
        tensor_inputs = [n for n in node.all_input_nodes if n.name not in self.constants]
        shape = _shape(node)
        target = node.target if isinstance(node.target, str) else _qualname(node.target)
        if node.op == "call_module":
            target = type(self.gm.get_submodule(node.target)).__name__
        attrs = {"op": f"{node.op}:{target}", "args": _describe_args(node, self.constants)}
        refs = {"node": node.name, "args": tuple(n.name for n in tensor_inputs)}
        elements = _numel(shape)
        self._append(Unit(node.name, "opaque", self._inputs(tensor_inputs), shape, attrs, refs, flops=elements,
                          bytes=_F32 * (elements + sum(_numel(_shape(n)) for n in tensor_inputs))), node)


def _match_patterns(gm: fx.GraphModule) -> dict[fx.Node, _Match]:
    """Recognised units keyed by their tail node."""
    matches: dict[fx.Node, _Match] = {}
    taken: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node in taken:
            continue
        match = _match_conv(gm, node, taken) or _match_pool(gm, node) or _match_simple(gm, node)
        if match is not None:
            matches[match.tail] = match
            taken.update(match.nodes)
    return matches


def _module(gm: fx.GraphModule, node: Any, kind: type) -> nn.Module | None:
    if isinstance(node, fx.Node) and node.op == "call_module":
        module = gm.get_submodule(node.target)
        if isinstance(module, kind):
            return module
    return None


def _activation(gm: fx.GraphModule, node: Any) -> str | None:
    if not isinstance(node, fx.Node) or len(node.args) != 1 or node.kwargs.get("inplace"):
        return None
    if node.op == "call_module":
        return ACTIVATIONS.get(type(gm.get_submodule(node.target)))
    if node.op in ("call_function", "call_method"):
        return ACTIVATIONS.get(node.target)
    return None


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _match_conv(gm: fx.GraphModule, node: fx.Node, taken: set[fx.Node]) -> _Match | None:
    """conv [+ pointwise] [+ batch-norm] [+ activation], with a leading activation only this conv reads."""
    conv = _module(gm, node, nn.Conv2d)
    if conv is None or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        return None
    nodes, refs = [node], {"id": node.target, "conv": node.target}
    kind = "conv"
    pointwise_node = _only_user(node)
    pointwise = _module(gm, pointwise_node, nn.Conv2d)
    depthwise = conv.groups == conv.in_channels == conv.out_channels and conv.groups > 1
    if depthwise and pointwise is not None and pointwise.kernel_size == (1, 1) and pointwise.groups == 1 \
            and pointwise.stride == (1, 1) and pointwise.padding == (0, 0):
        kind = "sepconv"
        nodes.append(pointwise_node)
        refs = {"id": node.target, "depthwise": node.target, "pointwise": pointwise_node.target}
    bn_node = _only_user(nodes[-1])
    if _module(gm, bn_node, nn.BatchNorm2d) is not None:
        nodes.append(bn_node)
        refs["bn"] = bn_node.target
    act_node = _only_user(nodes[-1])
    act = _activation(gm, act_node)
    if act is not None:
        nodes.append(act_node)
    pre = node.args[0]
    pre_act = _activation(gm, pre) if isinstance(pre, fx.Node) and len(pre.users) == 1 and pre not in taken else None
    if pre_act is not None and isinstance(pre.args[0], fx.Node) and pre.args[0].op != "get_attr":
        nodes.insert(0, pre)
    else:
        pre_act = None
    out_conv = pointwise if kind == "sepconv" else conv
    attrs = {
        "in_channels": conv.in_channels, "out_channels": out_conv.out_channels,
        "kernel": tuple(conv.kernel_size), "stride": tuple(conv.stride), "padding": tuple(conv.padding),
        "dilation": tuple(conv.dilation), "groups": conv.groups, "bias": conv.bias is not None or "bn" in refs,
        "act": act, "pre_act": pre_act,
    }
    return _Match(kind, nodes[0], nodes[-1], nodes, attrs, refs)


def _match_pool(gm: fx.GraphModule, node: fx.Node) -> _Match | None:
    """Max, average and adaptive-average 2-d pools, as modules or functions."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        mode = _POOL_MODULES.get(type(module))
        params = {k: getattr(module, k) for k in ("kernel_size", "stride", "padding", "ceil_mode",
                                                  "count_include_pad", "dilation", "output_size") if hasattr(module, k)}
    elif node.op == "call_function" and node.target in _POOL_FUNCTIONS:
        mode = _POOL_FUNCTIONS[node.target]
        normalized = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True)
        if normalized is None:
            return None
        params = {k: v for k, v in normalized.kwargs.items() if k != "input"}
    else:
        return None
    if mode is None or any(isinstance(v, fx.Node) for v in params.values()) or params.get("return_indices"):
        return None
    attrs = {"mode": mode, **{k: _pair(v) if k in ("kernel_size", "stride", "padding", "dilation", "output_size")
                              else v for k, v in params.items() if k != "return_indices"}}
    if attrs.get("stride") in (None, ()):
        attrs["stride"] = attrs.get("kernel_size")
    return _Match("pool", node, node, [node], attrs, {"node": node.name})


def _match_simple(gm: fx.GraphModule, node: fx.Node) -> _Match | None:
    """Linear layers and flattens."""
    linear = _module(gm, node, nn.Linear)
    if linear is not None:
        attrs = {"in_features": linear.in_features, "out_features": linear.out_features,
                 "bias": linear.bias is not None}
        return _Match("linear", node, node, [node], attrs, {"id": node.target, "linear": node.target})
    if _target_in(node, _FLATTENS) and len(node.all_input_nodes) == 1:
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
        if isinstance(start, int) and isinstance(end, int):
            return _Match("flatten", node, node, [node], {"start_dim": start, "end_dim": end}, {"node": node.name})
    return None


def _flops(match: _Match, shape: tuple[int, ...], gm: fx.GraphModule) -> int:
    """Multiply-adds times two, per sample."""
    attrs, out = match.attrs, _numel(shape)
    if match.kind == "conv":
        kh, kw = attrs["kernel"]
        return 2 * out * (attrs["in_channels"] // attrs["groups"]) * kh * kw
    if match.kind == "sepconv":
        kh, kw = attrs["kernel"]
        spatial = out // attrs["out_channels"]
        return 2 * spatial * attrs["in_channels"] * (kh * kw + attrs["out_channels"])
    if match.kind == "linear":
        return 2 * attrs["in_features"] * attrs["out_features"]
    if match.kind == "pool" and "kernel_size" in attrs:
        return out * attrs["kernel_size"][0] * attrs["kernel_size"][1]
    return _numel(_shape(match.head.all_input_nodes[0])) if match.head.all_input_nodes else out


def _fetch_constant(gm: fx.GraphModule, node: fx.Node, constants: dict[str, torch.Tensor]) -> Any:
    """Evaluate a node that does not depend on the model input."""
    if node.op == "get_attr":
        target: Any = gm
        for part in str(node.target).split("."):
            target = getattr(target, part)
        return target
    args = fx.node.map_arg(node.args, lambda n: constants[n.name])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: constants[n.name])
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    return gm.get_submodule(node.target)(*args, **kwargs)


def _describe_args(node: fx.Node, constants: dict[str, torch.Tensor]) -> str:
    """The non-tensor arguments of an opaque op as text (they decide what it computes, so they enter keys)."""
    def show(n: fx.Node) -> str:
        value = constants.get(n.name)
        return f"const{tuple(value.shape)}" if isinstance(value, torch.Tensor) else ("const" if n.name in constants else "x")
    return repr((fx.node.map_arg(node.args, show), fx.node.map_arg(node.kwargs, show)))


def _target_in(node: fx.Node, targets: tuple) -> bool:
    return node.op in ("call_function", "call_method") and node.target in targets


def _shape(node: fx.Node) -> tuple[int, ...]:
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape[1:]) if meta is not None and hasattr(meta, "shape") else ()


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _pair(value: Any) -> Any:
    if value is None:
        return None
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)


def _qualname(target: Any) -> str:
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__qualname__', getattr(target, '__name__', repr(target)))}".lstrip(".")
