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
  dtype the fused op lacks runs as in ``eager``, channels-last. An ``opaque`` unit, which runs the
  model's own code, takes its inputs in the graph's format (:func:`in_layout`): that code may assume it.

Neither changes what a unit computes, only how fast: which is faster depends on the device, the dtype and the
model, so a search measures it (``kernels="auto"``) and each schedule records the kernels its stages were measured
with, which deploy it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ios_ray.dtypes import in_memory_format
from ios_ray.errors import UserError
from ios_ray.frontend.activations import activation_parts
from ios_ray.ir import Shape
from ios_ray.runtime.units import ConvBinder, FoldedConv, UnitFn, eager_conv
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
    """The memory format a program's 4-D activations are held in, for a graph in ``memory_format``."""
    return memory_format if checked_kernels(kernels) == EAGER_KERNELS else "channels_last"


def conv_binder(kernels: str, device: torch.device) -> ConvBinder:
    """How the kernels run a folded conv on ``device``."""
    if checked_kernels(kernels) == EAGER_KERNELS:
        return eager_conv
    return _fused_cuda if device.type == "cuda" else _fused_cpu


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
    code was written for (a ``.view`` of a feature map, an extension's kernel that assumes NCHW)."""

    body: UnitFn
    memory_format: str

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """Run the unit on its inputs laid out in the graph's format."""
        return self.body([in_memory_format(t, self.memory_format) for t in inputs])


def in_layout(kind: str, fn: UnitFn, layout: str, memory_format: str) -> UnitFn:
    """A unit's callable for a program whose activations are in ``layout`` and whose graph is in ``memory_format``:
    an ``opaque`` unit (the model's own code) takes its inputs in the graph's format, every other unit (torch's own
    layout-aware ops) takes them as they come."""
    return InGraphFormat(fn, memory_format) if kind == "opaque" and layout != memory_format else fn


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
    name, values = activation_parts(conv.act) if conv.act is not None else ("none", ())
    fused = _ONEDNN_ACTIVATIONS.get(name) if name != "none" else ("none", lambda _: [])
    if fused is None or not onednn_fuses(conv.weight.dtype) or (conv.residual and name not in ("none", "relu")):
        return conv
    algorithm = str(values[0]) if name == "gelu" else ""
    return OneDnnConv(conv, fused[0], fused[1](values), algorithm)


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
