"""Split attention's sums over paths, rewritten as sums of the paths themselves (an import pass over the traced fx
graph, with shapes: :func:`path_sums`).

ResNeSt's split attention and SKNet's selective kernel hold R paths of C channels each as one five-dimensional tensor,
``t = x.reshape(B, R, C, H, W)`` (a conv's output of R*C channels) or ``t = torch.stack([p_1, ..., p_R], 1)``, and
read it only to sum it over the paths, alone (``t.sum(1)``) or weighted by an attention ``a`` of R in dimension 1
(``(t * a).sum(1)``). Where every reader of ``t`` does so, the sums become ``p_1 + ... + p_R`` and
``p_1 * a[:, 0] + ... + p_R * a[:, R - 1]``, the paths of a reshape being ``x``'s channel slices: the same values
(for two paths the same operations in the same order), computed by units of four dimensions (slices, products and
sums) that run in any memory format, where a five-dimensional tensor made from a channels-last one is summed 6-15x
slower (bench/RESULTS.md, split attention).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ios_ray.frontend.elementwise import short_name
from ios_ray.frontend.nodes import batch_first_meta, calls, full_shape, holds_batch_first

_SUMS = (torch.sum,)
_STACKS = (torch.stack, torch.ops.aten.stack.default)
_RESHAPES = (torch.reshape, torch.ops.aten.reshape.default, torch.ops.aten.view.default)


def path_sums(gm: fx.GraphModule) -> fx.GraphModule:
    """Every five-dimensional tensor of paths (a reshape splitting a 4-D tensor's channels, a stack in dimension 1)
    that is read only by sums over dimension 1, alone or of its product with an attention, is summed path by path."""
    for node in list(gm.graph.nodes):
        paths = _paths(node)
        readers = [_sum_of(node, reader) for reader in node.users] if paths is not None else []
        if paths is None or not readers or any(found is None for found in readers):
            continue
        with gm.graph.inserting_before(node):
            parts = _path_nodes(gm, *paths)
        for total, attention in readers:  # type: ignore[misc]
            _sum_path_by_path(gm, parts, total, attention)
        _erase_with_unread_arguments(gm, node)
    return gm


def _path_nodes(gm: fx.GraphModule, source: fx.Node | list[fx.Node], count: int, channels: int) -> list[fx.Node]:
    """The paths: those stacked, or the reshaped tensor's channel slices."""
    if isinstance(source, list):
        return source
    return [_new(gm, operator.getitem, (source, (slice(None), slice(i * channels, (i + 1) * channels))))
            for i in range(count)]


def _paths(node: fx.Node) -> tuple[fx.Node, int, int] | tuple[list[fx.Node], int, int] | None:
    """What a tensor of R paths is made of: ``(x, R, C)`` for a reshape of a batch-first 4-D ``x`` of R*C channels
    into (B, R, C, H, W), ``(paths, R, C)`` for a stack in dimension 1 of R batch-first 4-D paths of C channels;
    None for any other node."""
    shape = full_shape(node)
    if shape is None or len(shape) != 5 or shape[1] < 2 or not holds_batch_first(node):
        return None
    if calls(node, _RESHAPES, ("reshape",)) and isinstance(node.args[0], fx.Node):
        source = node.args[0]
        if full_shape(source) == (shape[0], shape[1] * shape[2], *shape[3:]) and holds_batch_first(source):
            return source, shape[1], shape[2]
        return None
    if calls(node, _STACKS, ("stack",)) and _stack_dim(node) == 1 and isinstance(node.args[0], (list, tuple)):
        parts = list(node.args[0])
        if len(parts) == shape[1] and all(isinstance(p, fx.Node) and full_shape(p) == (shape[0], *shape[2:])
                                          and holds_batch_first(p) for p in parts):
            return parts, shape[1], shape[2]
    return None


def _stack_dim(node: fx.Node) -> Any:
    """The dimension a stack is made in (0 by default)."""
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)


def _sum_of(paths: fx.Node, reader: fx.Node) -> tuple[fx.Node, fx.Node | None] | None:
    """``(the sum, None)`` where ``reader`` sums the paths over dimension 1, ``(the sum, a)`` where it multiplies them
    by an attention ``a`` of R paths in dimension 1 and only a sum over dimension 1 reads the product; else None."""
    if _sums_paths(reader, paths):
        return reader, None
    if short_name(reader) != "mul" or reader.kwargs or len(reader.args) != 2 or len(reader.users) != 1:
        return None
    attention = reader.args[1] if reader.args[0] is paths else reader.args[0]
    total = next(iter(reader.users))
    shape, weights = full_shape(paths), full_shape(attention)
    if not isinstance(attention, fx.Node) or attention is paths or weights is None or shape is None or \
            len(weights) != 5 or weights[1] != shape[1] or not holds_batch_first(attention) or \
            full_shape(reader) != shape or not _sums_paths(total, reader):
        return None
    return total, attention


def _sums_paths(node: fx.Node, source: fx.Node) -> bool:
    """Whether ``node`` is ``source.sum(1)`` (``torch.sum(source, 1)``, dimension 1 or [1], no keepdim or dtype)."""
    if not calls(node, _SUMS, ("sum",)) or not node.args or node.args[0] is not source:
        return False
    arguments = dict(zip(("dim", "keepdim"), node.args[1:]), **node.kwargs)
    dims = arguments.pop("dim", None)
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    return dims in ([1], [-4]) and not arguments.pop("keepdim", False) and not arguments


def _sum_path_by_path(gm: fx.GraphModule, paths: list[fx.Node], total: fx.Node, attention: fx.Node | None) -> None:
    """Replace ``total`` by the sum of the paths, each multiplied by its attention where there is one."""
    terms = list(paths)
    with gm.graph.inserting_before(total):
        if attention is not None:
            terms = [_new(gm, operator.mul, (path, _new(gm, operator.getitem, (attention, (slice(None), i)))))
                     for i, path in enumerate(paths)]
        summed = terms[0]
        for term in terms[1:]:
            summed = _new(gm, operator.add, (summed, term))
    summed.meta = dict(total.meta)
    total.replace_all_uses_with(summed)
    product = total.args[0] if attention is not None else None
    gm.graph.erase_node(total)
    if isinstance(product, fx.Node) and not product.users:
        gm.graph.erase_node(product)


def _new(gm: fx.GraphModule, function: Any, args: tuple[Any, ...]) -> fx.Node:
    """A call of ``function`` on ``args`` with its shape and batch layout recorded (the batch in dimension 0, as in
    every tensor the pass reads), computed on meta tensors of the arguments' shapes."""
    node = gm.graph.call_function(function, args)
    node.meta = batch_first_meta(function(*fx.node.map_arg(args, _meta_tensor)))
    return node


def _meta_tensor(node: fx.Node) -> torch.Tensor:
    """A meta tensor of a node's recorded shape and dtype."""
    meta = node.meta["tensor_meta"]
    return torch.empty(meta.shape, dtype=meta.dtype, device="meta")


def _erase_with_unread_arguments(gm: fx.GraphModule, node: fx.Node) -> None:
    """Remove a node nothing reads any more, and the size computations only it read."""
    arguments = [a for a in node.all_input_nodes if a.op == "call_method" and a.target == "size"]
    gm.graph.erase_node(node)
    for argument in arguments:
        if not argument.users:
            gm.graph.erase_node(argument)
