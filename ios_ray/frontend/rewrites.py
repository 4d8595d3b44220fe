"""Rewrites of the traced fx graph that normalise how code is spelled, before anything is grouped into units.

Each pass is a function ``GraphModule -> GraphModule`` that edits the graph in place and returns it; the graph is
checked and its Python code generated once for all of them, by the import's last pass
(:func:`~ios_ray.frontend.sizes.fold_sizes`):

* :func:`functionalize`: in-place ops (``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``, ``x.add_(y)``,
  ``x.relu_()``) become their out-of-place forms, and whatever reads the mutated tensor after the op reads the op's
  result instead: the values eager mode computes, without units that overwrite each other's inputs. (A mutation
  through a view of another tensor is not followed.)
* :func:`drop_eval_identities`: what is the identity in eval mode vanishes: dropout of every kind, ``nn.Identity``,
  stochastic depth (torchvision's ``stochastic_depth`` and timm's ``drop_path`` with ``training=False``),
  ``contiguous``, and a multiply by 1 that keeps its input's dtype and shape.
* :func:`views_as_reshapes`: ``x.view(shape)`` becomes ``x.reshape(shape)`` (the same values; it also holds
  where a dropped ``contiguous`` made the input non-contiguous).
* :func:`batch_norms_as_modules` (needs shapes): an eval ``F.batch_norm`` on parameters (timm's ``BatchNormAct2d``
  traces to one) becomes a call of an ``nn.BatchNorm2d`` on the same tensors, so it folds like the module does.
* :func:`functional_convs_as_modules`: ``F.conv2d`` on a weight computed from parameters alone (``self.weight``,
  timm's weight-standardised ``StdConv2d``/``ScaledStdConv2d`` in BiT and NFNet models) becomes a call of an
  ``nn.Conv2d`` holding that weight, evaluated once at import, so it folds and merges like any conv.
* :func:`functional_linears_as_modules`: ``F.linear`` on a weight computed from parameters alone (a ``nn.Linear``
  subclass whose ``forward`` calls it, a linear in a graph torch.compile hands over) becomes a call of an
  ``nn.Linear``, a linear unit.
* :func:`linears_before_batch_moves` (needs shapes): a linear layer on a transpose or permute that moves the batch
  out of dimension 0 and keeps the last dimension last (``nn.MultiheadAttention`` as torch.export decomposes it:
  ``in_proj(x.transpose(1, 0))``) runs before it instead, on the batch-first tensor: the same values (a linear layer
  acts on each row of the last dimension alone), computed once by a linear unit, where it would otherwise be computed
  again inside every unit that reads the moved tensor (the query's, the key's and the value's).
* :func:`same_padding_as_torch_layers` (needs shapes): timm's TensorFlow-"SAME" layers (``Conv2dSame``,
  ``MaxPool2dSame``, ``AvgPool2dSame``; their ``forward`` branches on the input's size, so tracing keeps them whole)
  and convs with ``padding="same"`` or ``"valid"`` become the plain torch layer, a conv or pool unit, padded as
  "SAME" pads the traced size: by the layer itself where the padding is even on both sides, else by an ``F.pad``
  before it.
* :func:`padding_modes_as_pads`: a conv padded by reflection, replication or circularly (``padding_mode=``) becomes
  ``F.pad`` in that mode, a pad unit, and the conv without padding, a conv unit like any other.

Modules are never changed in place: a module that must change is copied into the GraphModule under a new name, so
the user's model stays as it was.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ios_ray.frontend.elementwise import scalar_multiple, short_name
from ios_ray.frontend.writes import out_of_place_target, writes_in_place
from ios_ray.frontend.nodes import (arg_node, call_arguments, constant_nodes, dimension_order, dtype_of,
                                   evaluate_constant, full_shape, holds_batch_first, module_of, pair)

_DROPOUT_FUNCTIONS = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
                      torch.dropout, torch.alpha_dropout, torch.feature_alpha_dropout, torch.feature_dropout)
#: Stochastic depth functions by name (torchvision wraps its own for torch.fx), and their parameters.
_STOCHASTIC_DEPTH = {"stochastic_depth": "p", "drop_path": "drop_prob"}


def functionalize(gm: fx.GraphModule) -> fx.GraphModule:
    """In-place ops become out-of-place; later readers of a mutated tensor read the op's result instead."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        if _make_out_of_place(gm, node) and node.args and isinstance(node.args[0], fx.Node):
            mutated = node.args[0]
            for user in list(mutated.users):
                if order[user] > order[node]:
                    user.replace_input_with(mutated, node)
    return gm


