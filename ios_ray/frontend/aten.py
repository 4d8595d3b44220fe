"""ATen ops as the torch calls they stand for, so a graph captured by torch.export reads as a traced one does.

torch.export records what a model computes as ATen ops (``aten.conv2d``, ``aten.relu_``, ``aten.slice``); the
frontend's rules read torch's Python spelling (``F.conv2d``, ``F.relu(x, inplace=True)``, ``x[:, a:b]``).
:func:`as_torch_call` gives, for one ATen op and its arguments, the torch call that computes the same values
(:class:`Call`), :data:`IDENTITY` where the op returns its input or a view of all of it, :data:`DROP` where it only
checks what the capture already proved (``_assert_scalar``), or None: the op then stays as it is, callable as
``torch.ops.aten.<name>.<overload>``.

Contract: every rewrite computes exactly what the ATen op computes. Where an argument makes them differ (an
``alpha`` other than 1, a ``rounding_mode``, an output ``dtype``) there is no rewrite. Arguments are bound by the
op's own schema (names and defaults), so an op written with keywords or defaults reads the same.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F

#: A slice end at or beyond this means "to the end" (torch.export writes 2**63 - 1).
_TO_THE_END = 2 ** 62


@dataclass(frozen=True)
class Call:
    """A torch-level fx call: ``op`` is ``call_function`` or ``call_method``."""

    op: str
    target: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Marker:
    """What an ATen op becomes when it becomes no call (:data:`IDENTITY`, :data:`DROP`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: The op returns its first argument, or a view of all of it.
IDENTITY = Marker("IDENTITY")
#: The op computes nothing anything reads: a runtime check of sizes the capture proved.
DROP = Marker("DROP")

Arguments = Mapping[str, Any]
Rewrite = Callable[[Arguments, int], "Call | Marker | None"]


def as_torch_call(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], rank: int) -> Call | Marker | None:
    """The torch call computing what ATen op ``target`` computes on ``args`` and ``kwargs``, a :class:`Marker`, or
    None where it stays an ATen op (``rank``: the dimensions of its first argument, 0 where that is no tensor)."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target.overloadpacket.__name__
    if name in _DROPPED:
        return DROP
    rewrite = _REWRITES.get(name)
    bound = bind(target, args, kwargs) if rewrite is not None else None
    return None if bound is None else rewrite(bound, rank)  # type: ignore[misc]


def bind(target: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """An ATen call's arguments by their schema names, defaults filled in; None where they do not fit the schema."""
    schema = target._schema.arguments
    if len(args) > len(schema) or not set(kwargs) <= {a.name for a in schema}:
        return None
    bound: dict[str, Any] = {}
    for position, argument in enumerate(schema):
        if position < len(args):
            bound[argument.name] = args[position]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
        else:
            return None
    return bound


def is_in_place(target: Any) -> bool:
    """Whether an ATen op writes into its first argument (``relu_``, ``copy_``, ``add_``)."""
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.arguments:
        return False
    alias = target._schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def is_view(target: Any) -> bool:
    """Whether an ATen op returns a view of its first argument (``slice``, ``view``, ``permute``)."""
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.returns:
        return False
    alias = target._schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def _function(function: Any, *names: str, **keywords: str) -> Rewrite:
    """``function(<names>..., <keyword>=<name>...)`` from the bound ATen arguments (None for an overload that lacks
    one of them)."""
    def rewrite(a: Arguments, rank: int) -> Call | None:
        if not all(n in a for n in (*names, *keywords.values())):
            return None
        return Call("call_function", function, tuple(a[n] for n in names), {k: a[n] for k, n in keywords.items()})
    return rewrite


def _method(method: str, *names: str) -> Rewrite:
    """``<first>.method(<names>...)``: the bound ATen arguments in order (None for an overload that lacks one)."""
    def rewrite(a: Arguments, rank: int) -> Call | None:
        return Call("call_method", method, tuple(a[n] for n in names), {}) if all(n in a for n in names) else None
    return rewrite


def _in_place(function: Any, *names: str) -> Rewrite:
    """An in-place activation as ``function(..., inplace=True)`` (the frontend then makes it out-of-place)."""
    return lambda a, rank: Call("call_function", function, tuple(a[n] for n in names), {"inplace": True})


def _arithmetic(function: Any) -> Rewrite:
    """``self <op> other`` as ``operator.<op>``, where ``alpha`` is 1 and there is no ``rounding_mode``."""
    def rewrite(a: Arguments, rank: int) -> Call | None:
        if a.get("alpha", 1) != 1 or a.get("rounding_mode") is not None:
            return None
        return Call("call_function", function, (a["self"], a["other"]), {})
    return rewrite


