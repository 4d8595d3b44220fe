"""The kernels a program's units run with, by name (:data:`~ios_ray.vocabulary.KERNEL_NAMES`).

* ``eager``: each unit calls torch's own ops as the model's code does, on activations in the graph's memory format.
  A conv is ``F.conv2d`` with its folded bias, then its activation: on a GPU a convolution, a bias kernel and an
  activation kernel, and in float32 NCHW cuDNN's own layout transposes around the convolution; on a CPU oneDNN
  reorders the weight on every call.
* ``fused``: the program's 4-D activations are channels-last whatever the graph's format (the input is converted
  on entry and the output back on exit, :class:`~ios_ray.runtime.program.Program`), and each conv (a merged one too)
  is one call that adds its bias and applies its activation inside the convolution: on a CPU oneDNN's
  ``mkldnn._convolution_pointwise``, its weight reordered once per input shape, at the first call with it, into the
  blocked layout oneDNN computes in for that shape (what Inductor's weight prepacking does for ``torch.compile`` on
  a CPU); on a GPU cuDNN's fused convolution, bias and ReLU (``torch.cudnn_convolution_relu``) where the activation
  is a ReLU. A conv with a residual sum adds it inside the same call where the activation after it is a ReLU or
  none (oneDNN's binary post-op; cuDNN's ``cudnn_convolution_add_relu``, ReLU only). A conv whose activation or
  dtype the fused op lacks runs as in ``eager``, channels-last. On a CPU a linear layer is one oneDNN call too
  (``mkldnn._linear_pointwise``: bias and activation inside, the weight packed once per row count). An ``opaque``
  unit, which runs the model's own code, takes its inputs as they come where that code is torch's own ops, none of
  which reads how a tensor is laid out (a permute and a LayerNorm: ConvNeXt's blocks), and its output has at most
  four dimensions (a 4-D input that is a permuted view, another such unit's output, copied into the graph's format
  once: MobileViT's patches); else in the graph's format (:func:`in_layout`): an extension's kernel, or the model's own
  function, may read memory as NCHW, and torch's reductions run slowly over a five-dimensional tensor made from a
  channels-last one (ResNeSt's and SKNet's split attention).
* ``inductor``: the units bound as in ``fused``, on activations channels-last; a pass compiles each run of stages
  that are not of several groups, and each group of the others, into one region with Inductor
  (:mod:`~ios_ray.runtime.regions`), which traces the units as torch's own ops on the same weights
  (:func:`unfused`: a fused call would hide the convolution from Inductor's own fusions) and fuses what runs inside
  it as ``torch.compile`` would. What runs outside a region (a group or run of one unit) and a stage as the profiler
  times it run the fused calls: a lone conv between regions, or one a stage's groups run side by side, is one call
  with its bias and activation, not three. Inductor
  computes convolutions channels-last wherever it can (on a CPU with oneDNN always; on a GPU where its estimate of
  the convolutions' work says so), and returns each region's outputs in the strides its inputs came in: regions
  handed NCHW activations would convert their inputs on entry and their outputs on exit, and a lone unit between
  regions would run an NCHW convolution (cuDNN's layout transposes around it in float32 on a GPU). On this 2-core
  CPU, Inception V3 at batch 1 in float32: the greedy schedule (many regions) 0.88 (0.83-0.92) of its time with the
  activations in the graph's format, the sequential schedule (one region) 1.00 (bench/RESULTS.md, "Inductor regions
  held channels-last").

Neither changes what a unit computes, only how fast: which is faster depends on the device, the dtype and the
model, so a search measures it (``kernels="auto"``) and each schedule records the kernels its stages were measured
with, which deploy it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from ios_ray.dtypes import in_memory_format, is_in_memory_format
from ios_ray.errors import UserError
from ios_ray.frontend.activations import activation_parts
from ios_ray.ir import Shape, Unit
from ios_ray.runtime.units import (CodeCall, ConvBinder, Dense, Epilogue, FoldedConv, FoldedSepConv, LinearBinder,
                                  UnitFn, eager_conv, eager_linear)
from ios_ray.vocabulary import EAGER_KERNELS, KERNEL_NAMES

#: Activations oneDNN applies inside a convolution: canonical name -> (oneDNN's name, its parameters from ours).
_ONEDNN_ACTIVATIONS: dict[str, tuple[str, Callable[[tuple[Any, ...]], list[Any]]]] = {
    "relu": ("relu", lambda _: []),
    "relu6": ("hardtanh", lambda _: [0.0, 6.0]),
    "hardtanh": ("hardtanh", list),
    "leaky_relu": ("leaky_relu", list),
    "sigmoid": ("sigmoid", lambda _: []),
    "tanh": ("tanh", lambda _: []),
    "hardswish": ("hardswish", lambda _: []),
    "hardsigmoid": ("hardsigmoid", lambda _: []),
    "silu": ("swish", lambda _: []),
    "gelu": ("gelu", lambda _: []),
}


def checked_kernels(name: str) -> str:
    """The kernels' name; UserError for a name that is not one."""
    if name not in KERNEL_NAMES:
        raise UserError(f"kernels must be one of {', '.join(KERNEL_NAMES)}, not {name!r}.")
    return name


