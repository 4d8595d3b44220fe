"""Weights computed at import and at binding: an eval-mode batch-norm as a per-channel affine map, and a sum of
parallel conv branches on one input as one conv (structural re-parameterisation).

A conv is linear in its weights: for convs on one input with the same stride, dilation and groups whose taps line up
(each kernel centred where the others are, as RepVGG's and MobileOne's 3x3 and 1x1 branches are),
``conv_1(x) + ... + conv_k(x)`` is one conv whose kernel is their kernels, each zero-padded to the largest and
added, and whose bias is their biases added. A batch-norm after a branch's conv folds into its weights first; the
input itself (or a batch-norm of it) is a conv whose kernel holds one 1 (or the batch-norm's scale) per channel at
the centre tap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union, cast

import torch
from torch import nn

from ios_ray.dtypes import in_memory_format, module_memory_format

Pair = tuple[int, int]


def folding_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype weights are folded in before being rounded once to ``dtype``: at least float32 (float16 or bfloat16
    weights would otherwise round at every step of the folding)."""
    return torch.promote_types(dtype, torch.float32)


def batch_norm_affine(bn: nn.BatchNorm2d, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """An eval-mode batch-norm with running statistics as ``x * scale + shift`` per channel, computed in ``dtype``."""
    assert bn.running_mean is not None and bn.running_var is not None, "only tracked batch-norms are affine maps"
    mean, var = bn.running_mean.detach().to(dtype), bn.running_var.detach().to(dtype)
    gamma = bn.weight.detach().to(dtype) if bn.weight is not None else torch.ones_like(var)
    beta = bn.bias.detach().to(dtype) if bn.bias is not None else torch.zeros_like(var)
    scale = gamma / torch.sqrt(var + bn.eps)
    return scale, beta - mean * scale


#: What a branch is weighed by in a sum: a number, or one number per output channel (a float64 vector).
Factor = Union[float, torch.Tensor]


@dataclass(frozen=True)
class Branch:
    """One term of a sum of branches on one input: a conv (None: the input itself), the eval-mode batch-norm after
    it (or on the input; None where there is none), and the factor it is summed with."""

    conv: nn.Conv2d | None
    bn: nn.BatchNorm2d | None = None
    factor: Factor = 1.0


@dataclass(frozen=True)
class _Frame:
    """Where the taps of a sum's branches lie, per spatial dimension: the summed conv's kernel and padding, and
    each branch's first tap in it."""

    kernel: tuple[int, int]
    padding: tuple[int, int]
    offsets: tuple[tuple[int, int], ...]


@torch.no_grad()
def summed_conv(branches: Sequence[Branch], input_size: tuple[int, int], output_size: tuple[int, int]
                ) -> nn.Conv2d | None:
    """One eval-mode conv computing the sum of ``branches`` on an input of spatial size ``input_size`` (giving
    ``output_size``), its weights computed in at least float32 and rounded once to the convs' dtype; None where the
    branches are not one conv: convs that differ in channels, stride, dilation, groups, dtype or device, or whose
    taps do not line up; the input itself among them with a stride or with other than as many channels out as in;
    a factor of other than one number or one per output channel."""
    convs = [b.conv for b in branches if b.conv is not None]
    if not convs or not _alike(convs) or any(torch.as_tensor(b.factor).numel() not in (1, convs[0].out_channels)
                                             for b in branches):
        return None
    first = convs[0]
    identity = any(b.conv is None for b in branches)
    if identity and (first.stride != (1, 1) or first.in_channels != first.out_channels):
        return None
    frame = _frame(branches)
    if frame is None or _output_size(input_size, frame, first) != output_size:
        return None
    dtype = first.weight.dtype
    wide = folding_dtype(dtype)
    weight = torch.zeros(first.out_channels, first.in_channels // first.groups, *frame.kernel, dtype=wide,
                         device=first.weight.device)
    bias = torch.zeros(first.out_channels, dtype=wide, device=first.weight.device)
    for branch, (top, left) in zip(branches, frame.offsets):
        kernel, shift = _branch_kernel(branch, first, wide)
        factor = torch.as_tensor(branch.factor, dtype=wide, device=weight.device).reshape(-1)
        weight[:, :, top:top + kernel.shape[2], left:left + kernel.shape[3]] += factor.reshape(-1, 1, 1, 1) * kernel
        bias += factor * shift
    has_bias = any(b.bn is not None or (b.conv is not None and b.conv.bias is not None) for b in branches)
    summed = nn.Conv2d(first.in_channels, first.out_channels, frame.kernel, first.stride,  # type: ignore[arg-type]
                       frame.padding, first.dilation, first.groups, has_bias,  # type: ignore[arg-type]
                       device=first.weight.device, dtype=dtype).eval()
    held = in_memory_format(weight.to(dtype), module_memory_format(first))  # as the model holds its weights
    summed.weight = nn.Parameter(held, requires_grad=False)
    if has_bias:
        summed.bias = nn.Parameter(bias.to(dtype), requires_grad=False)
    return summed


def _alike(convs: list[nn.Conv2d]) -> bool:
    """Whether convs read and write the same channels in the same way (zero padding given as numbers)."""
    first = convs[0]
    same = ("in_channels", "out_channels", "stride", "dilation", "groups", "padding_mode")
    return all(getattr(c, name) == getattr(first, name) for c in convs for name in same) and \
        all(not isinstance(c.padding, str) and c.padding_mode == "zeros" and c.weight.dtype == first.weight.dtype
            and c.weight.device == first.weight.device for c in convs)


def _frame(branches: Sequence[Branch]) -> _Frame | None:
    """The kernel and padding of one conv holding every branch's taps, or None where a branch's taps fall between
    the frame's (dilated taps offset by other than a multiple of the dilation)."""
    dilation = next(b.conv for b in branches if b.conv is not None).dilation
    reaches = [_reach(b.conv) for b in branches]
    kernel, padding, starts = [], [], []
    for i in range(2):
        start = min(r[i][0] for r in reaches)
        end = max(r[i][1] for r in reaches)
        if any((r[i][0] - start) % dilation[i] for r in reaches) or (end - start) % dilation[i]:
            return None
        kernel.append((end - start) // dilation[i] + 1)
        padding.append(-start)
        starts.append([(r[i][0] - start) // dilation[i] for r in reaches])
    return _Frame((kernel[0], kernel[1]), (padding[0], padding[1]), tuple(zip(starts[0], starts[1])))


def _reach(conv: nn.Conv2d | None) -> tuple[tuple[int, int], tuple[int, int]]:
    """Per spatial dimension, a branch's first and last tap relative to where its output samples the input (the
    input itself: one tap, there)."""
    if conv is None:
        return (0, 0), (0, 0)
    padding, kernel, dilation = cast(Pair, conv.padding), conv.kernel_size, conv.dilation
    first = (-padding[0], -padding[1])
    return (first[0], first[0] + (kernel[0] - 1) * dilation[0]), (first[1], first[1] + (kernel[1] - 1) * dilation[1])


def _output_size(size: tuple[int, int], frame: _Frame, conv: nn.Conv2d) -> tuple[int, int]:
    """The spatial size a conv of the frame's kernel and padding and ``conv``'s stride and dilation gives."""
    return tuple((size[i] + 2 * frame.padding[i] - conv.dilation[i] * (frame.kernel[i] - 1) - 1)  # type: ignore
                 // conv.stride[i] + 1 for i in range(2))


def _branch_kernel(branch: Branch, like: nn.Conv2d, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A branch's kernel (its batch-norm folded in; the input itself as one tap per channel) and bias, in ``dtype``."""
    channels = like.out_channels
    if branch.conv is None:
        kernel = torch.zeros(channels, like.in_channels // like.groups, 1, 1, dtype=dtype, device=like.weight.device)
        kernel[torch.arange(channels), torch.arange(channels) % (like.in_channels // like.groups), 0, 0] = 1
        bias = torch.zeros(channels, dtype=dtype, device=like.weight.device)
    else:
        kernel = branch.conv.weight.detach().to(dtype)
        bias = branch.conv.bias.detach().to(dtype) if branch.conv.bias is not None else \
            torch.zeros(channels, dtype=dtype, device=like.weight.device)
    if branch.bn is not None:
        scale, shift = batch_norm_affine(branch.bn, dtype)
        kernel, bias = kernel * scale.reshape(-1, 1, 1, 1), bias * scale + shift
    return kernel, bias
