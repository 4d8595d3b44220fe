"""Single-input shape-keeping ops ("steps"), and the chains of them that become a unit's epilogue.

A step is an op on one input tensor that keeps its shape and reads nothing else computed from the input: it works
element by element, channel by channel, or over groups of channels of one sample:

* an activation, in any spelling (:mod:`~ios_ray.frontend.activations`), and PReLU (``nn.PReLU``, ``F.prelu``);
* an eval-mode batch-norm of any rank (a per-channel affine map);
* a group or instance norm (``nn.GroupNorm``, ``nn.InstanceNorm2d``, ``F.group_norm``, ``F.instance_norm``), as
  decoders follow their convs with (the statistics are over one sample);
* arithmetic with a number or a constant tensor: a layer scale ``gamma * x``, ``x + 3``, ``x / 6``;
* one of a few unary functions: ``clamp``, ``neg``, ``abs``, ``exp``, ``sqrt``, ``pow``...

Its text, which enters unit attributes and so stage keys, is the activation's canonical text, ``batch_norm``, or
the op with its arguments, the input written ``x`` and a constant tensor ``const(shape)``: ``mul(x, const(96, 1,
1))``, ``group_norm(x, 8, const(64,), const(64,), 1e-05)`` (a layer's call reads as its functional form does). :func:`elementwise_chain` follows a unit's output through steps
while each is the only reader of the last.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ios_ray.frontend.activations import activation_of
from ios_ray.frontend.match import Scope
from ios_ray.frontend.nodes import call_arguments, full_shape, module_of, only_user

_ARITHMETIC: dict[Any, str] = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    torch.add: "add", torch.sub: "sub", torch.mul: "mul", torch.div: "div",
}
_ARITHMETIC_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}
_UNARY = ("neg", "abs", "exp", "sqrt", "rsqrt", "square", "clamp", "clip", "clamp_min", "clamp_max", "pow")
_UNARY_FUNCTIONS = {getattr(torch, name): name for name in _UNARY if hasattr(torch, name)}
#: Functional steps that read constant weights besides their input (by name).
_NORM_FUNCTIONS = {F.prelu: "prelu", F.group_norm: "group_norm", F.instance_norm: "instance_norm"}
_COMMUTATIVE = ("add", "mul")
#: The magnitudes of the numbers a conv's weights absorb a multiply by (:func:`scalar_multiple`): NF-ResNet's and
#: Inception-ResNet's are 0.1 to 1.8. Near these, weights folded in float16 stay as far from its smallest normal
#: numbers and from its largest as the model's own weights (a number much smaller or larger stays a step).
FOLDED_SCALES = (2.0 ** -4, 2.0 ** 4)


def elementwise_step(gm: fx.GraphModule, node: Any, source: fx.Node, constants: set[fx.Node]) -> str | None:
    """The text of ``node`` as a step on ``source`` (its only input that is not a constant), or None."""
    if not isinstance(node, fx.Node) or full_shape(node) is None or full_shape(node) != full_shape(source):
        return None
    if [n for n in node.all_input_nodes if n not in constants] != [source]:
        return None
    activation = activation_of(gm, node)
    if activation is not None:
        return activation
    layer = _layer_step(gm, node)
    if layer is not None:
        return layer if node.args == (source,) and not node.kwargs else None
    name = short_name(node)
    arguments = call_arguments(node) if name in _NORM_FUNCTIONS.values() else None
    if name is not None and arguments is not None:  # written with keywords or not: in the order of the signature
        return _describe(name, tuple(arguments.values()), {}, source)
    return None if name is None else _describe(name, node.args, node.kwargs, source)


def _layer_step(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """The text of a call of a torch layer that is a step: an eval batch-norm, PReLU, a group or instance norm."""
    if module_of(gm, node, nn.modules.batchnorm._BatchNorm) is not None:
        bn = gm.get_submodule(str(node.target))
        return "batch_norm" if not bn.training and bn.running_mean is not None else None
    if (prelu := module_of(gm, node, nn.PReLU)) is not None:  # the texts F.prelu and F.group_norm get
        return f"prelu(x, const{tuple(prelu.weight.shape)})"
    if (norm := module_of(gm, node, nn.GroupNorm)) is not None:
        weights = f"const{tuple(norm.weight.shape)}, const{tuple(norm.bias.shape)}" if norm.affine else "None, None"
        return f"group_norm(x, {norm.num_groups}, {weights}, {norm.eps!r})"
    if (instance := module_of(gm, node, nn.modules.instancenorm._InstanceNorm)) is not None:
        uses_input = instance.training or not instance.track_running_stats
        return f"instance_norm({instance.eps})" if uses_input else "batch_norm"
    return None


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


def scalar_multiple(node: Any, within: tuple[float, float] = FOLDED_SCALES) -> tuple[fx.Node, float] | None:
    """The tensor a node multiplies by a number and the number (``x * c``, ``c * x``, ``x.mul(c)``, ``x / c`` as
    ``1 / c``), where the number's magnitude is ``within`` these bounds (:data:`FOLDED_SCALES` unless told); else
    None."""
    if not isinstance(node, fx.Node) or node.kwargs or len(node.args) != 2 or short_name(node) not in ("mul", "div"):
        return None
    tensor, number = node.args
    if not isinstance(tensor, fx.Node) and short_name(node) == "mul":
        tensor, number = number, tensor
    if not isinstance(tensor, fx.Node) or isinstance(number, bool) or not isinstance(number, (int, float)) \
            or not within[0] <= abs(number) <= within[1]:
        return None
    return tensor, float(number) if short_name(node) == "mul" else 1.0 / number


def short_name(node: Any) -> str | None:
    """The short name of an arithmetic (``add``, ``sub``, ``mul``, ``div``: function, operator or method) or unary
    op, or None where the node is not one."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_method":
        target = str(node.target)
        return _ARITHMETIC_METHODS.get(target) or (target if target in _UNARY else None)
    if node.op == "call_function":
        for table in (_ARITHMETIC, _UNARY_FUNCTIONS, _NORM_FUNCTIONS):
            for function, name in table.items():
                if node.target is function:
                    return name
    return None


def _describe(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], source: fx.Node) -> str:
    """``name(args)`` with the input as ``x`` and constant tensors by shape; commutative ops put ``x`` first."""
    def show(arg: Any) -> str:
        if arg is source:
            return "x"
        if isinstance(arg, fx.Node):
            return f"const{full_shape(arg) or ()}"
        return repr(arg)

    texts = [show(a) for a in args]
    if name in _COMMUTATIVE:
        texts.sort(key=lambda text: text != "x")
    texts += [f"{k}={show(v)}" for k, v in sorted(kwargs.items())]
    return f"{name}({', '.join(texts)})"