def activation_layout(kernels: str, memory_format: str) -> str:
    """The memory format a program's 4-D activations are held in, for a graph in ``memory_format``: channels-last
    for every kernels but ``eager``, which runs the model's ops as its code does."""
    return memory_format if checked_kernels(kernels) == EAGER_KERNELS else "channels_last"


def conv_binder(kernels: str, device: torch.device) -> ConvBinder:
    """How the kernels run a folded conv on ``device`` (outside a region, for ``inductor``)."""
    if checked_kernels(kernels) == EAGER_KERNELS:
        return eager_conv
    return _fused_cuda if device.type == "cuda" else _fused_cpu


def linear_binder(kernels: str, device: torch.device) -> LinearBinder:
    """How the kernels run a linear layer on ``device`` (outside a region, for ``inductor``)."""
    if checked_kernels(kernels) == EAGER_KERNELS or device.type == "cuda":
        return eager_linear
    return _fused_cpu_linear


def unfused(fn: UnitFn) -> UnitFn:
    """A unit's callable as torch's own ops on the same weights: a fused conv or linear layer (a separable conv's
    two, one with an epilogue) as its convolution or product, then its bias and activation; anything else as it is.
    What a region traces (:mod:`~ios_ray.runtime.regions`), so that Inductor sees the convolution and fuses around it
    itself; the same values."""
    if isinstance(fn, (OneDnnConv, CudnnConvRelu)):
        return fn.conv
    if isinstance(fn, OneDnnLinear):
        return fn.layer
    if isinstance(fn, FoldedSepConv):
        return FoldedSepConv(unfused(fn.depthwise), unfused(fn.pointwise))
    if isinstance(fn, Epilogue):
        return Epilogue(unfused(fn.body), fn.steps)
    return fn


