"""The conv pattern: [batch-norm] [activation] conv [pointwise conv] [batch-norm] [activation], as one unit.

* A conv with the batch-norm it alone feeds (folded into its weights) and the activation after it.
* A depthwise conv whose only reader is a 1x1 conv is one ``sepconv`` unit with it.
* Pre-activation: an activation only this conv reads is its ``pre_act``; an eval batch-norm only that activation
  (or the conv itself) reads is its prologue (``pre_norm``): DenseNet's BN -> ReLU -> conv is one unit.
* A multiply by a number (NF-ResNet's ``x * beta`` before its convs and ``x * alpha`` after them): after the conv
  (and its batch-norm) ``out_scale``, before it (after its pre-activation) ``in_scale``, where the conv alone reads
  it; both scale the folded weights (and ``out_scale`` the bias), so no pass over the tensor remains and the residual
  sum after an ``out_scale`` is the conv's too.
* A residual sum: where the conv's (or its batch-norm's) only reader adds a tensor that its own input was computed
  from (ResNet's ``relu(bn3(conv3(...)) + identity)``), the sum and the activation after it are the conv's too
  (``residual``; its second input), so a fused kernel adds it inside the convolution. A sum of a tensor the conv's
  input does not come from (a downsampling branch's conv) stays a unit of its own: the conv would otherwise wait
  for that branch, which the schedule may run beside it.

The attributes ``act`` and ``pre_act`` hold canonical activation texts (None where there is none; ``act`` comes after
the residual sum where there is one); ``pre_norm`` and ``residual`` appear only where there is a prologue batch-norm
or a residual sum, and ``in_scale`` and ``out_scale`` (numbers) only where there is a multiply, so convs without them
keep the stage keys they always had.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx
from torch import nn

from ios_ray.frontend.activations import activation_of
from ios_ray.frontend.elementwise import scalar_multiple, short_name
from ios_ray.frontend.match import Match, Scope
from ios_ray.frontend.nodes import (ancestors, arg_node, dtype_of, eval_batch_norm, full_shape, is_tensor,
                                    module_of, only_user)


def match_conv(scope: Scope, node: fx.Node) -> Match | None:
    """The conv unit that ``node`` (a Conv2d call) is the main op of, or None."""
    gm = scope.gm
    conv = module_of(gm, node, nn.Conv2d)
    if conv is None or conv.padding_mode != "zeros" or isinstance(conv.padding, str) or \
            len(node.args) != 1 or not isinstance(node.args[0], fx.Node):
        return None
    kind, nodes, refs = _conv_body(gm, node, conv)
    source, prologue, pre_act, pre_bn, in_scale = _prologue(scope, node, scalable=kind == "conv")
    out_scale = _out_scale(scope, nodes[-1]) if kind == "conv" else None
    if out_scale is not None:
        nodes.append(only_user(nodes[-1]))  # type: ignore[arg-type]  # the multiply
    residual = residual_of(scope, nodes[-1], source) if kind == "conv" else None
    if residual is not None:
        nodes.append(only_user(nodes[-1]))  # type: ignore[arg-type]  # the sum
    act_node = only_user(nodes[-1])
    act = activation_of(gm, act_node) if scope.free(act_node) else None
    if act is not None and act_node is not None:
        nodes.append(act_node)
    out_conv = gm.get_submodule(refs["pointwise"]) if kind == "sepconv" else conv
    attrs: dict[str, Any] = {
        "in_channels": conv.in_channels, "out_channels": out_conv.out_channels,
        "kernel": tuple(conv.kernel_size), "stride": tuple(conv.stride), "padding": tuple(conv.padding),
        "dilation": tuple(conv.dilation), "groups": conv.groups, "bias": conv.bias is not None or "bn" in refs,
        "act": act, "pre_act": pre_act,
    }
    if pre_bn is not None:
        attrs["pre_norm"] = True
        refs["pre_bn"] = pre_bn
    if residual is not None:
        attrs["residual"] = True
    attrs.update({key: value for key, value in (("in_scale", in_scale), ("out_scale", out_scale)) if value is not None})
    inputs = [source] + ([residual] if residual is not None else [])
    return Match(kind, refs["id"], inputs, nodes[-1], nodes[-1], prologue + nodes, attrs, refs)


def residual_of(scope: Scope, out: fx.Node, unit_input: fx.Node) -> fx.Node | None:
    """The tensor that the only reader of ``out`` (a unit's output: a conv's, a scaling's) adds to it, where that
    reader is a plain sum of two tensors of one shape and dtype and the tensor is one ``unit_input`` was computed from
    (so the unit waits for nothing new); else None."""
    add = only_user(out)
    if add is None or not scope.free(add) or short_name(add) != "add" or len(add.args) != 2 or add.kwargs:
        return None
    other = add.args[1] if add.args[0] is out else add.args[0]
    if other is out or not is_tensor(other) or other in scope.constants or other.op == "get_attr" \
            or full_shape(other) != full_shape(out) or full_shape(add) != full_shape(out) \
            or dtype_of(other) != dtype_of(out):
        return None
    return other if other in ancestors([unit_input]) else None


def _conv_body(gm: fx.GraphModule, node: fx.Node, conv: nn.Conv2d) -> tuple[str, list[fx.Node], dict[str, Any]]:
    """The conv, the pointwise conv of a separable pair, and the batch-norm after them."""
    nodes, refs, kind = [node], {"id": str(node.target), "conv": str(node.target)}, "conv"
    pointwise_node = only_user(node)
    pointwise = module_of(gm, pointwise_node, nn.Conv2d)
    depthwise = conv.groups == conv.in_channels == conv.out_channels and conv.groups > 1
    if depthwise and pointwise_node is not None and pointwise is not None and pointwise.kernel_size == (1, 1) \
            and pointwise.groups == 1 and pointwise.stride == (1, 1) and pointwise.padding == (0, 0) \
            and pointwise.padding_mode == "zeros":
        kind = "sepconv"
        nodes.append(pointwise_node)
        refs = {"id": str(node.target), "depthwise": str(node.target), "pointwise": str(pointwise_node.target)}
    bn_node = only_user(nodes[-1])
    if bn_node is not None and eval_batch_norm(gm, bn_node) is not None:
        nodes.append(bn_node)
        refs["bn"] = str(bn_node.target)
    return kind, nodes, refs


def _prologue(scope: Scope, conv_node: fx.Node, scalable: bool
              ) -> tuple[fx.Node, list[fx.Node], str | None, str | None, float | None]:
    """The batch-norm, activation and multiply by a number (where ``scalable``) before a conv that only it reads:
    (the unit's input, nodes, pre_act, batch-norm path, in_scale)."""
    gm, nodes, pre_act, in_scale = scope.gm, list[fx.Node](), None, None
    x = arg_node(conv_node)
    scaled = scalar_multiple(x) if scalable and _only_for(x, scope) else None
    if scaled is not None and scaled[0] not in scope.constants and scaled[0].op != "get_attr":
        nodes.insert(0, x)
        x, in_scale = scaled
    if _only_for(x, scope) and (text := activation_of(gm, x)) is not None and _reads_a_tensor(x):
        pre_act = text
        nodes.insert(0, x)
        x = arg_node(x)
    if _only_for(x, scope) and eval_batch_norm(gm, x) is not None and _reads_a_tensor(x):
        nodes.insert(0, x)
        return arg_node(x), nodes, pre_act, str(x.target), in_scale
    return x, nodes, pre_act, None, in_scale


def _out_scale(scope: Scope, out: fx.Node) -> float | None:
    """The number the only reader of ``out`` (a conv's output) multiplies it by, where it is one (and unclaimed)."""
    reader = only_user(out)
    scaled = scalar_multiple(reader) if scope.free(reader) else None
    return scaled[1] if scaled is not None and scaled[0] is out else None


def _only_for(node: Any, scope: Scope) -> bool:
    """A node read by one node only and not part of another unit."""
    return scope.free(node) and only_user(node) is not None


def _reads_a_tensor(node: fx.Node) -> bool:
    """Whether a node's first argument is a computed tensor (not a parameter)."""
    return isinstance(node.args[0], fx.Node) and node.args[0].op != "get_attr"
