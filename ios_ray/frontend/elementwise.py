"""Single-input elementwise ops ("steps"), and the chains of them that become a unit's epilogue.

A step is an op on one input tensor that keeps its shape and works element by element (or channel by channel):

* an activation, in any spelling (:mod:`~ios_ray.frontend.activations`);
* an eval-mode batch-norm (a per-channel affine map);
* arithmetic with a number or a constant tensor: a layer scale ``gamma * x``, ``x + 3``, ``x / 6``;
* one of a few unary functions: ``clamp``, ``neg``, ``abs``, ``exp``, ``sqrt``, ``pow``...

Its text, which enters unit attributes and so stage keys, is the activation's canonical text, ``batch_norm``, or
the op with its arguments, the input written ``x`` and a constant tensor ``const(shape)``: ``mul(x, const(96, 1,
1))``. :func:`elementwise_chain` follows a unit's output through steps while each is the only reader of the last.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ios_ray.frontend.activations import activation_of
from ios_ray.frontend.match import Scope
from ios_ray.frontend.nodes import eval_batch_norm, full_shape, only_user

_ARITHMETIC: dict[Any, str] = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    torch.add: "add", torch.sub: "sub", torch.mul: "mul", torch.div: "div",
}
_ARITHMETIC_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}
_UNARY = ("neg", "abs", "exp", "sqrt", "rsqrt", "square", "clamp", "clip", "clamp_min", "clamp_max", "pow")
_UNARY_FUNCTIONS = {getattr(torch, name): name for name in _UNARY if hasattr(torch, name)}
_COMMUTATIVE = ("add", "mul")


def elementwise_step(gm: fx.GraphModule, node: Any, source: fx.Node, constants: set[fx.Node]) -> str | None:
    """The text of ``node`` as a step on ``source`` (its only input that is not a constant), or None."""
    if not isinstance(node, fx.Node) or full_shape(node) is None or full_shape(node) != full_shape(source):
        return None
    if [n for n in node.all_input_nodes if n not in constants] != [source]:
        return None
    activation = activation_of(gm, node)
    if activation is not None:
        return activation
    if eval_batch_norm(gm, node) is not None and node.args == (source,) and not node.kwargs:
        return "batch_norm"
    name = _op_name(node)
    return None if name is None else _describe(name, node, source)


def elementwise_chain(scope: Scope, tail: fx.Node) -> list[tuple[fx.Node, str]]:
    """The steps after ``tail``, each the only reader of the one before it (and none claimed by another unit)."""
    chain: list[tuple[fx.Node, str]] = []
    node = tail
    while True:
        user = only_user(node)
        step = elementwise_step(scope.gm, user, node, scope.constants) if scope.free(user) else None
        if step is None:
            return chain
        chain.append((user, step))  # type: ignore[arg-type]
        node = user  # type: ignore[assignment]


def _op_name(node: fx.Node) -> str | None:
    """The short name of an arithmetic or unary op, or None where the node is not one."""
    if node.op == "call_method":
        target = str(node.target)
        return _ARITHMETIC_METHODS.get(target) or (target if target in _UNARY else None)
    if node.op == "call_function":
        for table in (_ARITHMETIC, _UNARY_FUNCTIONS):
            for function, name in table.items():
                if node.target is function:
                    return name
    return None


def _describe(name: str, node: fx.Node, source: fx.Node) -> str:
    """``name(args)`` with the input as ``x`` and constant tensors by shape; commutative ops put ``x`` first."""
    def show(arg: Any) -> str:
        if arg is source:
            return "x"
        if isinstance(arg, fx.Node):
            return f"const{full_shape(arg) or ()}"
        return repr(arg)

    args = [show(a) for a in node.args]
    if name in _COMMUTATIVE:
        args.sort(key=lambda text: text != "x")
    args += [f"{k}={show(v)}" for k, v in sorted(node.kwargs.items())]
    return f"{name}({', '.join(args)})"
