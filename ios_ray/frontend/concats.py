"""Concatenations of convs, rewritten so that no pass over the concatenation remains where the convs can do its work
(two import passes over the traced fx graph, with shapes: :func:`split_convs_as_grouped`,
:func:`norms_into_concatenated_convs`).

timm's ``MixedConv2d`` (MixNet's blocks) splits its input's channels into parts, convolves each part with a kernel of
its own size and concatenates the results; the batch-norm and activation after it then run on the whole
concatenation, as passes of their own (or as the next conv's prologue), where after a single conv they fold into its
weights and fuse into its kernel. A batch-norm acts on each channel alone and an activation on each element, so
``act(bn(cat([c_1, ..., c_k], 1)))`` is ``cat([act(bn_1(c_1)), ..., act(bn_k(c_k))], 1)``, ``bn_i`` the batch-norm's
channels of part ``i``: the same values, computed by conv units with their batch-norm folded and activation fused.

Where the parts are equal and so are their convs (MixNet's split pointwise convs: two 1x1 convs, each on half the
channels), the split, the convs and the concatenation are one grouped conv (:func:`split_convs_as_grouped`): each
group computes what its part's conv did, without the copies of channel slices and of the concatenation that the parts
cost in channels-last memory.
"""

from __future__ import annotations

import operator
from typing import Any, Mapping, cast

import torch
import torch.fx as fx
from torch import nn

from ios_ray.frontend.activations import activation_of
from ios_ray.frontend.nodes import CONCATENATIONS, arg_node, calls, eval_batch_norm, full_shape, module_of, only_user
from ios_ray.frontend.patterns import channel_slice
from ios_ray.frontend.rewrites import add_module

Pair = tuple[int, int]


def norms_into_concatenated_convs(gm: fx.GraphModule) -> fx.GraphModule:
    """Where an eval-mode batch-norm alone reads a concatenation along the channels of convs' outputs, each read by
    the concatenation alone, each conv gets the batch-norm of its channels (a copy of that slice of it, registered in
    ``gm``), and so does an activation that alone reads the batch-norm; the concatenation's readers read it as they
    read the activation (or batch-norm) before."""
    for node in list(gm.graph.nodes):
        parts = _concatenated_convs(gm, node)
        step = only_user(node) if parts is not None else None
        bn = eval_batch_norm(gm, step)
        if parts is None or step is None or bn is None or step.args != (node,):
            continue
        _move_into_parts(node, step, _norms_of_parts(gm, step, bn, parts))
        step = only_user(node)
        if step is not None and activation_of(gm, step) is not None and step.all_input_nodes == [node]:
            _move_into_parts(node, step, [_call_after(gm, part, step.op, step.target, step.args[1:], step.kwargs)
                                          for part in node.args[0]])
    return gm


def split_convs_as_grouped(gm: fx.GraphModule) -> fx.GraphModule:
    """Where a concatenation along the channels reads convs alone, each on the next of equal channel slices that
    together make up one tensor, and the convs are alike but for their weights (kernel, stride, padding, dilation,
    groups, channels, bias or none), they become one conv with as many times the groups, its weights theirs in order
    (a new ``nn.Conv2d`` registered in ``gm``)."""
    for node in list(gm.graph.nodes):
        parts = _concatenated_convs(gm, node)
        source = _split_source(parts) if parts is not None else None
        convs = [cast(nn.Conv2d, gm.get_submodule(str(p.target))) for p in parts or ()]
        if parts is None or source is None or not _alike(convs):
            continue
        with gm.graph.inserting_before(node):
            grouped = gm.graph.call_module(add_module(gm, str(parts[0].target), _grouped(convs)), (source,))
        grouped.meta = dict(node.meta)
        node.replace_all_uses_with(grouped)
        _erase_unread([node, *parts, *(arg_node(p) for p in parts)])
    return gm


def _split_source(parts: list[fx.Node]) -> fx.Node | None:
    """The tensor whose channels the parts' inputs split, in order and into equal slices that cover it; else None."""
    slices = [channel_slice(part.args[0]) for part in parts]
    if any(found is None for found in slices):
        return None
    sources = {found[0] for found in slices}  # type: ignore[index]
    bounds = [(start, stop) for _, start, stop in slices]  # type: ignore[misc]
    size = bounds[0][1] - bounds[0][0]
    source = sources.pop() if len(sources) == 1 else None
    if source is None or bounds != [(i * size, (i + 1) * size) for i in range(len(bounds))]:
        return None
    return source if full_shape(source)[1] == size * len(bounds) else None  # type: ignore[index]


