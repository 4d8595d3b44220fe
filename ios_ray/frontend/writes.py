"""In-place writes: which calls of a torch-level graph write into their first argument, their out-of-place forms, and
the writes that no out-of-place rewrite can make exact, which the import refuses.

torch's in-place ops end in ``_`` (``x.add_(y)``, ``torch.relu_``, ``F.hardtanh_``), assign (``x += y``), or take
``inplace=True`` (``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``). :func:`out_of_place_target` names the call
that returns the same values in a new tensor, where torch has one (``x.lerp_(y, w)``: ``x.lerp(y, w)``), which
:func:`~ios_ray.frontend.rewrites.functionalize` calls instead, having later readers of the tensor read its result. That
is exact only where no other tensor sees the write. :func:`unfollowed_write` names the first write a graph traced by
torch.fx makes where it is not: into a view of a tensor something reads afterwards (or into a tensor a view of which
something reads afterwards), or with no out-of-place form; a graph captured by torch.export is functionalized by
torch where views are involved (:mod:`~ios_ray.frontend.capture`).

Nor can a schedule follow a write into the model's own parameters and buffers (its state: eager mode changes it at
every call, a schedule would keep it as it was at the import): :func:`state_written` finds one in an exported
program, and where torch.fx traces the forward (which runs the model, and runs at once a write that reads no traced
value), :func:`state_written_since` finds one by the tensors' version counters.
"""

from __future__ import annotations

import operator
from typing import Any, Collection, Iterator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ios_ray.frontend import aten
from ios_ray.frontend.nodes import call_arguments, hashable, signature_of

#: Assignments by operator and their out-of-place operators (``x += y``: ``x + y``).
_ASSIGNMENTS: dict[Any, Any] = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
    operator.ipow: operator.pow, operator.iand: operator.and_, operator.ior: operator.or_,
    operator.ixor: operator.xor, operator.ilshift: operator.lshift, operator.irshift: operator.rshift,
    operator.imatmul: operator.matmul,
}
_SPELLED = {operator.iadd: "+=", operator.isub: "-=", operator.imul: "*=", operator.itruediv: "/="}
#: Methods that end in ``_`` but change no tensor's values.
_NOT_WRITES = frozenset({"requires_grad_", "detach_", "share_memory_", "retain_grad_"})
#: Calls whose result may be the tensor they read or share its memory (a write into one is a write into both).
_VIEW_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose", "permute",
    "t", "narrow", "select", "expand", "expand_as", "unbind", "chunk", "split", "tensor_split", "unfold", "diagonal",
    "as_strided", "detach", "movedim", "moveaxis", "swapaxes", "swapdims", "contiguous", "to", "type", "type_as",
    "float", "double", "half", "bfloat16", "__getitem__",
})
_VIEW_FUNCTIONS = frozenset({
    operator.getitem, torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze, torch.transpose, torch.permute,
    torch.narrow, torch.select, torch.chunk, torch.split, torch.tensor_split, torch.unbind, torch.t, torch.movedim,
    torch.swapaxes, torch.diagonal, torch.as_strided, torch.detach, F.dropout, F.dropout2d, torch.dropout,
})
_VIEW_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten, nn.modules.dropout._DropoutNd)
#: Why a write into the model's own tensors cannot be scheduled.
STATE = ("which eager mode changes at every call and a schedule would keep as it was at the import: update it "
          "outside forward")


def writes_in_place(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether a node writes into its first argument."""
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") and not name.startswith("__") and name not in _NOT_WRITES
    if node.op == "call_module":
        return getattr(gm.get_submodule(str(node.target)), "inplace", False) is True
    if node.op != "call_function":
        return False
    if node.target is operator.setitem or (hashable(node.target) and node.target in _ASSIGNMENTS):
        return True
    if node.kwargs.get("inplace") is True:
        return True
    name = getattr(node.target, "__name__", "")
    if name.endswith("_") and not name.startswith("_") and _function_namespace(node.target) is not None:
        return True  # torch.relu_, F.hardtanh_
    return _inplace_argument(node) is True


def out_of_place_target(gm: fx.GraphModule, node: fx.Node) -> Any:
    """The target of the call that computes what a node writing in place computes, in a new tensor (``lerp`` for
    ``lerp_``, ``operator.add`` for ``+=``): the node's own where only an ``inplace`` flag makes it write (of a layer,
    or an argument); None where torch has no such call."""
    if node.op == "call_module" or node.kwargs.get("inplace") is True or _inplace_argument(node) is True:
        return node.target
    if node.op == "call_method":
        name = str(node.target)[:-1]
        return name if hasattr(torch.Tensor, name) else None
    if hashable(node.target) and node.target in _ASSIGNMENTS:
        return _ASSIGNMENTS[node.target]
    namespace = _function_namespace(node.target)
    name = getattr(node.target, "__name__", "")
    return getattr(namespace, name[:-1], None) if namespace is not None else None


def unfollowed_write(gm: fx.GraphModule) -> str | None:
    """The first in-place write of a torch.fx graph that an out-of-place rewrite cannot make exact, as a clause
    (``its forward writes in place (clamp_) into a tensor that shares memory with another, ...``); None where every
    write can be."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for node, written in _writes(gm):
        what = _name(gm, node)
        root = _root(gm, written)
        if any(order[user] > order[node] for alias in _aliases(gm, root) if alias is not written
               and order[alias] < order[node] for user in alias.users):
            return f"its forward writes in place ({what}) into a tensor that shares memory with another, and reads " \
                   "the other afterwards: write it out of place"
        if out_of_place_target(gm, node) is None:
            return f"its forward writes in place with {what}, which has no out-of-place form: write it out of place"
    return None


