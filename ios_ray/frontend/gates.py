"""Attention gates spelt as units (import passes over the traced fx graph, with shapes).

* :func:`broadcasts_without_expands`: ``x * g.expand_as(x)`` (or ``g.expand(...)`` to x's shape) becomes ``x * g``:
  broadcasting gives the same values, and the multiply is then a ``scale`` unit where it was two opaque ones. (A sum
  keeps its expand: a sum of tensors of one shape folds into the unit that reads it, a broadcast one would not.)
* :func:`channel_convs_as_pointwise`: efficient channel attention (ECA-Net; timm's ``EcaModule``) pools a (B, C, H, W)
  tensor to C numbers per sample, views them as (B, 1, C), runs a ``Conv1d(1, 1, k)`` across the channels, gates
  and views the result back to (B, C, 1, 1). The ``Conv1d`` is a C x C matrix with k diagonals (the band of its
  taps), so the pool, views and ``Conv1d`` become the pool kept as (B, C, 1, 1) and an ``nn.Conv2d(C, C, 1)``
  holding that band: the same sums of the same products (in another order), computed by a pool unit and a conv
  unit with the gate's activation as its epilogue, where they were four opaque units. Every view in between may be
  any reshape, squeeze, unsqueeze, flatten, transpose or permute, because a per-sample tensor whose only dimension
  larger than 1 is the C channels holds them in one order whatever its shape.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn

from ios_ray.frontend.elementwise import elementwise_step, short_name
from ios_ray.frontend.nodes import (batch_first_meta, calls, constant_nodes, dimension_order, dtype_of, full_shape,
                                    holds_batch_first, module_of, shape, spatial_mean_keepdim)
from ios_ray.frontend.rewrites import add_module

_EXPANDS = (torch.ops.aten.expand_as.default, torch.ops.aten.expand.default, torch.Tensor.expand_as,
            torch.Tensor.expand)
_VIEWS: dict[str, tuple[Any, ...]] = {
    "functions": (torch.reshape, torch.squeeze, torch.unsqueeze, torch.flatten, torch.ops.aten.reshape.default,
                  torch.ops.aten.view.default, torch.ops.aten.squeeze.dim, torch.ops.aten.unsqueeze.default),
    "methods": ("reshape", "view", "squeeze", "unsqueeze", "flatten")}


def broadcasts_without_expands(gm: fx.GraphModule) -> fx.GraphModule:
    """An ``expand``/``expand_as`` read only by multiplies of two tensors, each one's other operand of the expanded
    shape, is dropped: the multiplies read the tensor before it."""
    for node in list(gm.graph.nodes):
        source = node.args[0] if _expands(node) and node.args else None
        if not isinstance(source, fx.Node) or full_shape(source) is None or dtype_of(source) != dtype_of(node) \
                or not node.users or not all(_multiplies(user, node) for user in node.users):
            continue
        node.replace_all_uses_with(source)
        _erase_unread(gm, node)
    return gm


def channel_convs_as_pointwise(gm: fx.GraphModule) -> fx.GraphModule:
    """Every ``Conv1d(1, 1, k)`` across a pooled tensor's channels (ECA's gate) becomes a 1x1 ``nn.Conv2d`` of C
    channels with the band of its taps, on the pool kept as (B, C, 1, 1), and the elementwise steps after it up to
    the (B, C, 1, 1) view the gate is read as run on that conv's output."""
    constants = constant_nodes(gm.graph)
    for node in list(gm.graph.nodes):
        conv = module_of(gm, node, nn.Conv1d)
        if conv is None or len(node.args) != 1 or node.kwargs or not _across_channels(conv, node):
            continue
        pooled, chain = _pooled(node.args[0]), _gate_chain(gm, node, constants)
        if pooled is None or chain is None:
            continue
        with gm.graph.inserting_before(chain[-1]):
            value = _kept_as_4d(gm, pooled)
            banded = add_module(gm, str(node.target), _banded(conv, shape(node)[-1]))
            value = _call(gm.graph.call_module(banded, (value,)), value, dtype_of(node))
            before = node
            for step in chain[:-1]:
                if not _is_view(step):
                    value = _call(_copy_reading(gm, step, before, value), value, dtype_of(step))
                before = step
        chain[-1].replace_all_uses_with(value)
        _erase_unread(gm, chain[-1])
    return gm


def _copy_reading(gm: fx.GraphModule, node: fx.Node, was: fx.Node, now: fx.Node) -> fx.Node:
    """A copy of ``node`` that reads ``now`` where ``node`` reads ``was``."""
    return gm.graph.node_copy(node, lambda n: now if n is was else n)


def _expands(node: fx.Node) -> bool:
    """Whether a node is ``expand``/``expand_as`` (a function, an ATen op or a method)."""
    return calls(node, _EXPANDS, ("expand", "expand_as"))


def _multiplies(user: fx.Node, expanded: fx.Node) -> bool:
    """Whether ``user`` multiplies two tensors, ``expanded`` one of them, whose other has ``expanded``'s shape, so
    that the product's shape and values stay those of the multiply by the tensor before the expand."""
    if short_name(user) != "mul" or len(user.args) != 2 or user.kwargs:
        return False
    others = [a for a in user.args if a is not expanded]
    return len(others) == 1 and isinstance(others[0], fx.Node) and full_shape(others[0]) == full_shape(expanded)


