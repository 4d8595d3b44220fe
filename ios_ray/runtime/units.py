"""The callable of each unit, by kind: what a unit computes, bound to a module's weights on one device.

* ``conv``: a :class:`FoldedConv`, its batch-norm and multiplies by numbers folded into weight and bias (eval mode),
  a prologue batch-norm as a per-channel scale and shift of its input, its residual sum (a second input), its
  activations by name, run by the program's kernels (a :data:`ConvBinder`, :mod:`~ios_ray.runtime.kernels`);
  ``sepconv``: two of them.
* ``linear``: a :class:`Dense` (the layer's weight and bias, and the activation its epilogue starts with, where it
  does), run by the program's kernels (a :data:`LinearBinder`).
* ``conv_transpose``, ``conv3d`` (the layer's own call), ``flatten``, ``shuffle`` (channels in groups,
  transposed), ``slice`` (a range of channels), ``scale`` (``x * gate``, the gate times its ``factor`` and the
  residual added in the same pass where it has them): the op itself; ``add``, ``concat`` and ``elementwise``: their
  input value as it is.
* ``pool``, ``upsample``, ``pad`` and ``opaque``: the original fx code (:class:`CodeCall`), with the unit's inputs
  in place of the tensors it reads; a size value that depends on the batch size and reads a tensor from elsewhere
  reads a meta tensor of that tensor's shape at the input's batch size.
* any unit with an epilogue: its steps (original fx code) after it (:class:`Epilogue`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, cast

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ios_ray.frontend.activations import activation_fn, is_activation
from ios_ray.frontend.weights import batch_norm_affine, folding_dtype
from ios_ray.ir import Shape, Unit

UnitFn = Callable[[list[torch.Tensor]], torch.Tensor]


@dataclass
class FoldedConv:
    """A conv with its batch-norm folded in, its activations and prologue; callable on its input, and where it has a
    ``residual`` on the tensor its output is summed with before the activation (its second input)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    act: str | None = None
    pre_act: str | None = None
    pre_scale: torch.Tensor | None = None
    pre_shift: torch.Tensor | None = None
    residual: bool = False

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        y = F.conv2d(self.prologue(inputs[0]), self.weight, self.bias, self.stride, self.padding, self.dilation,
                     self.groups)
        if self.residual:
            y = y.add_(inputs[1])  # the conv's own new tensor, read by nothing else yet
        return activation_fn(self.act)(y)

    def prologue(self, x: torch.Tensor) -> torch.Tensor:
        """The conv's input after its prologue: the batch-norm before it as a scale and shift, and its activation."""
        if self.pre_scale is not None:
            x = torch.addcmul(self.pre_shift, x, self.pre_scale)  # type: ignore[arg-type]
        return activation_fn(self.pre_act)(x)


