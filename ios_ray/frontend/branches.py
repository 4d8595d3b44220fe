"""Linear combinations of parallel conv branches on one input, rewritten as one conv (structural
re-parameterisation: an import pass over the traced fx graph, with shapes: :func:`branches_as_one_conv`).

RepVGG, MobileOne, FastViT and RepGhostNet train blocks whose branches all read one input ``x`` (a kxk conv with its
batch-norm, MobileOne several; a 1x1 conv with its batch-norm; a batch-norm of ``x``, or ``x`` itself) and sum
them. Their released weights, and timm's models unless the user calls ``reparameterize_model``, keep the branches:
a conv pass per branch and a pass per sum. The branches' sum is one conv
(:func:`~ios_ray.frontend.weights.summed_conv`): the same values up to rounding, computed by one conv unit, into
which the activation (and residual sum) after the block fuses as after any conv. A sum may weigh its terms by a
number or per channel by a constant (a layer scale: FastViT's ``x + gamma * (mixer(x) - norm(x))``): the weights
take the factor too, and so does a single conv's where its factor is per channel (``x + gamma * conv(h)``, which
is then a conv with a residual sum).
"""

from __future__ import annotations

import operator
import sys
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from ios_ray.frontend.elementwise import scalar_multiple, short_name
from ios_ray.frontend.nodes import arg_node, arg_nodes, constant_nodes, dtype_of, eval_batch_norm, full_shape, module_of
from ios_ray.frontend.rewrites import add_module, constant_value, drop_unread_constants
from ios_ray.frontend.weights import Branch, Factor, summed_conv

#: The magnitudes of the numbers a weighing may multiply by: any but 0, subnormal ones and infinity (the weights
#: take them exactly; 1 / c of a divide stays finite).
_NUMBERS = (sys.float_info.min, sys.float_info.max)
Term = tuple[fx.Node, Factor]


class _Pass:
    """One run of the pass over a graph module: its constants and their values, computed once."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.constants = constant_nodes(gm.graph)
        self.values: dict[str, Any] = {}

    def run(self) -> None:
        for node in list(self.gm.graph.nodes):
            if self.linear(node) and not self.linear(_only_reader(node)):
                self.rewrite(node)
        drop_unread_constants(self.gm, self.constants)

    def linear(self, node: Any) -> bool:
        """Whether a node adds or subtracts two tensors (no ``alpha``) or weighs one by a factor."""
        if short_name(node) in ("add", "sub") and len(node.args) == 2 and not node.kwargs:
            return all(self.computed(a) for a in node.args)
        return self.weighed(node) is not None

    def weighed(self, node: Any) -> tuple[fx.Node, Factor] | None:
        """The tensor a node multiplies or divides by a number, or multiplies by a constant per channel (shaped
        (C, 1, 1) or (1, C, 1, 1), C its channels), where the result has its shape and dtype, and the factor;
        else None."""
        numbered = scalar_multiple(node, _NUMBERS)
        if numbered is None and (short_name(node) != "mul" or len(node.args) != 2 or node.kwargs):
            return None
        tensor, factor = numbered or (node.args if self.computed(node.args[0]) else reversed(node.args))
        shape = full_shape(tensor)
        if not self.computed(tensor) or shape is None or len(shape) != 4 or full_shape(node) != shape or \
                dtype_of(node) != dtype_of(tensor):
            return None
        if numbered is not None:
            return numbered
        value = constant_value(self.gm, factor, self.values) if isinstance(factor, fx.Node) and \
            factor in self.constants else None
        if isinstance(value, torch.Tensor) and value.dtype == dtype_of(tensor) and \
                tuple(value.shape) in ((shape[1], 1, 1), (1, shape[1], 1, 1)) and bool(value.isfinite().all()):
            return tensor, value.detach().reshape(-1).to(torch.float64)
        return None

    def computed(self, node: Any) -> bool:
        """Whether an argument is a tensor computed from the model's input (not a number, not a constant)."""
        return isinstance(node, fx.Node) and node not in self.constants

    def rewrite(self, root: fx.Node) -> None:
        """Rewrite the linear combination ``root`` as one conv plus its other terms, where its branches make one."""
        terms, linear = self.terms(root)
        found = _branches_on_one_input(self.gm, root, terms)
        if found is None:
            return
        source, branches, nodes, rest = found
        summed = summed_conv(branches, full_shape(source)[2:], full_shape(root)[2:])  # type: ignore[arg-type,index]
        if summed is None:
            return
        near = next(str(n.target) for n in nodes if module_of(self.gm, n, nn.Conv2d) is not None)
        with self.gm.graph.inserting_before(root):
            total = self.gm.graph.call_module(add_module(self.gm, near, summed), (source,))
            total.meta = dict(root.meta)
            for term, sign in rest:
                total = self.gm.graph.call_function(operator.add if sign == 1 else operator.sub, (total, term))
                total.meta = dict(root.meta)
        root.replace_all_uses_with(total)
        doomed = {root, *linear, *nodes}
        for node in reversed(list(self.gm.graph.nodes)):
            if node in doomed and not node.users:
                self.gm.graph.erase_node(node)

    def terms(self, root: fx.Node) -> tuple[list[Term], list[fx.Node]]:
        """The terms a linear combination adds up, with their factors, through the sums and weighings that only the
        next one reads, and those nodes."""
        terms, linear, todo = list[Term](), [root], list[Term]([(root, 1.0)])
        while todo:
            node, factor = todo.pop()
            weighed = self.weighed(node)
            if weighed is not None:
                parts = [(weighed[0], factor * weighed[1])]
            else:
                first, second = arg_nodes(node.args)
                parts = [(first, factor), (second, -factor if short_name(node) == "sub" else factor)]
                if first is second:
                    terms.extend(parts)
                    continue
            for arg, part in parts:
                if self.linear(arg) and _only_reader(arg) is node:
                    linear.append(arg)
                    todo.append((arg, part))
                else:
                    terms.append((arg, part))
        return terms, linear