def _across_channels(conv: nn.Conv1d, node: fx.Node) -> bool:
    """Whether a ``Conv1d`` call maps a batch-first (B, 1, C) tensor to (B, 1, C): one channel in and out, stride 1,
    zero padding."""
    source = node.args[0]
    return (conv.in_channels, conv.out_channels, conv.groups, conv.stride) == (1, 1, 1, (1,)) and \
        conv.padding_mode == "zeros" and isinstance(source, fx.Node) and len(full_shape(source) or ()) == 3 and \
        shape(source)[0] == 1 and full_shape(node) == full_shape(source) and holds_batch_first(source) and \
        holds_batch_first(node)


def _one_line(node: Any, channels: int | None = None) -> bool:
    """Whether a node is a batch-first tensor whose every per-sample dimension but one (of ``channels``, where given)
    is 1."""
    if not isinstance(node, fx.Node) or full_shape(node) is None or not holds_batch_first(node):
        return False
    wide = [size for size in shape(node) if size != 1]
    return len(wide) == 1 and channels in (None, wide[0])


def _is_view(node: fx.Node) -> bool:
    """A reshape, squeeze, unsqueeze, flatten, transpose or permute."""
    return calls(node, _VIEWS["functions"], _VIEWS["methods"]) or dimension_order(node) is not None


def _pooled(source: fx.Node) -> fx.Node | None:
    """Back from a (B, 1, C) tensor through views of one line of C channels: the first tensor of shape (B, C, 1, 1),
    or a mean of a 4-d tensor over its spatial dimensions (B, C); None where the line starts elsewhere."""
    channels = shape(source)[-1]
    node = source
    while _one_line(node, channels):
        if shape(node) == (channels, 1, 1) or spatial_mean_keepdim(node) is False:
            return node
        if not _is_view(node) or not isinstance(node.args[0], fx.Node):
            return None
        node = node.args[0]
    return None


def _gate_chain(gm: fx.GraphModule, conv: fx.Node, constants: set[fx.Node]) -> list[fx.Node] | None:
    """Forward from the ``Conv1d`` call, each the one reader of the one before: elementwise steps that keep the dtype
    and views of one line, up to the first of shape (B, C, 1, 1), a view (the last item); None where none is
    reached."""
    channels, steps, node = shape(conv)[-1], [], conv
    while (users := list(node.users)) and len(users) == 1 and _one_line(user := users[0], channels):
        if _is_view(user):
            if user.args[0] is not node:
                return None
        elif elementwise_step(gm, user, node, constants) is None or dtype_of(user) != dtype_of(node):
            return None
        steps.append(user)
        if shape(user) == (channels, 1, 1):
            return steps
        node = user
    return None


def _kept_as_4d(gm: fx.GraphModule, pooled: fx.Node) -> fx.Node:
    """The pooled tensor as (B, C, 1, 1): itself, or its spatial mean again with ``keepdim``."""
    if len(full_shape(pooled) or ()) == 4:
        return pooled
    source: fx.Node = pooled.args[0]  # type: ignore[assignment]  # a spatial mean's input (_pooled)
    mean = gm.graph.call_function(torch.mean, (source, [2, 3], True))
    return _call(mean, source, dtype_of(pooled), (1, 1))


def _call(node: fx.Node, like: fx.Node, dtype: torch.dtype | None, spatial: tuple[int, ...] = ()) -> fx.Node:
    """``node``, a new call computing a batch-first tensor of ``like``'s shape (``spatial`` in place of its last
    dimensions where given) in ``dtype``, with that shape and batch layout recorded."""
    sizes = full_shape(like) or ()
    sizes = (*sizes[:2], *spatial) if spatial else sizes
    node.meta = batch_first_meta(torch.empty(sizes, dtype=dtype, device="meta"))
    return node


def _banded(conv: nn.Conv1d, channels: int) -> nn.Conv2d:
    """The ``nn.Conv2d(channels, channels, 1)`` computing what ``conv`` computes across a line of ``channels``:
    output channel c sums tap j times input channel c + j * dilation - (left padding), where that is in range."""
    taps, dilation = conv.weight.detach()[0, 0], conv.dilation[0]
    left = conv.padding[0] if not isinstance(conv.padding, str) else \
        (dilation * (len(taps) - 1)) // 2 if conv.padding == "same" else 0
    band = torch.zeros(channels, channels, dtype=taps.dtype, device=taps.device)
    rows = torch.arange(channels, device=taps.device)
    for j, tap in enumerate(taps):
        cols = rows + j * dilation - left
        inside = (cols >= 0) & (cols < channels)
        band[rows[inside], cols[inside]] += tap
    layer = nn.Conv2d(channels, channels, 1, bias=conv.bias is not None, dtype=taps.dtype, device=taps.device)
    with torch.no_grad():
        layer.weight.copy_(band[:, :, None, None])
        if conv.bias is not None and layer.bias is not None:
            layer.bias.fill_(float(conv.bias.detach()[0]))
    return layer.eval().requires_grad_(False)


def _erase_unread(gm: fx.GraphModule, node: fx.Node) -> None:
    """Remove a node nothing reads, then the nodes only it read that nothing else reads (size computations, views),
    never the graph's input or an attribute."""
    pending, erased = [node], set()
    while pending:
        found = pending.pop()
        if found in erased or found.users or found.op in ("placeholder", "get_attr", "output"):
            continue
        pending += found.all_input_nodes
        gm.graph.erase_node(found)
        erased.add(found)
