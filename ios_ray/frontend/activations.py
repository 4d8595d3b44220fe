"""The activation vocabulary: recognising an activation in an fx graph in any spelling, and running it by name.

An activation is written as a module (``nn.ReLU()``), a function (``F.relu(x, inplace=True)``, ``torch.relu``) or
a tensor method (``x.relu()``); all of them get one canonical text, which is what unit attributes (and so stage
keys) hold: the name where its parameters have their defaults, else the name with the parameters, e.g.
``leaky_relu(0.2)`` or ``gelu('tanh')``. ``hardtanh(0.0, 6.0)`` is ``relu6``. :func:`activation_fn` turns a text
back into the torch function (the runtime applies activations folded into convs with it).
"""

from __future__ import annotations

import ast
import functools
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ios_ray.frontend.nodes import hashable, normalized_kwargs

#: Activation name -> (torch function, its parameters with their defaults, in order).
ACTIVATIONS: dict[str, tuple[Callable[..., torch.Tensor], tuple[tuple[str, Any], ...]]] = {
    "relu": (F.relu, ()),
    "relu6": (F.relu6, ()),
    "leaky_relu": (F.leaky_relu, (("negative_slope", 0.01),)),
    "hardtanh": (F.hardtanh, (("min_val", -1.0), ("max_val", 1.0))),
    "hardswish": (F.hardswish, ()),
    "hardsigmoid": (F.hardsigmoid, ()),
    "silu": (F.silu, ()),
    "sigmoid": (torch.sigmoid, ()),
    "gelu": (F.gelu, (("approximate", "none"),)),
    "tanh": (torch.tanh, ()),
    "mish": (F.mish, ()),
    "elu": (F.elu, (("alpha", 1.0),)),
    "softplus": (F.softplus, (("beta", 1.0), ("threshold", 20.0))),
}

_MODULES: dict[type, str] = {
    nn.ReLU: "relu", nn.ReLU6: "relu6", nn.LeakyReLU: "leaky_relu", nn.Hardtanh: "hardtanh",
    nn.Hardswish: "hardswish", nn.Hardsigmoid: "hardsigmoid", nn.SiLU: "silu", nn.Sigmoid: "sigmoid",
    nn.GELU: "gelu", nn.Tanh: "tanh", nn.Mish: "mish", nn.ELU: "elu", nn.Softplus: "softplus",
}
_FUNCTIONS: dict[Any, str] = {
    F.relu: "relu", torch.relu: "relu", F.relu6: "relu6", F.leaky_relu: "leaky_relu", F.hardtanh: "hardtanh",
    F.hardswish: "hardswish", F.hardsigmoid: "hardsigmoid", F.silu: "silu", torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid", F.gelu: "gelu", torch.tanh: "tanh", F.tanh: "tanh", F.mish: "mish", F.elu: "elu",
    F.softplus: "softplus",
}
_METHODS: dict[str, str] = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}
#: Arguments of an activation call that do not change what it computes.
_IGNORED = ("input", "inplace")


def activation_of(gm: fx.GraphModule, node: Any) -> str | None:
    """The canonical text of ``node`` if it is an activation of its first argument (and of nothing else), else None."""
    if not isinstance(node, fx.Node) or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        name = _MODULES.get(type(module))
        if name is None or len(node.args) != 1 or node.kwargs:
            return None
        return activation_text(name, [getattr(module, p) for p, _ in ACTIVATIONS[name][1]])
    if node.op == "call_method" and node.target in _METHODS:
        return _METHODS[str(node.target)] if len(node.args) == 1 and not node.kwargs else None
    if node.op == "call_function" and hashable(node.target) and node.target in _FUNCTIONS:
        return _function_activation(gm, node, _FUNCTIONS[node.target])
    return None


def activation_text(name: str, values: list[Any]) -> str:
    """The canonical text of activation ``name`` with these parameter values (in the order of ACTIVATIONS)."""
    params = ACTIVATIONS[name][1]
    values = [float(v) if isinstance(d, float) else v for (_, d), v in zip(params, values)]
    if name == "hardtanh" and values == [0.0, 6.0]:
        return "relu6"
    if all(v == d for (_, d), v in zip(params, values)):
        return name
    return f"{name}({', '.join(repr(v) for v in values)})"


@functools.lru_cache(maxsize=None)
def activation_fn(text: str | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The torch function of an activation's canonical text (None is the identity)."""
    if text is None:
        return _identity
    name, values = activation_parts(text)
    fn, params = ACTIVATIONS[name]
    if "(" not in text:
        return fn
    return functools.partial(fn, **{p: v for (p, _), v in zip(params, values)})


def is_activation(text: str) -> bool:
    """Whether a step's text (an epilogue's, say) is an activation's canonical text."""
    return text.partition("(")[0] in ACTIVATIONS


def activation_parts(text: str) -> tuple[str, tuple[Any, ...]]:
    """An activation's canonical text as its name and the value of each of its parameters, defaults filled in:
    ``leaky_relu(0.2)`` is ``("leaky_relu", (0.2,))``, ``gelu`` is ``("gelu", ("none",))``."""
    name, _, rest = text.partition("(")
    if rest:
        return name, ast.literal_eval(f"({rest[:-1]},)")
    return name, tuple(default for _, default in ACTIVATIONS[name][1])


def _function_activation(gm: fx.GraphModule, node: fx.Node, name: str) -> str | None:
    """The text of a functional activation, from its normalised arguments (defaults filled in)."""
    params = ACTIVATIONS[name][1]
    if not params:
        return name if len(node.args) == 1 and set(node.kwargs) <= set(_IGNORED) else None
    kwargs = normalized_kwargs(gm, node)
    if kwargs is None or kwargs.get("input") is not node.args[0]:
        return None
    extra = set(kwargs) - set(_IGNORED) - {p for p, _ in params}
    values = [kwargs.get(p, d) for p, d in params]
    if extra or any(isinstance(v, fx.Node) for v in values):
        return None
    return activation_text(name, values)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x
