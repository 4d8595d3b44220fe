"""torch.fx frontend: import any fx-traceable ``nn.Module`` and an example input into the graph IR.

The import is a pipeline of small passes over the traced fx graph, so that units follow what the code computes,
not how it is spelled (torchvision, timm and code in their style import into the same units as the zoo):

1. :func:`~ios_ray.frontend.trace.trace`: torch.fx tracing; a submodule fx cannot trace through stays one call;
   :func:`~ios_ray.frontend.outputs.one_output`: a model that returns its tensor in a dict, tuple or list (as
   segmentation models do) is traced to return the tensor, one that returns several (a backbone's feature maps)
   their concatenation, each flattened; :class:`Imported` keeps the structure (from one call of the model).
2. :mod:`~ios_ray.frontend.rewrites`: in-place ops become out-of-place; what is the identity in eval mode
   (dropout, ``nn.Identity``, stochastic depth, ``contiguous``) vanishes; views become reshapes.
3. :func:`~ios_ray.frontend.trace.propagate`: one run on the example input records shapes and size values;
   eval ``F.batch_norm`` calls become ``nn.BatchNorm2d`` calls, ``F.conv2d`` on parameters ``nn.Conv2d`` calls;
   timm's TensorFlow-"SAME" layers become a pad and the plain torch layer;
   :func:`~ios_ray.frontend.trace.record_batch_layout`: one more run at another batch size records which
   dimensions grow with the batch (a tensor whose batch is folded into another dimension, as attention's
   ``reshape(B * heads, ...)`` does, is computed inside the unit that reads it, never passed between units).
4. :func:`~ios_ray.frontend.sizes.fold_sizes`: arithmetic on sizes becomes literals (all but the batch size).
5. :mod:`~ios_ray.frontend.patterns` groups nodes into units (convs with their batch-norms and activations, pools,
   linears, flattens, channel shuffles and slices, squeeze-excitation scalings), each with its epilogue of
   elementwise steps (:mod:`~ios_ray.frontend.elementwise`).
6. :mod:`~ios_ray.frontend.units` walks the graph: sums and concatenations fold into the input of the unit that
   reads them, and every other op becomes an ``opaque`` unit that calls the original code (never an error).

:func:`~ios_ray.frontend.report.opaque_report` says how much of a graph stayed opaque. The result of an import,
:class:`Imported`, pairs the :class:`~ios_ray.ir.Graph` (plain data) with the traced module the runtime binds it to.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch import nn

from ios_ray.dtypes import DEFAULT_MEMORY_FORMAT, module_memory_format, to_memory_format
from ios_ray.frontend.report import OPAQUE_WARNING_SHARE, OpaqueReport, opaque_report
from ios_ray.frontend.rewrites import (batch_norms_as_modules, drop_eval_identities, functional_convs_as_modules,
                                      functionalize, same_padding_as_torch_layers, views_as_reshapes)
from ios_ray.frontend.outputs import BARE, OutputStructure, one_output, output_structure, output_tensor
from ios_ray.frontend.sizes import fold_sizes
from ios_ray.frontend.trace import propagate, record_batch_layout, trace
from ios_ray.frontend.units import build_graph
from ios_ray.ir import Graph

__all__ = ["Imported", "OPAQUE_WARNING_SHARE", "OpaqueReport", "OutputStructure", "import_model", "import_module",
           "opaque_report", "output_tensor", "trace"]


@dataclass
class Imported:
    """A graph and the traced module it was imported from (what the runtime needs to execute it), and the structure
    the module returns the graph's output in."""

    graph: Graph
    module: fx.GraphModule
    constants: dict[str, Any] = field(default_factory=dict)
    output: OutputStructure = BARE


def import_module(module: nn.Module, example_input: torch.Tensor, name: str | None = None) -> Imported:
    """Import an fx-traceable module (put in eval mode) and an example input (batch first) into the IR; the graph
    records the memory format of the module's 4-D parameters."""
    module = module.eval()
    name = name or type(module).__name__
    gm, structured = one_output(trace(module))
    with torch.no_grad():
        output = output_structure(module(example_input), example_input.shape[0]) if structured else BARE
    gm = views_as_reshapes(drop_eval_identities(functionalize(gm)))
    propagate(gm, example_input, name)
    gm = same_padding_as_torch_layers(functional_convs_as_modules(batch_norms_as_modules(gm)))
    record_batch_layout(gm, example_input)
    gm = fold_sizes(gm)
    graph, constants = build_graph(gm, name, tuple(example_input.shape[1:]))
    return Imported(dataclasses.replace(graph, memory_format=module_memory_format(module)), gm, constants, output)


def import_model(
    spec: str, batch: int = 1, input_shape: Sequence[int] | None = None, dtype: torch.dtype = torch.float32,
    memory_format: str = DEFAULT_MEMORY_FORMAT,
) -> Imported:
    """Build a model spec (a zoo name, ``torchvision:NAME``, ``timm:NAME`` or ``package.module:factory``), convert it
    to ``dtype`` and ``memory_format`` and import it with a random input of this batch size and per-sample
    ``input_shape`` (default: the spec's own)."""
    from ios_ray.models import resolve_model

    model = resolve_model(spec, input_shape=input_shape)
    torch.manual_seed(0)
    example = torch.randn(batch, *model.input_shape).to(dtype)
    return import_module(to_memory_format(model.build().to(dtype), memory_format), example, model.name)