def _slice(a: Arguments, rank: int) -> Call | Marker | None:
    """``aten.slice(x, dim, start, end, step)`` as ``x[:, ..., start:end:step]``; one that keeps all is the input."""
    if not rank or not isinstance(a["dim"], int):
        return None
    start = None if a["start"] in (None, 0) else a["start"]
    end = None if isinstance(a["end"], int) and a["end"] >= _TO_THE_END else a["end"]
    step = None if a["step"] == 1 else a["step"]
    if start is None and end is None and step is None:
        return IDENTITY
    index = (slice(None),) * (a["dim"] % rank) + (slice(start, end, step),)
    return Call("call_function", operator.getitem, (a["self"], index), {})


def _select(a: Arguments, rank: int) -> Call | None:
    """``aten.select(x, dim, i)`` as ``x[:, ..., i]``."""
    if not rank or not isinstance(a["dim"], int):
        return None
    return Call("call_function", operator.getitem, (a["self"], (slice(None),) * (a["dim"] % rank) + (a["index"],)),
                {})


def _pool(function: Any, *names: str) -> Rewrite:
    """A pool: ATen writes "stride as the kernel" as an empty stride, torch as None."""
    def rewrite(a: Arguments, rank: int) -> Call:
        values = [a[n] if n != "stride" or a[n] else None for n in names]
        return Call("call_function", function, tuple(values), {})
    return rewrite


def _without_dtype(function: Any, *names: str) -> Rewrite:
    """A call that has an output ``dtype`` in ATen: only without one."""
    base = _function(function, *names)
    return lambda a, rank: None if a.get("dtype") is not None else base(a, rank)


def _shape_method(method: str) -> Rewrite:
    """``x.view(*size)`` / ``x.reshape(*size)``, as code usually spells them (not ``view(dtype)``)."""
    def rewrite(a: Arguments, rank: int) -> Call | None:
        size = a.get("size", a.get("shape"))
        return Call("call_method", method, (a["self"], *size), {}) if isinstance(size, (list, tuple)) else None
    return rewrite


def _elu(a: Arguments, rank: int) -> Call | None:
    """``aten.elu(x, alpha, scale, input_scale)`` as ``F.elu`` where both scales are 1."""
    if a["scale"] != 1 or a["input_scale"] != 1:
        return None
    return Call("call_function", F.elu, (a["self"], a["alpha"]), {})


def _pad(a: Arguments, rank: int) -> Call:
    """``aten.constant_pad_nd`` / ``aten.pad`` as ``F.pad``."""
    keywords = {"mode": a["mode"]} if a.get("mode", "constant") != "constant" else {}
    value = a.get("value")
    if value not in (None, 0, 0.0):
        keywords["value"] = value
    return Call("call_function", F.pad, (a["self"], list(a["pad"])), keywords)


def _batch_norm(a: Arguments, rank: int) -> Call:
    """``aten.batch_norm`` as ``F.batch_norm`` (which takes the statistics before the affine parameters)."""
    return Call("call_function", F.batch_norm, (a["input"], a["running_mean"], a["running_var"], a["weight"],
                                                a["bias"], a["training"], a["momentum"], a["eps"]), {})


def _instance_norm(a: Arguments, rank: int) -> Call:
    """``aten.instance_norm`` as ``F.instance_norm``."""
    return Call("call_function", F.instance_norm, (a["input"], a["running_mean"], a["running_var"], a["weight"],
                                                   a["bias"], a["use_input_stats"], a["momentum"], a["eps"]), {})


def _upsample(mode: str) -> Rewrite:
    """``aten.upsample_<mode>2d.vec`` as ``F.interpolate`` at the same output size or scale factors."""
    def rewrite(a: Arguments, rank: int) -> Call | None:
        keywords: dict[str, Any] = {"mode": mode}
        if a.get("output_size") is not None:
            keywords["size"] = list(a["output_size"])
        elif a.get("scale_factors") is not None:
            keywords.update(scale_factor=list(a["scale_factors"]), recompute_scale_factor=False)
        else:
            return None
        if "align_corners" in a:
            keywords["align_corners"] = a["align_corners"]
        return Call("call_function", F.interpolate, (a["input"],), keywords)
    return rewrite


def _dropout(a: Arguments, rank: int) -> Marker | None:
    """Dropout of any kind outside training returns its input."""
    return None if a["train"] else IDENTITY


