"""Grouping fx nodes into units by pattern: each rule a small function ``(gm, node, taken) -> Match | None``.

:func:`find_matches` runs the conv rule over the graph first (convs claim the batch-norms and activations around
them), then the others, then lets every match grow its epilogue
(:func:`~ios_ray.frontend.elementwise.elementwise_chain`).

* pools: max, average and adaptive pools (modules or functions), and a mean over the spatial dimensions;
* 3-d max and average pools; linear layers, transposed convs and 3-d convs (module units: the layer's own call);
* upsampling, pads and crops (:mod:`~ios_ray.frontend.spatial`);
* flattens (``torch.flatten``, ``nn.Flatten``, ``x.view(x.size(0), -1)``);
* a channel shuffle, ``reshape(b, g, c/g, h, w) -> transpose(1, 2) -> reshape(b, c, h, w)``, or
  ``nn.ChannelShuffle``: one ``shuffle`` unit;
* a channel slice: an item of ``chunk``/``split`` along the channels, ``x[:, a:b]``, ``narrow``: one ``slice`` unit;
* the scaling of a tensor by a gate, ``x * gate`` with a (C, 1, 1), (1, H, W) or same-shape gate: one ``scale`` unit.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ios_ray.frontend.conv import match_conv, residual_of
from ios_ray.frontend.elementwise import elementwise_chain, scalar_multiple, short_name
from ios_ray.frontend.match import Match, Scope
from ios_ray.frontend.nodes import (arg_node, calls, dimension_order, full_shape, holds_batch_first, is_tensor,
                                    is_tuple_of_tensors, module_of, normalized_kwargs, numel, only_user, pair, shape,
                                    spatial_mean_keepdim)
from ios_ray.frontend.spatial import match_pad, match_upsample

Rule = Callable[[Scope, fx.Node], Match | None]

_POOL_MODULES = {nn.MaxPool2d: "max", nn.AvgPool2d: "avg", nn.AdaptiveAvgPool2d: "adaptive_avg",
                 nn.AdaptiveMaxPool2d: "adaptive_max"}
_POOL_FUNCTIONS: dict[Any, str] = {F.max_pool2d: "max", F.avg_pool2d: "avg", F.adaptive_avg_pool2d: "adaptive_avg",
                                   F.adaptive_max_pool2d: "adaptive_max"}
_POOL_PARAMS = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "dilation", "output_size")
_PAIRS = ("kernel_size", "stride", "padding", "dilation", "output_size")
_RESHAPES: dict[str, tuple[Any, ...]] = {"functions": (torch.reshape,), "methods": ("reshape", "view")}
_SPLITS: dict[str, tuple[Any, ...]] = {"functions": (torch.chunk, torch.split, torch.tensor_split),
                                        "methods": ("chunk", "split", "tensor_split")}


def match_pool(scope: Scope, node: fx.Node) -> Match | None:
    """Max, average and adaptive 2-d pools, as modules or functions; a mean over the spatial dimensions."""
    gm = scope.gm
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        mode = _POOL_MODULES.get(type(module))
        params = {k: getattr(module, k) for k in _POOL_PARAMS if hasattr(module, k)}
    elif node.op == "call_function" and _one_of(node.target, _POOL_FUNCTIONS):
        mode = _POOL_FUNCTIONS[node.target]
        normalized = normalized_kwargs(gm, node)
        if normalized is None:
            return None
        params = {k: v for k, v in normalized.items() if k != "input"}
    else:
        return _match_spatial_mean(node)
    if mode is None or any(isinstance(v, fx.Node) for v in params.values()) or params.get("return_indices") \
            or not isinstance(node.args[0] if node.args else None, fx.Node):
        return None
    attrs = {"mode": mode, **{k: pair(v) if k in _PAIRS else v for k, v in params.items() if k != "return_indices"}}
    if attrs.get("stride") in (None, ()):
        attrs["stride"] = attrs.get("kernel_size")
    return Match.single("pool", node, [arg_node(node)], attrs)


def _match_spatial_mean(node: fx.Node) -> Match | None:
    """``x.mean((2, 3), keepdim=...)`` on a 4-d tensor: a global average pool (flattened where not keepdim)."""
    keepdim = spatial_mean_keepdim(node)
    if keepdim is None:
        return None
    attrs: dict[str, Any] = {"mode": "adaptive_avg", "output_size": (1, 1)}
    if not keepdim:
        attrs["keepdim"] = False
    return Match.single("pool", node, [arg_node(node)], attrs)


def match_linear(scope: Scope, node: fx.Node) -> Match | None:
    """An ``nn.Linear`` call."""
    gm = scope.gm
    linear = module_of(gm, node, nn.Linear)
    if linear is None:
        return None
    attrs = {"in_features": linear.in_features, "out_features": linear.out_features, "bias": linear.bias is not None}
    return Match("linear", str(node.target), [arg_node(node)], node, node, [node], attrs,
                 {"id": str(node.target), "linear": str(node.target)})


def match_conv_transpose(scope: Scope, node: fx.Node) -> Match | None:
    """An ``nn.ConvTranspose2d`` or ``nn.ConvTranspose3d`` call (a decoder's learned upsampling), zero-padded, with
    no output size given."""
    conv = module_of(scope.gm, node, (nn.ConvTranspose2d, nn.ConvTranspose3d))
    if conv is None or conv.padding_mode != "zeros" or len(node.args) != 1 or node.kwargs:
        return None
    attrs = {**_conv_attrs(conv), "output_padding": tuple(conv.output_padding)}
    return Match("conv_transpose", str(node.target), [arg_node(node)], node, node, [node], attrs,
                 {"id": str(node.target), "module": str(node.target)})


def match_conv3d(scope: Scope, node: fx.Node) -> Match | None:
    """An ``nn.Conv3d`` call (volumes, video), zero-padded; its batch-norm and activation become its epilogue."""
    conv = module_of(scope.gm, node, nn.Conv3d)
    if conv is None or conv.padding_mode != "zeros" or isinstance(conv.padding, str) or len(node.args) != 1:
        return None
    return Match("conv3d", str(node.target), [arg_node(node)], node, node, [node], _conv_attrs(conv),
                 {"id": str(node.target), "module": str(node.target)})


def match_pool3d(scope: Scope, node: fx.Node) -> Match | None:
    """A 3-d max or average pool module (volumes, video)."""
    pool = module_of(scope.gm, node, (nn.MaxPool3d, nn.AvgPool3d))
    if pool is None or getattr(pool, "return_indices", False) or getattr(pool, "divisor_override", None) or \
            len(node.args) != 1:
        return None
    attrs = {"mode": "max" if isinstance(pool, nn.MaxPool3d) else "avg", "kernel_size": _triple(pool.kernel_size),
             "stride": _triple(pool.stride or pool.kernel_size), "padding": _triple(pool.padding),
             "ceil_mode": pool.ceil_mode}
    if isinstance(pool, nn.MaxPool3d):
        attrs["dilation"] = _triple(pool.dilation)
    else:
        attrs["count_include_pad"] = pool.count_include_pad
    return Match.single("pool", node, [arg_node(node)], attrs)


def _triple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * 3


def _conv_attrs(conv: nn.modules.conv._ConvNd) -> dict[str, Any]:
    """What a convolution layer computes, for its unit's attributes."""
    return {"in_channels": conv.in_channels, "out_channels": conv.out_channels, "kernel": tuple(conv.kernel_size),
            "stride": tuple(conv.stride), "padding": tuple(conv.padding), "dilation": tuple(conv.dilation),
            "groups": conv.groups, "bias": conv.bias is not None}


def match_flatten(scope: Scope, node: fx.Node) -> Match | None:
    """``torch.flatten``/``x.flatten``, ``nn.Flatten``, and a reshape to (batch, everything else)."""
    gm = scope.gm
    source = node.args[0] if node.args else None
    if not is_tensor(source) or not is_tensor(node):
        return None
    flatten = module_of(gm, node, nn.Flatten)
    if flatten is not None:
        return Match.single("flatten", node, [source], {"start_dim": flatten.start_dim, "end_dim": flatten.end_dim})
    if calls(node, (torch.flatten,), ("flatten",)) and len(node.all_input_nodes) == 1:
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
        if isinstance(start, int) and isinstance(end, int):
            return Match.single("flatten", node, [source], {"start_dim": start, "end_dim": end})
    if calls(node, **_RESHAPES) and full_shape(node) == (full_shape(source)[0], numel(shape(source))):  # type: ignore
        return Match.single("flatten", node, [source], {"start_dim": 1, "end_dim": -1})
    return None


def match_shuffle(scope: Scope, node: fx.Node) -> Match | None:
    """A channel shuffle: ``nn.ChannelShuffle``/``F.channel_shuffle``, or reshape -> transpose(1, 2) -> reshape."""
    gm = scope.gm
    source = node.args[0] if node.args else None
    module = module_of(gm, node, nn.ChannelShuffle)
    if module is not None or calls(node, (F.channel_shuffle, torch.channel_shuffle, torch.native_channel_shuffle)):
        groups = module.groups if module is not None else (node.args[1] if len(node.args) > 1 else None)
        return Match("shuffle", node.name, [source], node, node, [node], {"groups": groups}, {}) \
            if isinstance(groups, int) and is_tensor(source) else None
    split, swap = node, only_user(node)
    merge = only_user(swap) if swap is not None else None
    if not calls(split, **_RESHAPES) or not is_tensor(source) or swap is None or merge is None \
            or not calls(merge, **_RESHAPES) or not _swaps_dims_1_2(swap):
        return None
    channels, rest = shape(source)[0], shape(source)[1:]
    groups = shape(split)[0] if len(shape(split)) == len(rest) + 2 else 0
    if groups < 2 or shape(split) != (groups, channels // groups, *rest) or shape(merge) != shape(source):
        return None
    return Match("shuffle", split.name, [source], merge, merge, [split, swap, merge], {"groups": groups}, {})


def _swaps_dims_1_2(node: Any) -> bool:
    """``transpose(1, 2)`` or ``permute(0, 2, 1, ...)``."""
    order = dimension_order(node)
    return order is not None and order[:3] == (0, 2, 1) and order[3:] == tuple(range(3, len(order)))


def match_slice(scope: Scope, node: fx.Node) -> Match | None:
    """A channel slice: an item of ``chunk``/``split`` along dim 1, ``x[:, a:b]``, ``narrow(1, a, n)``."""
    found = channel_slice(node)
    if found is None:
        return None
    source, start, stop = found
    return Match("slice", node.name, [source], node, node, [node], {"start": start, "stop": stop}, {})


def channel_slice(node: Any) -> tuple[fx.Node, int, int] | None:
    """The tensor a node takes channels ``start`` to ``stop`` of, and those bounds, where it is a channel slice (an item
    of ``chunk``/``split`` along dim 1, ``x[:, a:b]``, ``narrow(1, a, n)``); else None."""
    if not isinstance(node, fx.Node):
        return None
    if node.op != "call_function" or node.target is not operator.getitem or not is_tensor(node):
        return _narrowed(node)
    source, index = node.args
    if isinstance(source, fx.Node) and is_tuple_of_tensors(source) and calls(source, **_SPLITS) \
            and _split_dim(source) == 1 and isinstance(index, int):
        sizes = [m.shape[1] for m in source.meta["tensor_meta"]]
        start = sum(sizes[:index % len(sizes)])
        return _sliced(node, source.args[0], start, start + sizes[index % len(sizes)])
    if is_tensor(source) and isinstance(index, tuple) and len(index) >= 2 and index[0] == slice(None) \
            and isinstance(index[1], slice) and all(i in (slice(None), Ellipsis) for i in index[2:]):
        start, stop, step = index[1].indices(shape(source)[0])
        if step == 1 and all(isinstance(v, int) or v is None for v in (index[1].start, index[1].stop)):
            return _sliced(node, source, start, stop)
    return None


def _narrowed(node: fx.Node) -> tuple[fx.Node, int, int] | None:
    rank = len(full_shape(node.args[0]) or ()) if node.args else 0
    if not calls(node, (torch.narrow,), ("narrow",)) or len(node.args) != 4 or not isinstance(node.args[1], int) \
            or not rank or node.args[1] % rank != 1:  # the channels: -3 only where the tensor is 4-d
        return None
    start, length = node.args[2:]
    if not isinstance(start, int) or not isinstance(length, int) or not is_tensor(node.args[0]):
        return None
    return _sliced(node, node.args[0], start, start + length)


def _sliced(node: fx.Node, source: Any, start: int, stop: int) -> tuple[fx.Node, int, int] | None:
    if not is_tensor(source) or len(full_shape(source) or ()) < 2 or shape(node)[0] != stop - start:
        return None
    return source, start, stop


def _split_dim(node: fx.Node) -> int | None:
    """The dimension a ``chunk``/``split`` node splits along, made non-negative."""
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    rank = len(full_shape(node.args[0]) or ())
    return dim % rank if isinstance(dim, int) and rank else None


def match_scale(scope: Scope, node: fx.Node) -> Match | None:
    """The scaling of a tensor by a gate: ``x * gate`` (either order) of (C, H, W) tensors, ``gate`` of shape
    (C, 1, 1) (a squeeze-excitation gate), (1, H, W) (a spatial attention's) or x's own (StarNet's and gated
    convs' products of two branches); where the gate is smaller than x, the multiplies by numbers that alone read it,
    one after another (NFNet's ``* attn_gain * alpha``: their product is the attribute ``factor``, applied to the
    gate, so that the scaling allocates nothing the size of x but its output), and a residual sum
    after them of a tensor ``x`` was computed from (SE-ResNet's ``se(out) + shortcut``; ``residual``, a third input),
    as the conv pattern takes one."""
    if short_name(node) != "mul" or len(node.args) != 2 or node.kwargs or \
            not all(is_tensor(a) and a not in scope.constants for a in node.args):
        return None
    first, second = arg_node(node, 0), arg_node(node, 1)
    for x, gate in ((first, second), (second, first)):
        if _gates(x, gate) and shape(node) == shape(x):
            nodes, factor = [node], 1.0
            while shape(gate) != shape(x) and scope.free(reader := only_user(nodes[-1])) and \
                    (scaled := scalar_multiple(reader)) is not None and scaled[0] is nodes[-1]:
                nodes.append(reader)  # type: ignore[arg-type]
                factor *= scaled[1]
            attrs: dict[str, Any] = {"factor": factor} if len(nodes) > 1 else {}
            inputs = [x, gate]
            residual = residual_of(scope, nodes[-1], x)
            if residual is not None:
                nodes.append(only_user(nodes[-1]))  # type: ignore[arg-type]  # the sum
                inputs.append(residual)
                attrs["residual"] = True
            return Match("scale", node.name, inputs, node, nodes[-1], nodes, attrs, {})
    return None


def _gates(x: fx.Node, gate: fx.Node) -> bool:
    """Whether ``gate`` scales the (C, H, W) ``x`` as :func:`match_scale` takes it: of shape (C, 1, 1) (where x has
    more than one position), (1, H, W) or x's own, both holding the batch in dimension 0 (where recorded) at the
    same size."""
    sizes, by = shape(x), shape(gate)
    if len(sizes) != 3 or (full_shape(x) or ())[:1] != (full_shape(gate) or ())[:1] or \
            any("batch_dims" in n.meta and not holds_batch_first(n) for n in (x, gate)):
        return False
    return (by == (sizes[0], 1, 1) and numel(sizes[1:]) > 1) or by in ((1, *sizes[1:]), sizes)


RULES: tuple[tuple[Rule, ...], ...] = (
    (match_conv,),
    (match_pool, match_pool3d, match_linear, match_conv_transpose, match_conv3d, match_upsample, match_flatten,
     match_shuffle, match_slice, match_pad, match_scale),
)


def find_matches(scope: Scope) -> dict[fx.Node, Match]:
    """Every recognised unit, keyed by its tail node; the nodes they stand for are added to ``scope.taken``."""
    found: list[Match] = []
    for rules in RULES:
        for node in scope.gm.graph.nodes:
            if not scope.free(node):
                continue
            match = next((m for rule in rules if (m := rule(scope, node)) is not None), None)
            if match is not None:
                found.append(match)
                scope.taken.update(match.nodes)
    order = {node: i for i, node in enumerate(scope.gm.graph.nodes)}
    for match in sorted(found, key=lambda m: order[m.main]):
        chain = elementwise_chain(scope, match.tail)
        match.add_epilogue(chain)
        scope.taken.update(node for node, _ in chain)
    return {m.tail: m for m in found}


def _one_of(target: Any, table: dict[Any, Any]) -> bool:
    return any(target is key for key in table)