@dataclass(frozen=True)
class OneDnnConv:
    """A folded conv as one oneDNN call: convolution, bias and activation; the weight reordered into the layout
    oneDNN computes in, once per input shape, at the first call with that shape (``packed``, by shape).

    The layout oneDNN picks depends on the whole input shape, batch size included: a weight packed for another
    shape computes the same but can run several times slower (ResNet-50's 1x1 convs of 256 to 1024 and of 1024 to
    512 channels at 14x14, batch 8, ran 4.6x slower with weights packed for batch 1: bench/RESULTS.md, kernels). So
    each shape a program runs with gets its own copy of the weight, as Inductor's frozen weights are packed for the
    one shape they were compiled for."""

    conv: FoldedConv
    attr: str
    scalars: list[Any]
    algorithm: str
    packed: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """Run the conv on its input (and add its residual, its second input, before the activation)."""
        conv = self.conv
        x = conv.prologue(inputs[0])
        weight, geometry = self.weight_for(tuple(x.shape)), (list(conv.padding), list(conv.stride),
                                                              list(conv.dilation), conv.groups)
        if conv.residual:  # oneDNN's binary post-op: the sum, then a ReLU or nothing (_fused_cpu checks which)
            return torch.ops.mkldnn._convolution_pointwise.binary(
                x, inputs[1], weight, conv.bias, *geometry, "add", None, None if self.attr == "none" else self.attr,
                self.scalars, self.algorithm)
        return torch.ops.mkldnn._convolution_pointwise(x, weight, conv.bias, *geometry, self.attr, self.scalars,
                                                       self.algorithm)

    def weight_for(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The weight in oneDNN's layout for an input of ``shape`` (reordered at the first call with it)."""
        packed = self.packed.get(shape)
        if packed is None:
            conv = self.conv
            packed = self.packed[shape] = torch.ops.mkldnn._reorder_convolution_weight(
                conv.weight, list(conv.padding), list(conv.stride), list(conv.dilation), conv.groups, list(shape))
        return packed


@dataclass(frozen=True)
class OneDnnLinear:
    """A linear layer as one oneDNN call: matrix product, bias and activation; the weight reordered into the layout
    oneDNN computes in, once per number of rows (the input's elements over its last dimension), at the first call
    with it (``packed``)."""

    layer: Dense
    attr: str
    scalars: list[Any]
    algorithm: str
    packed: dict[int, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """Run the layer on its input."""
        x = inputs[0]
        weight = self.weight_for(x.numel() // max(x.shape[-1], 1))
        return torch.ops.mkldnn._linear_pointwise(x, weight, self.layer.bias, self.attr, self.scalars, self.algorithm)

    def weight_for(self, rows: int) -> torch.Tensor:
        """The weight in oneDNN's layout for an input of ``rows`` rows (reordered at the first call with it)."""
        packed = self.packed.get(rows)
        if packed is None:
            packed = self.packed[rows] = torch.ops.mkldnn._reorder_linear_weight(self.layer.weight, rows)
        return packed


@dataclass(frozen=True)
class CudnnConvRelu:
    """A folded conv whose activation is a ReLU as one cuDNN call: convolution, bias, its residual where it has one
    (its second input), and ReLU."""

    conv: FoldedConv

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """Run the conv on its input (and add its residual before the ReLU)."""
        conv = self.conv
        x = conv.prologue(inputs[0])
        if conv.residual:
            return torch.cudnn_convolution_add_relu(x, conv.weight, inputs[1], 1.0, conv.bias, conv.stride,
                                                    conv.padding, conv.dilation, conv.groups)
        return torch.cudnn_convolution_relu(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation,
                                            conv.groups)


@dataclass(frozen=True)
class InGraphFormat:
    """A unit that runs the model's own code, given its 4-D inputs in the graph's memory format: the format that
    code was written for (an extension's kernel, or the model's own function, may read memory as NCHW)."""

    body: UnitFn
    memory_format: str

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """Run the unit on its inputs laid out in the graph's format."""
        return self.body([in_memory_format(t, self.memory_format) for t in inputs])


@dataclass(frozen=True)
class AsTheyCome:
    """A unit that runs torch's own ops (:func:`layout_free`), given its 4-D inputs as they come where they are laid
    out as the program holds activations or in the graph's format, and any other 4-D input in the graph's format: a
    view with its dimensions permuted, as another such unit may return one (MobileViT's patches), whose strides each
    of its readers would walk slowly (copied once here instead)."""

    body: UnitFn
    layout: str
    memory_format: str

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """Run the unit on its inputs, a permuted view copied into the graph's format."""
        return self.body([t if t.dim() != 4 or is_in_memory_format(t, self.layout)
                          or is_in_memory_format(t, self.memory_format) else in_memory_format(t, self.memory_format)
                          for t in inputs])


#: The most dimensions (batch included) of an opaque unit's output where the unit takes channels-last inputs as they
#: come. A tensor of five made from a channels-last one (a reshape that splits its channels, a stack of several)
#: keeps strides that torch's reductions walk slowly: ResNeSt's and SKNet's split attention, a sum over the split,
#: ran 6-15x slower on this CPU than on the same tensor made from NCHW (bench/RESULTS.md, kernels).
MOST_DIMS_AS_THEY_COME = 4


def in_layout(unit: Unit, fn: UnitFn, layout: str, memory_format: str) -> UnitFn:
    """A unit's callable for a program whose activations are in ``layout`` and whose graph is in ``memory_format``:
    an ``opaque`` unit (the model's own code) takes its inputs in the graph's format unless its code is
    :func:`layout_free` and its output has at most :data:`MOST_DIMS_AS_THEY_COME` dimensions (then
    :class:`AsTheyCome`: a permuted view still in the graph's format); every other unit (torch's own layout-aware
    ops) takes them as they come."""
    if unit.kind != "opaque" or layout == memory_format:
        return fn
    if layout_free(fn) and 1 + len(unit.shape) <= MOST_DIMS_AS_THEY_COME:
        return AsTheyCome(fn, layout, memory_format)
    return InGraphFormat(fn, memory_format)


#: What reads how a tensor is laid out, not only its values: a view's shape is only valid for some strides, a
#: tensor's strides and storage are the layout itself.
_LAYOUT_READERS = frozenset({
    "view", "view_as", "_unsafe_view", "_reshape_alias", "as_strided", "as_strided_", "stride", "is_contiguous",
    "data_ptr", "storage", "untyped_storage", "storage_offset", "set_", "numpy", "__array__"})
#: Modules whose functions compute on a tensor's values whatever its layout (the Python operators, torch's own).
_VALUE_MODULES = ("torch", "_operator", "operator", "builtins", "math")


def layout_free(fn: UnitFn) -> bool:
    """Whether a unit's code computes the same from its inputs in any memory format: every step of it (an
    epilogue's too) is a torch module of ``torch.nn``, a tensor method, a Python operator or an ATen or torch
    function, and none of them is a view or reads strides or storage (:data:`_LAYOUT_READERS`). An extension's op
    or the model's own function is never layout-free: its kernel may read memory as NCHW."""
    steps = [fn.body, *fn.steps] if isinstance(fn, Epilogue) else [fn]
    return all(isinstance(step, CodeCall) and all(_reads_values_only(node, step.module) for node in step.nodes)
               for step in steps)


def _reads_values_only(node: fx.Node, module: torch.nn.Module) -> bool:
    """Whether one fx node computes from its tensors' values alone, whatever their layout."""
    if node.op == "call_module":
        return all(type(part).__module__.startswith("torch.nn.")
                   for part in module.get_submodule(str(node.target)).modules())
    if node.op == "call_method":
        return str(node.target) not in _LAYOUT_READERS
    if node.op != "call_function":
        return False
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        namespace, _, name = _qualified_name(target).partition("::")
        return namespace == "aten" and name not in _LAYOUT_READERS
    if getattr(target, "__name__", None) == "getattr":
        return node.args[1] not in _LAYOUT_READERS
    module_name = getattr(target, "__module__", None) or ""
    return module_name.split(".")[0] in _VALUE_MODULES and getattr(target, "__name__", "") not in _LAYOUT_READERS


def _qualified_name(op: torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> str:
    """An op's namespace and name without its overload (``aten::view`` for ``aten.view.default``)."""
    return (op.overloadpacket if isinstance(op, torch._ops.OpOverload) else op)._qualified_op_name


def folded(fn: UnitFn) -> FoldedConv | None:
    """The folded conv a unit's callable runs, where it runs one (whichever kernels bound it)."""
    if isinstance(fn, FoldedConv):
        return fn
    return fn.conv if isinstance(fn, (OneDnnConv, CudnnConvRelu)) else None


def _channels_last(conv: FoldedConv) -> FoldedConv:
    """The conv with its weight (and prologue) laid out channels-last."""
    return dataclasses.replace(conv, weight=in_memory_format(conv.weight, "channels_last"))


def _fused_cpu(conv: FoldedConv, input_shape: Shape) -> UnitFn:
    """oneDNN's fused conv where this torch has it for the conv's dtype and activation (after a residual sum: a ReLU
    or none), else the conv channels-last."""
    conv = _channels_last(conv)
    post_op = _onednn_post_op(conv.act)
    if post_op is None or not onednn_fuses(conv.weight.dtype) or (conv.residual and post_op[0] not in ("none", "relu")):
        return conv
    return OneDnnConv(conv, *post_op)


def _fused_cpu_linear(layer: Dense, input_shape: Shape) -> UnitFn:
    """oneDNN's fused linear layer where this torch has it for the layer's dtype and activation, else the layer."""
    post_op = _onednn_post_op(layer.act)
    if post_op is None or not onednn_fuses(layer.weight.dtype):
        return layer
    return OneDnnLinear(layer, *post_op)


def _onednn_post_op(act: str | None) -> tuple[str, list[Any], str] | None:
    """The activation as oneDNN applies it after its op (its name, parameters and algorithm), or None where oneDNN
    lacks it."""
    if act is None:
        return "none", [], ""
    name, values = activation_parts(act)
    fused = _ONEDNN_ACTIVATIONS.get(name)
    if fused is None:
        return None
    return fused[0], fused[1](values), str(values[0]) if name == "gelu" else ""


def _fused_cuda(conv: FoldedConv, _input_shape: Shape) -> UnitFn:
    """cuDNN's fused conv, bias (residual) and ReLU where the activation is a ReLU, else the conv channels-last."""
    conv = _channels_last(conv)
    return CudnnConvRelu(conv) if conv.act == "relu" else conv


def onednn_fuses(dtype: torch.dtype) -> bool:
    """Whether this torch's oneDNN runs fused convolutions in ``dtype`` on this CPU."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")):
        return False
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False
