"""A model's output: the one tensor the graph computes, and the structure (dict, tuple, list) the model returns it in.

Segmentation models return a dict (torchvision's DeepLabV3, FCN and LR-ASPP: ``{"out": tensor}``), and other code
returns a tuple or list that holds one tensor. :func:`single_output` makes the traced module return that tensor
alone, which the import turns into units, and :func:`output_structure` records, from one call of the model, the
structure as an :class:`OutputStructure`, which puts a tensor computed by a schedule back where the model returns it,
so a deployed model returns what the original returns (an ``OrderedDict`` stays one). Non-tensor entries of the
structure (``None``, numbers, strings) are kept as they were at import. A model that returns
several tensors (an auxiliary classifier's output beside the main one, say) is refused in one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ios_ray.errors import UserError


@dataclass(frozen=True)
class OutputStructure:
    """Where the one tensor sits in what a model returns: the structure's tree spec, its other entries, its index."""

    spec: pytree.TreeSpec
    leaves: tuple[Any, ...]
    index: int

    @property
    def bare(self) -> bool:
        """Whether the model returns the tensor itself."""
        return self.spec.is_leaf()

    def pack(self, tensor: torch.Tensor) -> Any:
        """The model's output structure with ``tensor`` in the tensor's place (the tensor itself where bare)."""
        if self.bare:
            return tensor
        leaves = list(self.leaves)
        leaves[self.index] = tensor
        return pytree.tree_unflatten(leaves, self.spec)


#: The structure of a model that returns a tensor.
BARE = OutputStructure(pytree.tree_flatten(0)[1], (None,), 0)


def single_output(gm: fx.GraphModule, name: str) -> tuple[fx.GraphModule, bool]:
    """``gm`` made to return the one value its output structure holds that the trace computed, and whether it was in
    a structure; UserError where the structure holds several such values (or none)."""
    output = next(node for node in reversed(gm.graph.nodes) if node.op == "output")
    value = output.args[0]
    named_tuple = _named_tuple(value)
    leaves, spec = pytree.tree_flatten((value.args, value.kwargs) if named_tuple else value)
    computed = [leaf for leaf in leaves if isinstance(leaf, fx.Node)]
    if len(computed) != 1:
        raise UserError(f"{name} returns {len(computed)} tensors; ios-ray imports models that return one (alone, or "
                        "as the only tensor of a dict, tuple or list): wrap the model to return the output you serve.")
    if spec.is_leaf():
        return gm, False
    output.args = (computed[0],)
    if named_tuple:
        gm.graph.erase_node(value)
    gm.recompile()
    return gm, True


def _named_tuple(value: Any) -> bool:
    """Whether ``value`` is a node that builds a named tuple (torch.fx records that as a call of its class) that
    only the output reads."""
    return isinstance(value, fx.Node) and value.op == "call_function" and isinstance(value.target, type) and \
        issubclass(value.target, tuple) and len(value.users) == 1


def output_structure(output: Any) -> OutputStructure:
    """Where the one tensor sits in ``output``, what a model returned (torch.fx turns an ``OrderedDict`` into a dict,
    so the structure comes from a real call)."""
    leaves, spec = pytree.tree_flatten(output)
    index = _tensor_index(leaves)
    return OutputStructure(spec, tuple(None if i == index else leaf for i, leaf in enumerate(leaves)), index)


def output_tensor(output: Any) -> torch.Tensor:
    """The one tensor of a model's output (the output itself, or the only tensor of its dict, tuple or list)."""
    leaves = pytree.tree_leaves(output)
    return leaves[_tensor_index(leaves)]


def _tensor_index(leaves: list[Any]) -> int:
    """The index of the one tensor among a model output's leaves; UserError where there are several or none."""
    tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    if len(tensors) != 1:
        raise UserError(f"the model returned {len(tensors)} tensors where ios-ray expects one; wrap the model to "
                        "return the output you serve.")
    return tensors[0]
