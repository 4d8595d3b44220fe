"""Small queries on fx nodes that the frontend's passes share: shapes, modules, users, targets, constants."""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Sequence, TypeGuard, TypeVar, cast

import torch
import torch.fx as fx
from torch import nn
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from torch.nn.modules import module as torch_module

#: Bytes per element of float32 (activation and weight traffic of units).
F32 = 4
#: The functions that concatenate tensors (arithmetic: :func:`~ios_ray.frontend.elementwise.short_name`).
CONCATENATIONS = (torch.cat, torch.concat)


def hashable(target: Any) -> bool:
    """Whether a node's target can be looked up in a dict (fx does not require targets to be hashable)."""
    try:
        hash(target)
    except TypeError:
        return False
    return True


def hooked(module: nn.Module) -> bool:
    """Whether calling ``module`` runs forward hooks or pre-hooks besides its ``forward`` (its own, or global ones)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or torch_module._global_forward_hooks
                or torch_module._global_forward_pre_hooks)


def shape(node: Any) -> tuple[int, ...]:
    """The per-sample shape (batch dimension dropped) of a tensor node; () for anything else."""
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(meta.shape[1:]) if meta is not None and hasattr(meta, "shape") else ()


def full_shape(node: Any) -> tuple[int, ...] | None:
    """The whole shape (batch included) of a tensor node, None for anything else."""
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def dtype_of(node: fx.Node) -> torch.dtype | None:
    """The dtype of a node's tensor, as shape propagation recorded it (None where it did not)."""
    return getattr(node.meta.get("tensor_meta"), "dtype", None)


def pair(value: Any) -> Any:
    """A layer's size argument as a tuple: an int ``k`` as ``(k, k)``, a list as a tuple; None stays None."""
    if value is None:
        return None
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)


def batch_first(dims: tuple[bool, ...] | None, sizes: tuple[int, ...] | None) -> bool:
    """Whether a recorded layout holds the batch exactly in dimension 0: only that dimension grows, one sample
    per batch entry."""
    return dims is not None and len(dims) > 0 and sizes is not None and dims == _dimension_0(len(dims)) \
        and sizes[0] == 1


def _dimension_0(rank: int) -> tuple[bool, ...]:
    return tuple(i == 0 for i in range(rank))


def batch_dims(node: fx.Node) -> tuple[bool, ...]:
    """Which dimensions of a tensor node grow with the batch size: as recorded at import
    (:func:`~ios_ray.frontend.trace.record_batch_layout`), else dimension 0 alone."""
    dims = node.meta.get("batch_dims")
    return dims if dims is not None else _dimension_0(len(full_shape(node) or ()))


def sample_layout(node: fx.Node) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """A tensor node's size per sample in each dimension (the size itself where it does not grow with the batch),
    and which dimensions grow: its shape at batch size b is ``size * b`` where it grows, ``size`` elsewhere."""
    sizes = node.meta.get("sample_shape")
    return (sizes, batch_dims(node)) if sizes is not None else ((1, *shape(node)), batch_dims(node))


def batch_first_meta(example: torch.Tensor) -> dict[str, Any]:
    """The meta of a node a pass adds, computing a tensor like ``example`` (a meta tensor will do) with the batch in
    dimension 0: its shape and dtype, and its batch layout as an import records it."""
    return {"tensor_meta": _extract_tensor_metadata(example), "batch_dims": tuple(i == 0 for i in range(example.dim())),
            "sample_shape": (1, *example.shape[1:])}


def spatial_mean_keepdim(node: Any) -> bool | None:
    """For ``x.mean((2, 3), keepdim=...)`` (or ``torch.mean``) of a 4-d tensor, in its own dtype: its ``keepdim``;
    None for any other node."""
    if not calls(node, (torch.mean,), ("mean",)) or not node.args or len(full_shape(node.args[0]) or ()) != 4:
        return None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if not isinstance(dim, (tuple, list)) or sorted(d % 4 for d in dim) != [2, 3] or node.kwargs.get("dtype") \
            or not isinstance(keepdim, bool):
        return None
    return keepdim


def holds_batch_first(node: fx.Node) -> bool:
    """Whether a tensor node holds the batch exactly in dimension 0, as recorded at import (False where nothing was
    recorded)."""
    return batch_first(node.meta.get("batch_dims"), node.meta.get("sample_shape"))


def is_batch_folded(node: fx.Node) -> bool:
    """A tensor computed from the input whose batch is not exactly its dimension 0: folded into another dimension
    (``x.reshape(B * heads, ...)``), moved, or reduced away. Such a tensor never passes between units."""
    return "batch_dims" in node.meta and not holds_batch_first(node)


def is_tensor(node: Any) -> TypeGuard[fx.Node]:
    """Whether a node computes one tensor."""
    return full_shape(node) is not None


def is_tuple_of_tensors(node: fx.Node) -> bool:
    """Whether a node computes a tuple or list of tensors (``chunk``, ``split``...)."""
    meta = node.meta.get("tensor_meta")
    return isinstance(meta, (tuple, list)) and all(hasattr(m, "shape") for m in meta)


def numel(sizes: tuple[int, ...]) -> int:
    """Number of elements of a shape."""
    return math.prod(sizes)


_M = TypeVar("_M", bound=nn.Module)


def arg_node(node: fx.Node, index: int = 0) -> fx.Node:
    """Argument ``index`` of a node that a pattern matched as reading a node there (fx types arguments as any value)."""
    return cast(fx.Node, node.args[index])


def arg_nodes(args: Any) -> tuple[fx.Node, ...]:
    """Arguments that a pattern checked are all nodes (an add's two, a concat's list), typed as such."""
    return tuple(args)