def _alike(convs: list[nn.Conv2d]) -> bool:
    """Whether convs differ in their weights alone."""
    first = convs[0]
    same = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "padding_mode")
    return all(getattr(c, name) == getattr(first, name) for c in convs for name in same) and \
        all((c.bias is None) == (first.bias is None) and c.weight.dtype == first.weight.dtype for c in convs) and \
        not isinstance(first.padding, str)


def _grouped(convs: list[nn.Conv2d]) -> nn.Conv2d:
    """One conv with the groups of all of ``convs`` side by side, on their inputs concatenated."""
    first, k = convs[0], len(convs)
    grouped = nn.Conv2d(first.in_channels * k, first.out_channels * k, cast(Pair, first.kernel_size),
                        cast(Pair, first.stride), cast(Pair, first.padding), cast(Pair, first.dilation),
                        first.groups * k, first.bias is not None, first.padding_mode, device=first.weight.device,
                        dtype=first.weight.dtype).eval()
    with torch.no_grad():
        grouped.weight.copy_(torch.cat([c.weight for c in convs]))
        if grouped.bias is not None:
            grouped.bias.copy_(torch.cat([c.bias for c in convs]))  # type: ignore[misc]
    return grouped


def _erase_unread(nodes: list[fx.Node]) -> None:
    """Remove each node that nothing reads any more, in order, and the ``split`` an item of which it was."""
    for node in nodes:
        if node.users:
            continue
        split = node.args[0] if node.target is operator.getitem else None
        node.graph.erase_node(node)
        if isinstance(split, fx.Node) and not split.users:
            split.graph.erase_node(split)


def _concatenated_convs(gm: fx.GraphModule, node: fx.Node) -> list[fx.Node] | None:
    """The parts of a 4-D concatenation along the channels whose parts are all ``nn.Conv2d`` calls that nothing else
    reads (not even for a size)."""
    if not calls(node, CONCATENATIONS) or len(full_shape(node) or ()) != 4:
        return None
    tensors = node.args[0] if node.args else None  # as captures write it: torch.cat(tensors, dim)
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(tensors, (list, tuple)) or len(tensors) < 2 or dim not in (1, -3):
        return None
    if all(module_of(gm, part, nn.Conv2d) is not None and list(part.users) == [node] for part in tensors):
        return list(tensors)
    return None


def _norms_of_parts(gm: fx.GraphModule, step: fx.Node, bn: nn.BatchNorm2d, parts: list[fx.Node]) -> list[fx.Node]:
    """For each part, a call of a copy of ``bn`` (the batch-norm ``step`` calls) cut to the part's channels."""
    calls_, start = [], 0
    for part in parts:
        channels = full_shape(part)[1]  # type: ignore[index]
        cut = add_module(gm, str(step.target), _channels_of(bn, start, start + channels))
        calls_.append(_call_after(gm, part, "call_module", cut))
        start += channels
    return calls_


def _channels_of(bn: nn.BatchNorm2d, start: int, stop: int) -> nn.BatchNorm2d:
    """An eval-mode copy of a batch-norm's channels ``start`` to ``stop`` (its weights and statistics copied)."""
    cut = nn.BatchNorm2d(stop - start, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                         device=bn.running_var.device, dtype=bn.running_var.dtype).eval()  # type: ignore[union-attr]
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            mine = getattr(cut, name)
            if mine is not None:
                mine.copy_(getattr(bn, name)[start:stop])
    return cut


def _call_after(gm: fx.GraphModule, part: fx.Node, op: str, target: Any, rest: tuple[Any, ...] = (),
                kwargs: Mapping[str, Any] | None = None) -> fx.Node:
    """A node of ``op`` and ``target`` on ``part`` (then ``rest`` and ``kwargs``), placed after it, with its shape
    and batch layout (a step that keeps them: a batch-norm, an activation)."""
    with gm.graph.inserting_after(part):
        call = gm.graph.create_node(op, target, (part, *rest), dict(kwargs or {}))
    call.meta = dict(part.meta)
    return call


def _move_into_parts(cat: fx.Node, step: fx.Node, parts: list[fx.Node]) -> None:
    """Make ``cat`` concatenate ``parts`` (each part with ``step`` applied) and its readers read it for ``step``."""
    cat.args = (parts, *cat.args[1:])
    step.replace_all_uses_with(cat)
    step.graph.erase_node(step)