@dataclass
class Dense:
    """A linear layer and the activation after it (None for none); callable on its input."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    act: str | None = None

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return activation_fn(self.act)(F.linear(inputs[0], self.weight, self.bias))


@dataclass
class FoldedSepConv:
    """Depthwise conv then pointwise conv with the batch-norm folded into the pointwise one (each as its kernels
    run it)."""

    depthwise: UnitFn
    pointwise: UnitFn

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return self.pointwise([self.depthwise(inputs)])


@dataclass
class CodeCall:
    """Runs the original code of fx ``nodes``, in order (the last one's result is the unit's), on the unit's inputs.

    ``arg_names`` name the nodes the inputs stand for. A size computation among the nodes that reads a tensor the
    unit neither takes nor computes reads a meta tensor of that tensor's shape at this batch size instead (the batch
    size of the first tensor input): ``sized`` gives, by node name, its size per sample and which dimensions grow
    with the batch. The nodes are turned into Python once (:func:`unit_code`), as ``fx.GraphModule`` turns a graph.
    """

    nodes: tuple[fx.Node, ...]
    module: fx.GraphModule
    arg_names: tuple[str, ...]
    constants: Mapping[str, Any]
    sized: Mapping[str, tuple[tuple[int, ...], tuple[bool, ...]]] = field(default_factory=dict)
    code: fx.GraphModule = field(init=False, repr=False)  # the nodes' code: inputs, constants, then metas
    held: tuple[Any, ...] = field(init=False, repr=False)  # the constants the code reads, in its argument order
    metas: tuple[tuple[tuple[int, ...], tuple[bool, ...]], ...] = field(init=False, repr=False)  # of sized nodes
    at_batch: dict[int, tuple[torch.Tensor, ...]] = field(init=False, repr=False)  # their meta tensors, by batch size

    def __post_init__(self) -> None:
        sized = tuple(name for name in self.sized if name not in self.arg_names)  # an input is read as it is
        self.code, held_names = unit_code(self.nodes, self.module, self.arg_names, sized)
        self.held = tuple(self.constants[name] for name in held_names)
        self.metas = tuple(self.sized[name] for name in sized)
        self.at_batch = {}

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        if not self.metas:
            return self.code.forward(*inputs, *self.held)
        batch = next(t.shape[0] for t in inputs if isinstance(t, torch.Tensor))
        metas = self.at_batch.get(batch)
        if metas is None:  # made once per batch size: only their sizes are read
            metas = self.at_batch[batch] = tuple(torch.empty([s * batch if g else s for s, g in zip(sizes, grows)],
                                                             device="meta") for sizes, grows in self.metas)
        return self.code.forward(*inputs, *self.held, *metas)


def unit_code(nodes: tuple[fx.Node, ...], module: fx.GraphModule, arg_names: tuple[str, ...],
              sized_names: tuple[str, ...] = ()) -> tuple[fx.GraphModule, tuple[str, ...]]:
    """The code of ``nodes`` as a graph module of its own (the layers it calls ``module``'s own) whose arguments are the
    nodes named ``arg_names``, then every other node the code reads (constants, returned by name), then the nodes
    named ``sized_names``; it returns the last node's value."""
    inside = {n.name for n in nodes}
    read = dict.fromkeys(n.name for node in nodes for n in node.all_input_nodes if n.name not in inside)
    held = tuple(name for name in read if name not in arg_names and name not in sized_names)
    graph, layers = fx.Graph(), dict[str, nn.Module]()
    copied = {name: graph.placeholder(f"in_{i}") for i, name in enumerate((*arg_names, *held, *sized_names))}
    for node in nodes:
        copied[node.name] = graph.node_copy(node, lambda n: copied[n.name])
        if node.op == "call_module":  # one attribute of the code's own, not a path through the model's modules
            layer = copied[node.name].target = f"layer_{len(layers)}"
            layers[layer] = module.get_submodule(str(node.target))
    graph.output(copied[nodes[-1].name])
    return fx.GraphModule(layers, graph), held


@dataclass
class Epilogue:
    """A unit's own callable followed by its elementwise steps, each on the result of the one before."""

    body: UnitFn
    steps: tuple[CodeCall, ...]

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        y = self.body(inputs)
        for step in self.steps:
            y = step([y])
        return y


#: Binds a folded conv, given its per-sample input shape, to the callable that runs it (the kernels' choice).
ConvBinder = Callable[[FoldedConv, Shape], UnitFn]


#: Binds a linear layer, given its per-sample input shape, to the callable that runs it (the kernels' choice).
LinearBinder = Callable[[Dense, Shape], UnitFn]


def eager_conv(conv: FoldedConv, input_shape: Shape) -> UnitFn:
    """A folded conv as it is: torch's own convolution, then its activation."""
    return conv


def eager_linear(layer: Dense, input_shape: Shape) -> UnitFn:
    """A linear layer as it is: torch's own ``linear``, then its activation."""
    return layer


def bind_unit(unit: Unit, module: fx.GraphModule, nodes: Mapping[str, fx.Node], constants: Mapping[str, Any],
              input_shape: Shape = (), conv: ConvBinder = eager_conv, linear: LinearBinder = eager_linear) -> UnitFn:
    """The callable of one unit, on ``module``'s weights (``nodes`` by name, ``constants`` by node name); a conv's
    through ``conv`` and a linear layer's through ``linear``, given ``input_shape``, the per-sample shape of the
    unit's first input."""
    steps = tuple(unit.refs.get("epilogue", ()))
    if unit.kind == "linear":
        layer = cast(nn.Linear, module.get_submodule(unit.refs["linear"]))  # torch's own forward: frontend.patterns
        texts = unit.attrs.get("epilogue", ())
        act = texts[0] if texts and is_activation(texts[0]) else None
        bias = layer.bias.detach() if layer.bias is not None else None
        body = linear(Dense(layer.weight.detach(), bias, act), input_shape)
        steps = steps[1:] if act is not None else steps
    else:
        body = _bind_body(unit, module, nodes, constants, input_shape, conv)
    if not steps:
        return body
    return Epilogue(body, tuple(_step(nodes[name], module, constants) for name in steps))


def _bind_body(unit: Unit, module: fx.GraphModule, nodes: Mapping[str, fx.Node], constants: Mapping[str, Any],
               input_shape: Shape, conv: ConvBinder) -> UnitFn:
    """The callable of a unit without its epilogue (a linear unit's: :func:`bind_unit`)."""
    attrs, refs = unit.attrs, unit.refs
    if unit.kind == "conv":
        folded = fold(_conv(module, refs["conv"]), _bn(module, refs, "bn"), attrs, _bn(module, refs, "pre_bn"))
        return conv(folded, input_shape)
    if unit.kind == "sepconv":
        depthwise = fold(_conv(module, refs["depthwise"]), None, {"pre_act": attrs["pre_act"]},
                         _bn(module, refs, "pre_bn"))
        pointwise = fold(_conv(module, refs["pointwise"]), _bn(module, refs, "bn"), {"act": attrs["act"]})
        between = (depthwise.weight.shape[0], *unit.shape[1:])
        return FoldedSepConv(conv(depthwise, input_shape), conv(pointwise, between))
    if unit.kind in ("conv_transpose", "conv3d"):
        layer = module.get_submodule(refs["module"])
        return lambda inputs: layer(inputs[0])
    if unit.kind == "flatten":
        return lambda inputs: torch.flatten(inputs[0], attrs["start_dim"], attrs["end_dim"])
    if unit.kind == "shuffle":
        return lambda inputs: inputs[0].unflatten(1, (attrs["groups"], -1)).transpose(1, 2).flatten(1, 2)
    if unit.kind == "slice":
        return lambda inputs: inputs[0][:, attrs["start"]:attrs["stop"]]
    if unit.kind == "scale":
        return _scaling(attrs.get("factor"), bool(attrs.get("residual")))
    if unit.kind in ("add", "concat", "elementwise"):
        return lambda inputs: inputs[0]
    node = nodes[refs["node"]]
    arg_names = tuple(refs.get("args", [n.name for n in node.all_input_nodes]))
    return CodeCall(tuple(nodes[n] for n in refs.get("nodes", (node.name,))), module, arg_names, constants,
                    refs.get("sized", {}))


def _scaling(factor: float | None, residual: bool) -> UnitFn:
    """A scaling ``x * gate`` (its inputs), times ``factor`` (applied to the small gate), plus its residual (a third
    input) in the same pass where it has one."""
    if residual:
        return lambda inputs: torch.addcmul(inputs[2], inputs[0], inputs[1], value=1.0 if factor is None else factor)
    if factor is not None:
        return lambda inputs: inputs[0] * (inputs[1] * factor)
    return lambda inputs: inputs[0] * inputs[1]


def _step(node: fx.Node, module: fx.GraphModule, constants: Mapping[str, Any]) -> CodeCall:
    """One epilogue step: the node's code on the one input that is not a constant."""
    source = next(n.name for n in node.all_input_nodes if n.name not in constants)
    return CodeCall((node,), module, (source,), constants)


def _conv(module: fx.GraphModule, target: str) -> nn.Conv2d:
    """The conv module a conv unit refers to (the frontend matched it as an ``nn.Conv2d``)."""
    return cast(nn.Conv2d, module.get_submodule(target))


def _bn(module: fx.GraphModule, refs: Mapping[str, Any], key: str) -> nn.BatchNorm2d | None:
    return cast(nn.BatchNorm2d, module.get_submodule(refs[key])) if key in refs else None


@torch.no_grad()
def fold(conv: nn.Conv2d, bn: nn.BatchNorm2d | None, attrs: Mapping[str, Any],
         pre_bn: nn.BatchNorm2d | None = None) -> FoldedConv:
    """A FoldedConv from a conv module, an optional (eval-mode) batch-norm after it and one before it, and the numbers
    its input and output are multiplied by (``attrs``' ``in_scale`` and ``out_scale``, where it has them).

    The folding is computed in :func:`~ios_ray.frontend.weights.folding_dtype` and rounded once to the conv's
    dtype."""
    dtype = conv.weight.dtype
    wide = folding_dtype(dtype)
    weight = conv.weight.detach().to(wide, copy=True)
    bias = conv.bias.detach().to(wide, copy=True) if conv.bias is not None else None
    if bn is not None:
        scale, shift = batch_norm_affine(bn, wide)
        weight = weight * scale.reshape(-1, 1, 1, 1)
        bias = shift if bias is None else bias * scale + shift
    if "in_scale" in attrs or "out_scale" in attrs:  # conv(a * x) * b: the weight times a * b, the bias times b
        weight = weight * (attrs.get("in_scale", 1.0) * attrs.get("out_scale", 1.0))
        bias = bias * attrs.get("out_scale", 1.0) if bias is not None else None
    pre_scale = pre_shift = None
    if pre_bn is not None:
        pre_scale, pre_shift = (t.reshape(1, -1, 1, 1).to(dtype) for t in batch_norm_affine(pre_bn, wide))
    return FoldedConv(weight.to(dtype), bias.to(dtype) if bias is not None else None, _pair(conv.stride),
                      _pair(conv.padding), _pair(conv.dilation), conv.groups, attrs.get("act"), attrs.get("pre_act"),
                      pre_scale, pre_shift, bool(attrs.get("residual", False)))


def _pair(value: tuple[int, ...] | str) -> tuple[int, int]:
    """A conv's stride, padding or dilation as its pair (the frontend refuses a padding given as a string)."""
    assert not isinstance(value, str), f"conv padding {value!r} reached the runtime"
    return value[0], value[1]
