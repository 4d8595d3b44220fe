"""A model's output: the one tensor the graph computes, and the structure (dict, tuple, list) the model returns.

Segmentation models return a dict (torchvision's DeepLabV3, FCN and LR-ASPP: ``{"out": tensor}``), backbones
several feature maps (timm's ``features_only`` models a list, torchvision's FPN an ``OrderedDict``), and other code a
tuple. The graph computes one tensor: :func:`one_output` makes the traced module return the structure's tensor, or
where it holds several, each flattened after the batch dimension and concatenated (a ``concat`` unit of
``flatten`` units). :func:`output_structure`
records, from one call of the model, the structure as an :class:`OutputStructure`, whose :meth:`~OutputStructure.pack`
puts a tensor computed by a schedule back into it (several as views of their slices of the concatenation), so a
deployed model returns what the original returns (an ``OrderedDict`` stays one). Non-tensor entries of the structure
(``None``, numbers, strings) are kept as they were at import. :func:`output_tensor` gives the tensor a graph computes
from what a model returns, for comparing the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ios_ray.errors import ImportRefused


@dataclass(frozen=True)
class OutputStructure:
    """Where the tensors sit in what a model returns: the structure's tree spec, its other entries, the tensors'
    indices among the entries and their shapes after the batch dimension."""

    spec: pytree.TreeSpec
    leaves: tuple[Any, ...]
    indices: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def bare(self) -> bool:
        """Whether the model returns the tensor itself."""
        return self.spec.is_leaf()

    def pack(self, tensor: torch.Tensor) -> Any:
        """The model's output structure holding ``tensor`` (the tensor itself where bare; where the structure holds
        several tensors, ``tensor`` is their concatenation, and each comes back as a view of its slice)."""
        if self.bare:
            return tensor
        parts = [tensor]
        if len(self.indices) > 1:
            sizes = [math.prod(shape) for shape in self.shapes]
            parts = [part.unflatten(1, shape) for part, shape in zip(tensor.split(sizes, 1), self.shapes)]
        leaves = list(self.leaves)
        for index, part in zip(self.indices, parts):
            leaves[index] = part
        return pytree.tree_unflatten(leaves, self.spec)


#: The structure of a model that returns a tensor.
BARE = OutputStructure(pytree.tree_flatten(0)[1], (None,), (0,), ((),))


def one_output(gm: fx.GraphModule) -> tuple[fx.GraphModule, bool]:
    """``gm`` made to return one value, and whether the module returns a structure: the value its output holds that
    the trace computed, or where it holds several, their concatenation, each flattened after the batch dimension."""
    output = next(node for node in reversed(gm.graph.nodes) if node.op == "output")
    value = output.args[0]
    named_tuple = _named_tuple(value)
    leaves, spec = pytree.tree_flatten((value.args, value.kwargs) if named_tuple else value)
    computed = [leaf for leaf in leaves if isinstance(leaf, fx.Node)]
    if spec.is_leaf() or not computed:
        return gm, not spec.is_leaf()
    with gm.graph.inserting_before(output):
        packed = computed[0] if len(computed) == 1 else gm.graph.call_function(
            torch.cat, ([gm.graph.call_function(torch.flatten, (node, 1)) for node in computed], 1))
    output.args = (packed,)
    if named_tuple:
        gm.graph.erase_node(value)
    gm.recompile()
    return gm, True


def output_structure(output: Any, batch: int) -> OutputStructure:
    """Where the tensors sit in ``output``, what a model returned for an input of ``batch`` samples (torch.fx turns
    an ``OrderedDict`` into a dict, so the structure comes from a real call); UserError where it holds no tensor, or
    several that cannot be concatenated after their batch dimension."""
    leaves, spec = pytree.tree_flatten(output)
    indices = _tensor_indices(leaves)
    tensors = [leaves[i] for i in indices]
    if len(tensors) > 1 and (any(t.dim() < 2 or t.shape[0] != batch for t in tensors) or
                             len({t.dtype for t in tensors}) > 1):
        raise ImportRefused(f"the model returned {len(tensors)} tensors that are not all batch-first feature maps of "
                            "one dtype (ios-ray concatenates several outputs after their batch dimension); wrap the "
                            "model to return the outputs you serve.")
    kept = tuple(None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves)
    return OutputStructure(spec, kept, indices, tuple(tuple(t.shape[1:]) for t in tensors))


def output_tensor(output: Any) -> torch.Tensor:
    """The tensor a graph computes from what its model returns: the output itself, the only tensor of its dict, tuple
    or list, or its tensors flattened after the batch dimension and concatenated."""
    leaves = pytree.tree_leaves(output)
    tensors = [leaves[i] for i in _tensor_indices(leaves)]
    return tensors[0] if len(tensors) == 1 else torch.cat([t.flatten(1) for t in tensors], 1)


def _tensor_indices(leaves: list[Any]) -> tuple[int, ...]:
    """Where the tensors are among a model output's leaves; UserError where there is none."""
    indices = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
    if not indices:
        raise ImportRefused("the model returned no tensor; ios-ray imports models that return one or more.")
    return indices


def _named_tuple(value: Any) -> bool:
    """Whether ``value`` is a node that builds a named tuple (torch.fx records that as a call of its class) that
    only the output reads."""
    return isinstance(value, fx.Node) and value.op == "call_function" and isinstance(value.target, type) and \
        issubclass(value.target, tuple) and len(value.users) == 1