def _make_out_of_place(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Turn one in-place op into its out-of-place form (:func:`~ios_ray.frontend.writes.out_of_place_target`); True
    where it was one and has one."""
    target = out_of_place_target(gm, node) if writes_in_place(gm, node) else None
    if target is None:
        return False
    if node.op == "call_module":
        layer: Any = copy.copy(gm.get_submodule(str(node.target)))  # a layer of any class with an ``inplace`` flag
        layer.inplace = False
        node.target = add_module(gm, str(node.target), layer)
    elif node.kwargs.get("inplace") is True:
        node.kwargs = {**node.kwargs, "inplace": False}
    elif target is node.target:  # the ``inplace`` argument given by position
        node.args, node.kwargs = (), {**(call_arguments(node) or {}), "inplace": False}
    else:
        node.target = target
    return True


def drop_eval_identities(gm: fx.GraphModule) -> fx.GraphModule:
    """Dropout, ``nn.Identity``, eval-mode stochastic depth, ``contiguous``, and a multiply by 1 or an add of 0 that
    keeps its input's dtype and shape (NF-ResNet's first ``x * beta``, MobileOne's ``out += 0`` for a missing
    branch) are removed from the graph."""
    for node in list(gm.graph.nodes):
        if (unchanged := _unchanged(node)) is not None:
            node.replace_all_uses_with(unchanged)
            gm.graph.erase_node(node)
        elif _is_eval_identity(gm, node):
            source = node.args[0] if node.args else node.kwargs.get("input")
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
    return gm


def _unchanged(node: fx.Node) -> fx.Node | None:
    """The tensor a node multiplies by 1 or adds 0 to (or subtracts 0 from), where the result has that tensor's
    dtype and shape; else None."""
    scaled = scalar_multiple(node)
    source = scaled[0] if scaled is not None and scaled[1] == 1.0 else _plus_zero(node)
    if source is None or dtype_of(source) != dtype_of(node) or dtype_of(node) is None:
        return None
    return source if full_shape(source) == full_shape(node) else None


def _plus_zero(node: fx.Node) -> fx.Node | None:
    """The tensor in ``x + 0``, ``0 + x`` or ``x - 0`` (the number an int or float), or None."""
    if short_name(node) not in ("add", "sub") or len(node.args) != 2 or node.kwargs:
        return None
    tensor, number = node.args
    if not isinstance(tensor, fx.Node) and short_name(node) == "add":
        tensor, number = number, tensor
    zero = isinstance(number, (int, float)) and not isinstance(number, bool) and number == 0
    return tensor if isinstance(tensor, fx.Node) and zero else None


def _is_eval_identity(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return isinstance(module, nn.Identity) or (isinstance(module, nn.modules.dropout._DropoutNd)
                                                   and not module.training)
    if node.op == "call_method":
        return node.target == "contiguous"
    source = node.args[0] if node.args else node.kwargs.get("input")
    if node.op != "call_function" or not isinstance(source, fx.Node):
        return False
    dropout = any(node.target is f for f in _DROPOUT_FUNCTIONS)
    probability = _STOCHASTIC_DEPTH.get(getattr(node.target, "__name__", ""))
    arguments = call_arguments(node) if dropout or probability is not None else None
    if arguments is None:
        return False
    if dropout:
        return arguments.get("training", arguments.get("train")) is False or arguments.get("p") == 0
    return arguments.get("training") is False or (probability is not None and arguments.get(probability) == 0)


def views_as_reshapes(gm: fx.GraphModule) -> fx.GraphModule:
    """``x.view(...)`` to a shape becomes ``x.reshape(...)``; a view to a dtype stays."""
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target == "view" and \
                not any(isinstance(a, torch.dtype) for a in (*node.args[1:], *node.kwargs.values())):
            node.target = "reshape"
    return gm


def batch_norms_as_modules(gm: fx.GraphModule) -> fx.GraphModule:
    """Eval-mode ``F.batch_norm`` on a 4-d input with parameters and statistics becomes an ``nn.BatchNorm2d`` call."""
    for node in list(gm.graph.nodes):
        module = _batch_norm_module(gm, node)
        if module is None:
            continue
        owner = str(node.args[1].target).rpartition(".")[0] or "batch_norm"
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(add_module(gm, owner, module), (node.args[0],))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        inputs = node.all_input_nodes
        gm.graph.erase_node(node)
        for attr in inputs:
            if attr.op == "get_attr" and not attr.users:
                gm.graph.erase_node(attr)
    return gm


def _batch_norm_module(gm: fx.GraphModule, node: fx.Node) -> nn.BatchNorm2d | None:
    """The BatchNorm2d an eval ``F.batch_norm`` node computes, sharing its tensors; None where it is not one."""
    if node.op != "call_function" or node.target is not F.batch_norm:
        return None
    arguments = call_arguments(node)
    shape = full_shape(node.args[0]) if node.args else None
    if arguments is None or arguments["training"] is not False or shape is None or len(shape) != 4:
        return None
    tensors = [arguments[k] for k in ("running_mean", "running_var", "weight", "bias")]
    if not all(isinstance(t, fx.Node) and t.op == "get_attr" for t in tensors[:2]) or \
            not all(t is None or (isinstance(t, fx.Node) and t.op == "get_attr") for t in tensors[2:]) or \
            (tensors[2] is None) != (tensors[3] is None):
        return None
    mean, var = (_attr(gm, str(t.target)) for t in tensors[:2])
    weight, bias = (None if t is None else _attr(gm, str(t.target)) for t in tensors[2:])
    module = nn.BatchNorm2d(shape[1], eps=float(arguments["eps"]), affine=weight is not None).eval()
    module.running_mean, module.running_var = mean, var
    if weight is not None and bias is not None:
        module.weight = _parameter(weight)
        module.bias = _parameter(bias)
    return module.to(mean.device)


_CONV2D_PARAMETERS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_LINEAR_PARAMETERS = ("input", "weight", "bias")
_CONV2D_DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def functional_convs_as_modules(gm: fx.GraphModule) -> fx.GraphModule:
    """``F.conv2d(x, weight, bias, ...)`` on a computed input, with a weight and bias computed from parameters alone,
    becomes a call of a new ``nn.Conv2d`` holding their values (evaluated once, here); the nodes that computed
    them go away where nothing else reads them."""
    constants, values = constant_nodes(gm.graph), dict[str, Any]()
    for node in list(gm.graph.nodes):
        arguments = _conv2d_arguments(node)
        if arguments is None or arguments["input"] in constants or \
                any(t is not None and t not in constants for t in (arguments["weight"], arguments["bias"])):
            continue
        with torch.no_grad():
            weight, bias = (None if t is None else constant_value(gm, t, values)
                            for t in (arguments["weight"], arguments["bias"]))
        if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
            continue
        conv = nn.Conv2d(weight.shape[1] * arguments["groups"], weight.shape[0], (weight.shape[2], weight.shape[3]),
                         arguments["stride"], arguments["padding"], arguments["dilation"], arguments["groups"],
                         bias is not None, device=weight.device, dtype=weight.dtype).eval()
        conv.weight = _parameter(weight.detach().clone())
        if bias is not None:
            conv.bias = _parameter(bias.detach().clone())
        _replace_with_module(gm, node, arguments["input"], _owner(arguments["weight"]), conv)
    drop_unread_constants(gm, constants)
    return gm


def functional_linears_as_modules(gm: fx.GraphModule) -> fx.GraphModule:
    """``F.linear(x, weight, bias)`` on a computed input, with a 2-d weight and a bias computed from parameters alone
    (a ``nn.Linear`` subclass whose ``forward`` calls ``F.linear``, Hugging Face's layers; a linear in a graph that
    torch.compile hands over), becomes a call of a new ``nn.Linear`` holding their values (evaluated once, here), so
    that it is a linear unit as a ``nn.Linear`` call is."""
    constants, values = constant_nodes(gm.graph), dict[str, Any]()
    for node in list(gm.graph.nodes):
        arguments = _arguments(node, F.linear, _LINEAR_PARAMETERS, {"bias": None})
        if arguments is None or not isinstance(arguments.get("input"), fx.Node) or arguments["input"] in constants \
                or not isinstance(arguments.get("weight"), fx.Node) or \
                any(t is not None and t not in constants for t in (arguments["weight"], arguments.get("bias"))):
            continue
        with torch.no_grad():
            weight, bias = (None if t is None else constant_value(gm, t, values)
                            for t in (arguments["weight"], arguments.get("bias")))
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or \
                (bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != weight.shape[:1])):
            continue
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias is not None, device=weight.device,
                           dtype=weight.dtype).eval()
        linear.weight = _parameter(weight.detach().clone())
        if bias is not None:
            linear.bias = _parameter(bias.detach().clone())
        _replace_with_module(gm, node, arguments["input"], _owner(arguments["weight"], "linear"), linear)
    drop_unread_constants(gm, constants)
    return gm


def linears_before_batch_moves(gm: fx.GraphModule) -> fx.GraphModule:
    """``linear(x.transpose(...))``, where ``x`` holds the batch in dimension 0 and the transpose or permute moves it
    elsewhere but keeps the last dimension last, becomes ``linear(x).transpose(...)``."""
    for node in list(gm.graph.nodes):
        moved = node.args[0] if node.op == "call_module" and len(node.args) == 1 and not node.kwargs else None
        if not isinstance(moved, fx.Node) or module_of(gm, node, nn.Linear) is None:
            continue
        order = _batch_move(moved)
        if order is None:
            continue
        source = arg_node(moved)
        with gm.graph.inserting_before(node):
            linear = gm.graph.call_module(str(node.target), (source,))
            permuted = gm.graph.call_method("permute", (linear, list(order)))
        sizes = (*(full_shape(source) or ())[:-1], (full_shape(node) or ())[-1])
        example = torch.empty(sizes, dtype=node.meta["tensor_meta"].dtype, device="meta")
        linear.meta = {key: value for key, value in node.meta.items() if key != "val"}
        linear.meta.update(tensor_meta=_extract_tensor_metadata(example), batch_dims=source.meta["batch_dims"],
                           sample_shape=(*source.meta["sample_shape"][:-1], sizes[-1]))
        permuted.meta = dict(node.meta)
        node.replace_all_uses_with(permuted)
        gm.graph.erase_node(node)
        if not moved.users:
            gm.graph.erase_node(moved)
    return gm


def _batch_move(node: fx.Node) -> tuple[int, ...] | None:
    """The dimension order of a transpose or permute that moves the batch of a batch-first tensor (a node, its first
    argument) out of dimension 0 and keeps the last dimension last; None for any other node."""
    source = node.args[0] if node.args else None
    if node.kwargs or not isinstance(source, fx.Node) or not holds_batch_first(source) or holds_batch_first(node):
        return None
    order = dimension_order(node)
    return order if order is not None and order[0] != 0 and order[-1] == len(order) - 1 else None


def _replace_with_module(gm: fx.GraphModule, node: fx.Node, source: fx.Node, near: str, module: nn.Module) -> None:
    """Replace ``node`` by a call of ``module`` (registered under a name derived from ``near``) on ``source``."""
    with gm.graph.inserting_before(node):
        call = gm.graph.call_module(add_module(gm, near, module), (source,))
    call.meta = dict(node.meta)
    node.replace_all_uses_with(call)
    gm.graph.erase_node(node)


def drop_unread_constants(gm: fx.GraphModule, constants: set[fx.Node]) -> None:
    """Remove the nodes computed from parameters alone that nothing reads any more."""
    for node in reversed(list(gm.graph.nodes)):
        if node in constants and not node.users:
            gm.graph.erase_node(node)


def _conv2d_arguments(node: fx.Node) -> dict[str, Any] | None:
    """A ``F.conv2d`` call's arguments by name, defaults filled in; None for anything else, a string padding other
    than ``"valid"`` and ``"same"`` at stride 1 (what ``nn.Conv2d`` takes), or hyper-parameters that are computed.
    (``call_arguments`` finds no signature on this builtin, and fx's normalisation cannot tell its two overloads
    apart.)"""
    arguments = _arguments(node, F.conv2d, _CONV2D_PARAMETERS, _CONV2D_DEFAULTS)
    if arguments is None:
        return None
    settings = [a for k in ("stride", "padding", "dilation", "groups") for a in _items(arguments[k])]
    padding = arguments["padding"]
    if not isinstance(arguments.get("input"), fx.Node) or not isinstance(arguments.get("weight"), fx.Node) or \
            any(isinstance(a, fx.Node) for a in settings) or \
            (isinstance(padding, str) and not (padding == "valid" or (padding == "same" and
                                                                      set(_items(arguments["stride"])) == {1}))):
        return None
    return arguments


def _arguments(node: fx.Node, function: Any, parameters: tuple[str, ...], defaults: dict[str, Any]
               ) -> dict[str, Any] | None:
    """A call of the builtin ``function``'s arguments by name (its ``parameters``, in order), ``defaults`` filled
    in; None for a call of anything else, or one that passes what the parameters do not name."""
    if node.op != "call_function" or node.target is not function or len(node.args) > len(parameters) or \
            not set(node.kwargs) <= set(parameters):
        return None
    return {**defaults, **dict(zip(parameters, node.args)), **node.kwargs}


def _items(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def constant_value(gm: fx.GraphModule, node: fx.Node, values: dict[str, Any]) -> Any:
    """The value of a node computed from parameters alone (``values`` memoises by name)."""
    if node.name not in values:
        for source in node.all_input_nodes:
            constant_value(gm, source, values)
        values[node.name] = evaluate_constant(gm, node, values)
    return values[node.name]


def _owner(weight: fx.Node, default: str = "conv") -> str:
    """The module path a layer's weight belongs to (the first parameter it is computed from), for naming; ``default``
    where it belongs to none."""
    while weight.op != "get_attr" and weight.all_input_nodes:
        weight = weight.all_input_nodes[0]
    owner = str(weight.target).rpartition(".")[0] if weight.op == "get_attr" else ""
    return owner or default


#: timm's layers that pad as TensorFlow's "SAME" does, by class name: the torch layer each one is, and its pad value.
_PaddingLayer = nn.Conv2d | nn.MaxPool2d | nn.AvgPool2d
_SAME_PADDING: dict[str, tuple[type[_PaddingLayer], float]] = {
    "Conv2dSame": (nn.Conv2d, 0.0), "MaxPool2dSame": (nn.MaxPool2d, -math.inf), "AvgPool2dSame": (nn.AvgPool2d, 0.0),
}


def same_padding_as_torch_layers(gm: fx.GraphModule) -> fx.GraphModule:
    """A call of timm's ``Conv2dSame``, ``MaxPool2dSame`` or ``AvgPool2dSame`` on a 4-d input becomes the plain
    torch layer (a copy of the module as its torch class, sharing its weights) with the padding TensorFlow's "SAME"
    gives that input's size: the layer's own where it is the same on both sides (odd sizes at stride 2, such as
    NASNet's 331x331; timm pads statically where the size does not matter), else ``F.pad`` before it. So does a
    ``nn.Conv2d`` with ``padding="same"`` (at stride 1, which torch requires, torch's "same" is TensorFlow's; an even
    kernel pads one more after) or ``"valid"`` (none)."""
    for node in list(gm.graph.nodes):
        found = _same_padding_layer(gm, node)
        if found is None:
            continue
        plain, value = found
        source: fx.Node = node.args[0]
        valid = getattr(gm.get_submodule(str(node.target)), "padding", None) == "valid"
        pads = (0, 0, 0, 0) if valid else _same_pads(full_shape(source)[2:], plain)  # type: ignore[index]
        if _pads_itself(plain, pads):
            plain.padding = (pads[2], pads[0])
            pads = (0, 0, 0, 0)
        _pad_then_call(gm, node, plain, pads, value=value)
    return gm


def padding_modes_as_pads(gm: fx.GraphModule) -> fx.GraphModule:
    """A call of an ``nn.Conv2d`` with ``padding_mode`` other than zeros becomes ``F.pad`` in that mode (what the
    conv's own forward calls) and a copy of the conv without padding (sharing its weights)."""
    for node in list(gm.graph.nodes):
        conv = module_of(gm, node, nn.Conv2d)
        if conv is None or conv.padding_mode == "zeros" or len(node.args) != 1 or node.kwargs:
            continue
        plain = copy.copy(conv)
        plain.padding, plain.padding_mode = (0, 0), "zeros"
        _pad_then_call(gm, node, plain, tuple(conv._reversed_padding_repeated_twice), mode=conv.padding_mode)
    return gm


def _pad_then_call(gm: fx.GraphModule, node: fx.Node, layer: nn.Module, pads: tuple[int, ...], **options: Any) -> None:
    """Replace ``node``, a call of a layer on one tensor, by ``F.pad(its input, pads, **options)`` (none where every
    pad is 0) and a call of ``layer``, registered on ``gm`` under a new name, on what that gives."""
    source: fx.Node = node.args[0]  # type: ignore[assignment]  # a layer call: its one tensor
    with gm.graph.inserting_before(node):
        if any(pads):
            padded = gm.graph.call_function(F.pad, (source, pads), options)
            shape = full_shape(source)
            if shape is not None:
                example = torch.empty(shape, device="meta")
                padded.meta["tensor_meta"] = _extract_tensor_metadata(F.pad(example, pads, **options))
            source = padded
        call = gm.graph.call_module(add_module(gm, str(node.target), layer), (source,))
    call.meta = dict(node.meta)
    node.replace_all_uses_with(call)
    gm.graph.erase_node(node)


def _same_padding_layer(gm: fx.GraphModule, node: fx.Node) -> tuple[_PaddingLayer, float] | None:
    """For a call of a "SAME" layer on one 4-d tensor: the layer as its plain torch class, and its pad value."""
    if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
        return None
    module = gm.get_submodule(str(node.target))
    torch_class, value = _SAME_PADDING.get(type(module).__name__, (None, 0.0))
    if torch_class is None and module_of(gm, node, nn.Conv2d) is not None and isinstance(module.padding, str) and \
            module.padding_mode == "zeros":
        torch_class = nn.Conv2d
    shape = full_shape(node.args[0])
    if torch_class is None or not isinstance(module, torch_class) or shape is None or len(shape) != 4:
        return None
    plain = copy.copy(module)
    plain.__class__ = torch_class
    if isinstance(plain.padding, str):
        plain.padding = (0, 0)
    return plain, value


def _pads_itself(layer: nn.Module, pads: tuple[int, int, int, int]) -> bool:
    """Whether ``layer``'s own padding can do what ``F.pad`` by ``pads`` would: the same on both sides, and a layer
    that pads as ``F.pad`` would (a conv with zeros, a max pool, an average pool counting the padding; no
    ``ceil_mode``, whose windows differ)."""
    left, right, top, bottom = pads
    if left != right or top != bottom or pair(layer.padding) != (0, 0):
        return False
    if isinstance(layer, nn.Conv2d):
        return layer.padding_mode == "zeros"
    return not layer.ceil_mode and getattr(layer, "count_include_pad", True)


def _same_pads(size: tuple[int, ...], layer: nn.Module) -> tuple[int, int, int, int]:
    """``F.pad``'s (left, right, top, bottom) that TensorFlow's "SAME" gives a layer on an input of ``size`` (H, W):
    the output has ceil(size / stride) positions, the extra row or column going after (timm's ``pad_same``)."""
    kernel = layer.weight.shape[-2:] if isinstance(layer, nn.Conv2d) else pair(layer.kernel_size)
    stride = pair(layer.stride)
    dilation = pair(layer.dilation) if isinstance(layer, nn.Conv2d) else (1, 1)
    totals = [max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
              for n, k, s, d in zip(size, kernel, stride, dilation)]
    (top, height), (left, width) = ((t // 2, t) for t in totals)
    return left, width - left, top, height - top


def _attr(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _parameter(tensor: torch.Tensor) -> nn.Parameter:
    return tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor, requires_grad=False)


def add_module(gm: fx.GraphModule, near: str, module: nn.Module) -> str:
    """Register ``module`` in ``gm`` under a new top-level name derived from ``near``; returns the name."""
    base = near.replace(".", "_") + "_" + type(module).__name__.lower()
    name, n = base, 1
    while hasattr(gm, name):
        name, n = f"{base}_{n}", n + 1
    gm.add_submodule(name, module)
    return name
