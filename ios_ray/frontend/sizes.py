"""Arithmetic on sizes evaluated at import time: ``x.size()``, ``x.shape``, ``x.dim()`` and int ops on them.

An import fixes every dimension but the batch. So a size computation that does not read a dimension that grows with
the batch (dimension 0, or wherever :func:`~ios_ray.frontend.trace.record_batch_layout` found the batch) is a
constant: its readers take its value (recorded by :func:`~ios_ray.frontend.trace.propagate`) as a literal and the
node goes away. One that does (``x.size(0)``, the ``batchsize`` unpacked from ``x.size()``, ``x.numel()``) stays in
the graph, marked ``meta['batch_size']``; it never becomes a unit, the unit that reads it computes it.

Example: ShuffleNet's ``b, c, h, w = x.size(); x.view(b, 2, c // 2, h, w)`` becomes ``x.view(b, 2, 58, 28, 28)``
with ``b`` the only size node left.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ios_ray.frontend.nodes import arg_node, batch_dims, constant_nodes, full_shape

#: Tensor methods and attributes that read only a tensor's sizes (or dtype, device), never its values.
_SIZE_METHODS = ("size", "dim", "ndimension", "numel", "nelement")
_SIZE_ATTRIBUTES = ("shape", "ndim", "dtype", "device", "is_cuda")

Taint = bool | tuple[bool, ...]


def fold_sizes(gm: fx.GraphModule) -> fx.GraphModule:
    """Size computations become literals in their readers, except those that depend on the batch size."""
    constants = constant_nodes(gm.graph)
    taint: dict[fx.Node, Taint] = {}
    for node in list(gm.graph.nodes):
        if not _is_size(node, taint):
            continue
        taint[node] = _batch_taint(node, taint, constants)
        if _any(taint[node]):
            node.meta["batch_size"] = True
        else:
            _inline(gm, node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _is_size(node: fx.Node, taint: dict[fx.Node, Taint]) -> bool:
    """A node computing no tensor that reads only sizes of tensors, or other size nodes and literals."""
    if node.op not in ("call_function", "call_method") or "tensor_meta" in node.meta or "value" not in node.meta:
        return False
    return _reads_size(node) or all(n in taint for n in node.all_input_nodes)


def _reads_size(node: fx.Node) -> bool:
    """``x.size(...)``, ``x.shape``, ``x.dim()`` and the like, on a tensor."""
    if not node.args or full_shape(node.args[0]) is None:
        return False
    if node.op == "call_method":
        return node.target in _SIZE_METHODS
    return node.target is getattr and len(node.args) == 2 and node.args[1] in _SIZE_ATTRIBUTES


def _batch_taint(node: fx.Node, taint: dict[fx.Node, Taint], constants: set[fx.Node]) -> Taint:
    """Whether a size value depends on the batch size; for a tuple (``x.size()``), per element."""
    if _reads_size(node):
        source = arg_node(node)
        what = node.target if node.op == "call_method" else node.args[1]
        if source in constants or what not in ("size", "shape", "numel", "nelement"):
            return False
        if what in ("numel", "nelement"):
            return True
        dim = node.args[1] if node.op == "call_method" and len(node.args) > 1 else node.kwargs.get("dim")
        grows = batch_dims(source)
        return grows[dim % len(grows)] if isinstance(dim, int) else grows
    source_taint = taint.get(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
    if node.target is operator.getitem and isinstance(source_taint, tuple) and isinstance(node.args[1], (int, slice)):
        return source_taint[node.args[1]]
    return any(_any(taint[n]) for n in node.all_input_nodes)


def _inline(gm: fx.GraphModule, node: fx.Node) -> None:
    """Replace every use of a size node by its value, and remove it."""
    value: Any = node.meta["value"]
    literal = tuple(value) if isinstance(value, torch.Size) else value
    for user in list(node.users):
        user.args = fx.node.map_arg(user.args, lambda n: literal if n is node else n)
        user.kwargs = fx.node.map_arg(user.kwargs, lambda n: literal if n is node else n)
    gm.graph.erase_node(node)


def _any(taint: Taint) -> bool:
    return any(taint) if isinstance(taint, tuple) else taint