def writes_into(gm: fx.GraphModule, tensors: Collection[fx.Node]) -> tuple[fx.Node, str] | None:
    """The first write in place into one of ``tensors`` (or into a view of one): the tensor, and how the code spells
    the write (``add_``); None where there is none."""
    for node, written in _writes(gm):
        root = _root(gm, written)
        if root in tensors:
            return root, _name(gm, node)
    return None


def state_versions(module: nn.Module) -> dict[str, int]:
    """The version of each parameter and buffer of ``module``, by name: a write in place raises it."""
    return {name: _version(tensor) for name, tensor in _state(module)}


def state_written_since(module: nn.Module, versions: dict[str, int]) -> str | None:
    """The first parameter or buffer of ``module`` written in place since ``versions`` (:func:`state_versions`), as
    a clause (``its forward writes into its buffer `seen` in place, ...``); None where none was."""
    parameters = {name for name, _ in module.named_parameters()}
    for name, tensor in _state(module):
        if versions.get(name, -1) != _version(tensor):
            kind = "parameter" if name in parameters else "buffer"
            return f"its forward writes into its {kind} `{name}` in place, {STATE}"
    return None


def state_written(program: torch.export.ExportedProgram) -> str | None:
    """The first write of an exported program into the model's parameters, buffers or tensor constants, as a clause
    (``its forward writes into its buffer `calls` in place (add_), ...``); None where it writes into none of them."""
    state = {s.arg.name: (s.kind.name.lower().replace("_", " "), s.target)
             for s in program.graph_signature.input_specs
             if s.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")}
    for node in program.graph.nodes:
        if node.op != "call_function" or not aten.is_in_place(node.target) or not node.args:
            continue
        base = node.args[0]
        while isinstance(base, fx.Node) and base.op == "call_function" and base.args and \
                (aten.is_view(base.target) or base.target is operator.getitem):
            base = base.args[0]
        if isinstance(base, fx.Node) and base.name in state:
            kind, target = state[base.name]
            return f"its forward writes into its {kind} `{target}` in place " \
                   f"({node.target.overloadpacket.__name__}), {STATE}"
    return None


def _writes(gm: fx.GraphModule) -> Iterator[tuple[fx.Node, fx.Node]]:
    """Each node that writes in place into a tensor of the graph, and that tensor, in graph order."""
    for node in gm.graph.nodes:
        if writes_in_place(gm, node) and node.args and isinstance(node.args[0], fx.Node):
            yield node, node.args[0]


def _state(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer of ``module``, by name."""
    return [*module.named_parameters(), *module.named_buffers()]


def _version(tensor: torch.Tensor) -> int:
    """A tensor's version counter (-1 for a tensor made in inference mode, which has none)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return -1


def _function_namespace(target: Any) -> Any:
    """``torch`` or ``torch.nn.functional`` where ``target`` is one of its functions, else None."""
    name = getattr(target, "__name__", None)
    return next((space for space in (torch, F) if name and getattr(space, name, None) is target), None)


def _inplace_argument(node: fx.Node) -> Any:
    """The ``inplace`` argument of a call of a function that takes one (None for any other call)."""
    if node.op != "call_function":
        return None
    signature = signature_of(node.target)
    if signature is None or "inplace" not in signature.parameters:
        return None
    return (call_arguments(node) or {}).get("inplace")


def _root(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    """The tensor ``node`` is a view of, through any chain of views (``node`` itself where it is none)."""
    while _is_view(gm, node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _aliases(gm: fx.GraphModule, root: fx.Node) -> list[fx.Node]:
    """``root`` and every view of it, through chains of views."""
    found, todo = [], [root]
    while todo:
        node = todo.pop()
        found.append(node)
        todo.extend(user for user in node.users if _is_view(gm, user) and user.args and user.args[0] is node)
    return found


def _is_view(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether a node's result may share memory with its first argument."""
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), _VIEW_MODULES)
    return node.op == "call_function" and hashable(node.target) and node.target in _VIEW_FUNCTIONS


def _name(gm: fx.GraphModule, node: fx.Node) -> str:
    """How the model's code spells a write (``add_``, ``+=``, ``ReLU(inplace=True)``)."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_module":
        return f"{type(gm.get_submodule(str(node.target))).__name__}(inplace=True)"
    if node.target is operator.setitem:
        return "an assignment to a slice"
    if hashable(node.target) and node.target in _SPELLED:
        return _SPELLED[node.target]
    return getattr(node.target, "__name__", str(node.target))
