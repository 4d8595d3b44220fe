"""Tracing a module with torch.fx, and running the traced graph once to learn its shapes and its size values.

:func:`trace` keeps a submodule that torch.fx cannot trace through (its forward branches on a tensor's values or
sizes, as timm's ``Conv2dSame`` does) as one call of that submodule, which the import makes an opaque unit; only a
failure in the top module's own code fails. Options of ``forward`` after the input are traced at their defaults.
:func:`propagate` runs the graph on the example input: every tensor node gets its ``tensor_meta`` (shape, dtype),
as with torch.fx's ``ShapeProp``, and every other node (a size, a shape, a flag) its Python ``value``, which
:mod:`~ios_ray.frontend.sizes` folds into literals.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from ios_ray.errors import ImportRefused, first_line
from ios_ray.frontend.nodes import batch_first, constant_nodes, hooked
from ios_ray.frontend.quiet import this_thread_silent


class _LeafFallbackTracer(fx.Tracer):
    """An fx tracer that turns a submodule it cannot trace through into a call of that submodule (a leaf).

    The nodes the failed attempt added are removed again, except the parameter reads (``get_attr``) that fx caches
    and may hand out later; those left unused are removed at the end (:meth:`drop_unused_reads`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.leaves: list[str] = []
        self._attempted: list[fx.Node] = []

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """A submodule it could not trace through, or a torch layer without forward hooks (those are traced through,
        so that the hooks' code stays in the graph)."""
        return module_qualified_name in self.leaves or (super().is_leaf_module(m, module_qualified_name)
                                                        and not hooked(m))

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        path = self.path_of_module(m)
        before, stack, calls = len(self.graph.nodes), self.module_stack.copy(), dict(self.num_calls)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:  # noqa: BLE001 - whatever stops tracing inside a submodule makes it a leaf
            if not path:
                raise
        self.module_stack.clear()  # fx pops its scope bookkeeping only on success
        self.module_stack.update(stack)
        self.num_calls.clear()
        self.num_calls.update(calls)
        for node in reversed(list(self.graph.nodes)[before:]):
            if node.op == "get_attr":
                self._attempted.append(node)
            elif not node.users:
                self.graph.erase_node(node)
        self.leaves.append(path)
        return super().call_module(m, forward, args, kwargs)

    def drop_unused_reads(self) -> None:
        """Remove the parameter reads of failed attempts that nothing else reads."""
        for node in self._attempted:
            if not node.users:
                self.graph.erase_node(node)


def trace(module: nn.Module) -> fx.GraphModule:
    """Symbolically trace a module, keeping submodules fx cannot trace through as calls; a failure in the module's
    own ``forward`` raises UserError. Parameters of ``forward`` after the input that have defaults
    (``return_features=False``, ``mask=None``) are traced at their defaults, as a call with the input alone runs."""
    tracer = _LeafFallbackTracer()
    defaults = defaulted_arguments(module)
    try:
        graph = tracer.trace(module, concrete_args=defaults or None)
    except Exception as exc:  # noqa: BLE001 - fx raises many kinds; all become one sentence
        raise ImportRefused(f"torch.fx cannot trace the forward of {type(module).__name__} ({first_line(exc)}); move "
                            "the code it stops at into a submodule, which then runs as one opaque unit.") from exc
    tracer.drop_unused_reads()
    gm = fx.GraphModule(tracer.root, graph)
    return drop_specialized_arguments(gm) if defaults else gm


def defaulted_arguments(module: nn.Module) -> dict[str, Any]:
    """The parameters of ``module.forward`` after its first that have a default, with their defaults; UserError
    where one has none (the model takes more than one input)."""
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a signature Python can read
        return {}
    after = [p for p in parameters[1:] if p.kind in _NAMED]
    required = [p for p in after if p.default is inspect.Parameter.empty]
    if required:
        names = ", ".join(p.name for p in parameters[:1] + after)
        raise ImportRefused(f"{type(module).__name__} takes {len(required) + 1} inputs ({names}); ios-ray imports "
                            "models that take one (options after it may have defaults): wrap it to take the input "
                            "alone.")
    return {p.name: p.default for p in after}


_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def drop_specialized_arguments(gm: fx.GraphModule) -> fx.GraphModule:
    """Remove the placeholders torch.fx keeps for arguments traced at a fixed value, and the checks it adds that
    they keep it (``torch._assert(arg == value)``, ``_assert_is_none(arg)``): the imported model takes its input
    alone."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"][1:]
    for placeholder in placeholders:
        for user in list(placeholder.users):
            for check in list(user.users) if user.target is operator.eq else []:
                if check.target is torch._assert:
                    gm.graph.erase_node(check)
            if (user.target is operator.eq and not user.users) or \
                    getattr(user.target, "__name__", "") == "_assert_is_none":
                gm.graph.erase_node(user)
        if not placeholder.users:
            gm.graph.erase_node(placeholder)
    gm.recompile()
    return gm


class _ValueProp(ShapeProp):
    """ShapeProp that also keeps the value of every node whose result holds no tensor (``node.meta['value']``)."""

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if "tensor_meta" not in n.meta:
            n.meta["value"] = result
        return result


def propagate(gm: fx.GraphModule, example_input: torch.Tensor, name: str) -> None:
    """Run ``gm`` on the example input, recording shapes and size values in the nodes' meta."""
    with torch.no_grad(), this_thread_silent():  # ShapeProp prints a traceback on failure
        try:
            _ValueProp(gm).propagate(example_input)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's forward is reported in one line
            cause = exc.__cause__ or exc  # ShapeProp wraps the model's own error
            raise ImportRefused(f"running {name} on an input of shape {tuple(example_input.shape)} failed: "
                                f"{type(cause).__name__}: {first_line(cause)}") from cause


def record_batch_layout(gm: fx.GraphModule, example_input: torch.Tensor) -> None:
    """Run ``gm`` once more at another batch size and record, on every tensor node computed from the input, which
    dimensions grow with the batch (``meta['batch_dims']``) and its size per sample (``meta['sample_shape']``, None
    where a size does not grow in proportion). A tuple holding such a tensor, or nested, is marked with None for
    both. A model that cannot run at another batch size records nothing: its dimension 0 then stands for the batch,
    as it does in most models. A graph of ops that all keep each sample in its own row of dimension 0 (convs, pools,
    norms, activations, elementwise arithmetic, concatenations and means over other dimensions) is not run again."""
    if all(_keeps_rows(gm, node) for node in gm.graph.nodes):
        return
    batch = example_input.shape[0]
    other = 2 if batch == 1 else 1
    results: dict[fx.Node, Any] = {}

    class _Shapes(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            if isinstance(result, (torch.Tensor, tuple, list)):
                results[n] = _shapes(result)
            return result

    x = example_input[:1].expand(other, *example_input.shape[1:]).clone()
    try:
        with torch.no_grad(), this_thread_silent():
            _Shapes(gm).run(x)
    except Exception:  # noqa: BLE001 - a model that runs at its import batch size only
        return
    constants = constant_nodes(gm.graph)
    for node, sizes in results.items():
        if node in constants or "tensor_meta" not in node.meta:
            continue
        imported = _shapes_of(node.meta["tensor_meta"])
        if isinstance(sizes, tuple):
            node.meta["batch_dims"], node.meta["sample_shape"] = _layout(imported, sizes, batch, other)
        elif not _plain_items(imported, sizes, batch, other):
            node.meta["batch_dims"] = node.meta["sample_shape"] = None


#: The files of ``torch.nn.modules`` whose layers keep the batch in dimension 0 (as the only dimension that grows).
_ROW_WISE_MODULES = {"conv", "batchnorm", "pooling", "linear", "dropout", "normalization", "padding", "upsampling",
                     "pixelshuffle", "channelshuffle", "activation"}
#: Functions and methods, by name, that keep the batch in dimension 0 whatever their arguments.
_ROW_WISE_CALLS = {
    "add", "sub", "mul", "truediv", "neg", "relu", "relu6", "sigmoid", "tanh", "gelu", "silu", "hardswish",
    "hardsigmoid", "leaky_relu", "hardtanh", "elu", "mish", "softplus", "clamp", "clamp_min", "clamp_max", "abs", "exp",
    "sqrt", "pow", "contiguous", "clone", "conv2d", "batch_norm", "layer_norm", "group_norm", "max_pool2d",
    "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d", "dropout", "interpolate", "linear", "softmax", "size",
    "dim", "numel",
}
#: Those that do where the dimension they work along (argument 1, or the keyword) is not dimension 0, and the
#: dimension they take when none is given (None: all of them).
_ROW_WISE_ALONG = {"cat": 0, "concat": 0, "chunk": 0, "split": 0, "mean": None, "sum": None, "amax": None,
                   "flatten": 0}
_SIZE_ATTRIBUTES = ("shape", "ndim", "dtype", "device", "is_cuda")


def _keeps_rows(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether a node surely keeps the batch in dimension 0 of what it computes (False where unsure)."""
    if node.op in ("placeholder", "output", "get_attr") or "tensor_meta" not in node.meta:
        return True  # sizes, flags and asserts hold no batch
    if node.op == "call_module":
        kind = type(gm.get_submodule(str(node.target)))
        path = kind.__module__.split(".")
        return path[:3] == ["torch", "nn", "modules"] and path[-1] in _ROW_WISE_MODULES and \
            kind is not nn.MultiheadAttention
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    source = node.args[0] if node.args else None
    source = source[0] if isinstance(source, (list, tuple)) and source else source
    meta: Any = source.meta.get("tensor_meta") if isinstance(source, fx.Node) else None
    if name == "getattr":
        return node.args[1] in _SIZE_ATTRIBUTES
    if name == "getitem":  # an item of a tuple (of sizes, or of chunks), not of a tensor
        return not hasattr(meta, "shape")
    if name == "pad":  # pads the last len(pad) / 2 dimensions
        pad = node.args[1] if len(node.args) > 1 else node.kwargs.get("pad")
        return hasattr(meta, "shape") and isinstance(pad, (tuple, list)) and len(pad) < 2 * len(meta.shape)
    if name in _ROW_WISE_ALONG:
        dim = node.kwargs.get("dim", node.kwargs.get("start_dim", node.args[1] if len(node.args) > 1 else
                                                     _ROW_WISE_ALONG[name]))
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        rank = len(meta.shape) if hasattr(meta, "shape") else 0
        return rank > 0 and all(isinstance(d, int) and d % rank != 0 for d in dims)
    return name in _ROW_WISE_CALLS


def _plain_items(imported: Any, sizes: Any, batch: int, other: int) -> bool:
    """Whether a tuple is flat and every tensor in it holds the batch in dimension 0, one sample per batch entry."""
    if not isinstance(imported, list) or not isinstance(sizes, list) or len(imported) != len(sizes):
        return False
    return all(batch_first(*_layout(a, b, batch, other)) for a, b in zip(imported, sizes))


def _shapes(value: Any) -> Any:
    """A tensor's shape as a tuple; a flat tuple of tensors as a list of shapes; None for anything else."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return [tuple(v.shape) for v in value]
    return None


def _shapes_of(meta: Any) -> Any:
    """What :func:`_shapes` gives, from ShapeProp's ``tensor_meta``."""
    if hasattr(meta, "shape"):
        return tuple(meta.shape)
    if isinstance(meta, (tuple, list)) and all(hasattr(m, "shape") for m in meta):
        return [tuple(m.shape) for m in meta]
    return None


def _layout(imported: Any, sizes: Any, batch: int, other: int
            ) -> tuple[tuple[bool, ...] | None, tuple[int, ...] | None]:
    """Which dimensions grow with the batch, and the size per sample (None where a size grows out of proportion),
    from a tensor's shapes at the import batch size and at the other; (None, None) where they are not both shapes."""
    if not isinstance(imported, tuple) or not isinstance(sizes, tuple) or len(imported) != len(sizes):
        return None, None
    dims = tuple(a != b for a, b in zip(imported, sizes))
    if any(grows and (a * other != b * batch or a % batch) for a, b, grows in zip(imported, sizes, dims)):
        return dims, None
    return dims, tuple(a // batch if grows else a for a, grows in zip(imported, dims))