_REWRITES: dict[str, Rewrite] = {
    "conv2d": _function(F.conv2d, "input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    "conv_transpose2d": _function(F.conv_transpose2d, "input", "weight", "bias", "stride", "padding",
                                  "output_padding", "groups", "dilation"),
    "batch_norm": _batch_norm,
    "instance_norm": _instance_norm,
    "group_norm": _function(F.group_norm, "input", "num_groups", "weight", "bias", "eps"),
    "layer_norm": _function(F.layer_norm, "input", "normalized_shape", "weight", "bias", "eps"),
    "linear": _function(F.linear, "input", "weight", "bias"),
    "relu": _function(F.relu, "self"),
    "relu_": _in_place(F.relu, "self"),
    "relu6": _function(F.relu6, "self"),
    "silu": _function(F.silu, "self"),
    "silu_": _in_place(F.silu, "self"),
    "sigmoid": _function(torch.sigmoid, "self"),
    "sigmoid_": _function(torch.sigmoid_, "self"),
    "tanh": _function(torch.tanh, "self"),
    "tanh_": _function(torch.tanh_, "self"),
    "hardswish": _function(F.hardswish, "self"),
    "hardswish_": _in_place(F.hardswish, "self"),
    "hardsigmoid": _function(F.hardsigmoid, "self"),
    "hardsigmoid_": _in_place(F.hardsigmoid, "self"),
    "hardtanh": _function(F.hardtanh, "self", "min_val", "max_val"),
    "hardtanh_": _in_place(F.hardtanh, "self", "min_val", "max_val"),
    "leaky_relu": _function(F.leaky_relu, "self", "negative_slope"),
    "leaky_relu_": _in_place(F.leaky_relu, "self", "negative_slope"),
    "gelu": _function(F.gelu, "self", approximate="approximate"),
    "elu": _elu,
    "mish": _function(F.mish, "self"),
    "mish_": _in_place(F.mish, "self"),
    "softplus": _function(F.softplus, "self", "beta", "threshold"),
    "prelu": _function(F.prelu, "self", "weight"),
    "add": _arithmetic(operator.add),
    "add_": _arithmetic(operator.iadd),
    "sub": _arithmetic(operator.sub),
    "sub_": _arithmetic(operator.isub),
    "mul": _arithmetic(operator.mul),
    "mul_": _arithmetic(operator.imul),
    "div": _arithmetic(operator.truediv),
    "div_": _arithmetic(operator.itruediv),
    "neg": _function(torch.neg, "self"),
    "abs": _function(torch.abs, "self"),
    "exp": _function(torch.exp, "self"),
    "sqrt": _function(torch.sqrt, "self"),
    "rsqrt": _function(torch.rsqrt, "self"),
    "square": _function(torch.square, "self"),
    "clamp": _function(torch.clamp, "self", "min", "max"),
    "clamp_min": _function(torch.clamp_min, "self", "min"),
    "clamp_max": _function(torch.clamp_max, "self", "max"),
    "pow": _function(torch.pow, "self", "exponent"),
    "cat": _function(torch.cat, "tensors", "dim"),
    "view": _shape_method("view"),
    "reshape": _shape_method("reshape"),
    "_unsafe_view": _shape_method("reshape"),
    "flatten": _function(torch.flatten, "self", "start_dim", "end_dim"),
    "slice": _slice,
    "select": _select,
    "narrow": _method("narrow", "self", "dim", "start", "length"),
    "chunk": _function(torch.chunk, "self", "chunks", "dim"),
    "split": _function(torch.split, "self", "split_size", "dim"),
    "split_with_sizes": _function(torch.split, "self", "split_sizes", "dim"),
    "mean": _without_dtype(torch.mean, "self", "dim", "keepdim"),
    "sum": _without_dtype(torch.sum, "self", "dim", "keepdim"),
    "max_pool2d": _pool(F.max_pool2d, "self", "kernel_size", "stride", "padding", "dilation", "ceil_mode"),
    "avg_pool2d": _pool(F.avg_pool2d, "self", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                        "divisor_override"),
    "adaptive_avg_pool2d": _function(F.adaptive_avg_pool2d, "self", "output_size"),
    "upsample_nearest2d": _upsample("nearest"),
    "upsample_bilinear2d": _upsample("bilinear"),
    "permute": _method("permute", "self", "dims"),
    "transpose": _method("transpose", "self", "dim0", "dim1"),
    "alias": lambda a, rank: IDENTITY,
    "dropout": _dropout,
    "dropout_": _dropout,
    "feature_dropout": _dropout,
    "alpha_dropout": _dropout,
    "feature_alpha_dropout": _dropout,
    "constant_pad_nd": _pad,
    "pad": _pad,
    "softmax": _without_dtype(F.softmax, "self", "dim"),
    "sym_size": lambda a, rank: Call("call_method", "size", (a["self"], a["dim"]), {}) if "dim" in a else None,
    "channel_shuffle": _function(torch.channel_shuffle, "self", "groups"),
    "native_channel_shuffle": _function(torch.channel_shuffle, "self", "groups"),
    "pixel_shuffle": _function(F.pixel_shuffle, "self", "upscale_factor"),
    "matmul": _function(torch.matmul, "self", "other"),
}

#: Runtime checks of sizes that the capture proved for every batch size it allows.
_DROPPED = {"_assert_scalar", "_assert_tensor_metadata", "sym_constrain_range_for_size", "sym_constrain_range",
            "_assert_async"}