def module_of(gm: fx.GraphModule, node: Any, kind: type[_M] | tuple[type[_M], ...]) -> _M | None:
    """The module a ``call_module`` node calls, if it is of ``kind`` and computes what torch's own class does (a
    subclass with its own ``forward``, such as timm's ``Conv2dSame``, is called as it is but matched as nothing)."""
    if isinstance(node, fx.Node) and node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if isinstance(module, kind) and type(module).forward.__module__.startswith("torch.nn."):
            return module
    return None


def eval_batch_norm(gm: fx.GraphModule, node: Any) -> nn.BatchNorm2d | None:
    """An eval-mode BatchNorm2d with running statistics (a per-channel affine map) that ``node`` calls, or None."""
    bn = module_of(gm, node, nn.BatchNorm2d)
    if bn is None or bn.training or bn.running_mean is None or bn.running_var is None:
        return None
    return bn


def is_batch_size(node: fx.Node) -> bool:
    """Whether a node is a size computation that depends on the batch size (left by ``sizes.fold_sizes``)."""
    return bool(node.meta.get("batch_size"))


def readers(node: fx.Node) -> list[fx.Node]:
    """The nodes that read ``node``'s value: its users, less those that only take the batch size from it."""
    return [user for user in node.users if not is_batch_size(user)]


def ancestors(nodes: Sequence[fx.Node]) -> set[fx.Node]:
    """``nodes`` and every node they read, directly or not."""
    seen: set[fx.Node] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(node.all_input_nodes)
    return seen


def only_user(node: fx.Node) -> fx.Node | None:
    """The one node that reads ``node``'s value, or None where several or none do."""
    found = readers(node)
    return found[0] if len(found) == 1 else None


def calls(node: Any, functions: tuple[Any, ...] = (), methods: tuple[str, ...] = ()) -> TypeGuard[fx.Node]:
    """Whether a node calls one of these functions or tensor methods."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method":
        return node.target in methods
    return node.op == "call_function" and any(node.target is f for f in functions)


def dimension_order(node: Any) -> tuple[int, ...] | None:
    """The order of its input's dimensions that a ``permute`` or ``transpose`` (``swapaxes``, ``swapdims``) node
    computes, negative dimensions counted from the end (``permute(0, 2, 1)`` and ``transpose(1, -1)`` of a 3-d
    tensor: ``(0, 2, 1)``); None for any other node, or dimensions that are not whole numbers in range."""
    permute = calls(node, (torch.permute,), ("permute",))
    if not permute and not calls(node, (torch.transpose, torch.swapaxes, torch.swapdims),
                                 ("transpose", "swapaxes", "swapdims")):
        return None
    rank, dims = len(full_shape(node) or ()), node.args[1:]
    if permute and len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = tuple(dims[0])
    if rank < 2 or (not permute and len(dims) != 2) or not all(isinstance(d, int) and -rank <= d < rank for d in dims):
        return None
    if not permute:
        first, second = (d % rank for d in dims)
        return tuple(second if i == first else first if i == second else i for i in range(rank))
    order = tuple(d % rank for d in dims)
    return order if sorted(order) == list(range(rank)) else None


def signature_of(target: Any) -> inspect.Signature | None:
    """A function's signature (looked up once per function), or None where Python can read none."""
    return _signature(target) if hashable(target) else _signature.__wrapped__(target)


@functools.lru_cache(maxsize=None)
def _signature(target: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def call_arguments(node: fx.Node) -> dict[str, Any] | None:
    """A ``call_function`` node's arguments by parameter name (defaults filled in), or None where unknown (no
    signature, or one with ``*args`` or ``**kwargs``)."""
    signature = signature_of(node.target)
    if signature is None:
        return None
    try:
        bound = signature.bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values()):
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def normalized_kwargs(gm: fx.GraphModule, node: fx.Node) -> dict[str, Any] | None:
    """A torch function call's arguments all by keyword, defaults filled in (torch.fx's normalisation); None where
    torch.fx cannot tell the overload apart or the target is not a torch function."""
    try:
        normalized = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True)
    except (RuntimeError, TypeError, ValueError):
        return None
    return dict(normalized.kwargs) if normalized is not None else None


def op_name(node: fx.Node, gm: fx.GraphModule) -> str:
    """What a node calls: ``call_module:<class>``, ``call_method:<name>`` or ``call_function:<qualified name>``."""
    if node.op == "call_module":
        return f"call_module:{type(gm.get_submodule(str(node.target))).__name__}"
    target = node.target if isinstance(node.target, str) else qualname(node.target)
    return f"{node.op}:{target}"


def qualname(target: Any) -> str:
    """The qualified name of a function (an ATen op's is ``aten.<name>``)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target.overloadpacket.__name__}"
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__qualname__', getattr(target, '__name__', repr(target)))}".lstrip(".")


def constant_nodes(graph: fx.Graph) -> set[fx.Node]:
    """The nodes that do not depend on the model input: parameters, and what is computed from them alone."""
    found: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr":
            found.add(node)
        elif node.op in ("call_function", "call_method", "call_module") and \
                all(n in found for n in node.all_input_nodes):
            found.add(node)
    return found


def evaluate_constant(gm: fx.GraphModule, node: fx.Node, constants: dict[str, Any]) -> Any:
    """Evaluate a node that does not depend on the model input, its inputs' values in ``constants`` by name."""
    if node.op == "get_attr":
        target: Any = gm
        for part in str(node.target).split("."):
            target = getattr(target, part)
        return target
    args = fx.node.map_arg(node.args, lambda n: constants[n.name])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: constants[n.name])
    if node.op == "call_function":
        return node.target(*args, **kwargs)  # type: ignore[operator]
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    return gm.get_submodule(str(node.target))(*args, **kwargs)