def branches_as_one_conv(gm: fx.GraphModule) -> fx.GraphModule:
    """Where a linear combination of tensors (adds and subtractions of two tensors, multiplies by a number or by a
    constant per channel, each inner one read by the next alone) adds up branches on one 4-D input (convs on it,
    each with the eval-mode batch-norm after it or none, the input itself, a batch-norm of it), each read by the
    combination alone, at least two of them and one a conv, or one conv weighed per channel, and its other terms
    each with factor 1 or -1, those branches become one conv (a new ``nn.Conv2d`` registered in ``gm``) wherever
    :func:`~ios_ray.frontend.weights.summed_conv` can make one; the other terms are added to its output."""
    _Pass(gm).run()
    return gm


def _only_reader(node: Any) -> fx.Node | None:
    """The one node that uses ``node`` (for anything, its size included), or None."""
    return next(iter(node.users)) if isinstance(node, fx.Node) and len(node.users) == 1 else None


def _branches_on_one_input(gm: fx.GraphModule, root: fx.Node, terms: list[Term]
                           ) -> tuple[fx.Node, list[Branch], list[fx.Node], list[tuple[fx.Node, float]]] | None:
    """The input most of a combination's conv branches read, those of its terms that are branches on it (and their
    nodes), and the rest with their signs; None where the branches are fewer than two or none is a conv (unless one
    conv weighed per channel), or another term's factor is not 1 or -1."""
    best = None
    for source in dict.fromkeys(arg_node(n) for n in _conv_nodes(gm, terms)):
        found = [(term, factor, _branch(gm, term, source, root)) for term, factor in terms]
        branches = [(b[0], factor, b[1]) for _, factor, b in found if b is not None]
        rest = [(term, factor) for term, factor, b in found if b is None]
        convs = [factor for b, factor, _ in branches if b.conv is not None]
        worth = bool(convs) and (len(branches) >= 2 or isinstance(convs[0], torch.Tensor))
        if worth and all(not isinstance(f, torch.Tensor) and f in (1.0, -1.0) for _, f in rest) and \
                (best is None or len(branches) > len(best[1])):
            best = (source, [Branch(b.conv, b.bn, factor) for b, factor, _ in branches],
                    [n for _, _, nodes in branches for n in nodes], [(t, float(f)) for t, f in rest])
    return best


def _conv_nodes(gm: fx.GraphModule, terms: list[Term]) -> list[fx.Node]:
    """The conv calls on one tensor among the terms, or before the batch-norm that a term is."""
    found = []
    for term, _ in terms:
        normed = _normed(gm, term)
        node = normed[1] if normed is not None else term
        if module_of(gm, node, nn.Conv2d) is not None and len(node.args) == 1 and isinstance(node.args[0], fx.Node):
            found.append(node)
    return found


def _normed(gm: fx.GraphModule, node: fx.Node) -> tuple[nn.BatchNorm2d, fx.Node] | None:
    """The eval-mode batch-norm that ``node`` calls and the tensor it reads, where it is one and reads a tensor."""
    bn = eval_batch_norm(gm, node)
    source = node.args[0] if bn is not None and node.args else None
    return (bn, source) if bn is not None and isinstance(source, fx.Node) else None


def _branch(gm: fx.GraphModule, term: fx.Node, source: fx.Node, root: fx.Node
            ) -> tuple[Branch, list[fx.Node]] | None:
    """The branch on ``source`` that a term of the combination ``root`` is, with its nodes, or None where it is none:
    each node read by the next alone, the term of the combination's shape and dtype."""
    if full_shape(term) != full_shape(root) or dtype_of(term) != dtype_of(root) or dtype_of(root) is None:
        return None
    if term is source:
        return Branch(None), []
    if _only_reader(term) is None:
        return None
    bn, node = _normed(gm, term) or (None, None)
    if node is source:
        return Branch(None, bn), [term]
    node = node if node is not None and _only_reader(node) is term else term
    conv = module_of(gm, node, nn.Conv2d)
    if conv is None or node.args != (source,) or node.kwargs:
        return None
    return Branch(conv, bn), [term] if node is term else [term, node]

