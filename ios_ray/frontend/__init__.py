"""The frontend: import an ``nn.Module`` and an example input into the graph IR.

The import captures the model's forward as a torch-level fx graph, then runs one pipeline of small passes over it,
so that units follow what the code computes, not how it is spelled (torchvision, timm, segmentation models, YOLO and
code in their style import into the same units as the zoo):

1. Capture (:func:`capture_forward`): :func:`~ios_ray.frontend.capture.capture` runs ``torch.export`` (non-strict,
   the batch dimension symbolic) and rewrites its ATen graph as torch calls and torch layer calls; shapes, size values
   and which dimensions grow with the batch come from the symbolic shapes
   (:func:`~ios_ray.frontend.capture.record_shapes`). Only where torch.export cannot capture the forward (its code
   branches on a tensor's values, say) does a torch.fx trace take its place
   (:func:`~ios_ray.frontend.trace.trace`: a submodule it cannot trace through stays one call), with two runs of the
   model for shapes and batch layout (:func:`~ios_ray.frontend.trace.propagate`,
   :func:`~ios_ray.frontend.trace.record_batch_layout`). Either way
   :func:`~ios_ray.frontend.outputs.one_output` makes the graph return one tensor (the only tensor of a dict, tuple
   or list, or several flattened and concatenated) and :class:`Imported` keeps the structure the model returns.
2. :mod:`~ios_ray.frontend.rewrites`: in-place ops become out-of-place; what is the identity in eval mode
   (dropout, ``nn.Identity``, stochastic depth, ``contiguous``, a multiply by 1, an add of 0) vanishes; views become
   reshapes; eval ``F.batch_norm`` calls become ``nn.BatchNorm2d`` calls, ``F.conv2d`` and ``F.linear`` on
   parameters ``nn.Conv2d`` and ``nn.Linear`` calls; a linear layer on a tensor whose batch a transpose moved runs
   before the transpose (``nn.MultiheadAttention`` computes its projection once, as a linear unit); timm's
   TensorFlow-"SAME" layers and convs padded ``"same"`` or ``"valid"`` become a pad and the plain torch layer, as do
   convs padded by reflection, replication or circularly. Then
   a linear combination of parallel conv branches on one input becomes one conv (:mod:`~ios_ray.frontend.branches`:
   RepVGG's and MobileOne's training-time blocks), convs on equal channel slices of one tensor, concatenated, become
   one grouped conv, and a batch-norm and activation after a concatenation of convs move onto each conv
   (:mod:`~ios_ray.frontend.concats`: MixNet's mixed convs), and split attention's sums over paths become sums of
   the paths (:mod:`~ios_ray.frontend.paths`); an ``expand`` before a broadcasting op vanishes, and efficient
   channel attention's ``Conv1d`` across pooled channels becomes a 1x1 conv (:mod:`~ios_ray.frontend.gates`: ECA's
   gate is a pool, a conv and a scaling, as squeeze-excitation's is).
3. :func:`~ios_ray.frontend.sizes.fold_sizes`: arithmetic on sizes becomes literals (all but the batch size).
4. :mod:`~ios_ray.frontend.patterns` groups nodes into units (convs with their batch-norms and activations, pools,
   linears, flattens, channel shuffles and slices, squeeze-excitation scalings), each with its epilogue of
   elementwise steps (:mod:`~ios_ray.frontend.elementwise`).
5. :mod:`~ios_ray.frontend.units` walks the graph: sums and concatenations fold into the input of the unit that
   reads them, and every other op becomes an ``opaque`` unit that calls the original code (never an error).

:func:`~ios_ray.frontend.report.opaque_report` says how much of a graph stayed opaque. The result of an import,
:class:`Imported`, pairs the :class:`~ios_ray.ir.Graph` (plain data) with the graph module the runtime binds it to.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from ios_ray.dtypes import converted, dtype_name, example_input, module_memory_format
from ios_ray.errors import ImportRefused, UserError, first_line
from ios_ray.frontend.capture import (ExportError, attributes_kept, capture, output_example, record_shapes,
                                     unbatched_output)
from ios_ray.frontend.report import OPAQUE_WARNING_SHARE, OpaqueReport, opaque_report
from ios_ray.frontend.rewrites import (batch_norms_as_modules, drop_eval_identities, functional_convs_as_modules,
                                      functional_linears_as_modules, functionalize, linears_before_batch_moves,
                                      padding_modes_as_pads, same_padding_as_torch_layers, views_as_reshapes)
from ios_ray.frontend.branches import branches_as_one_conv
from ios_ray.frontend.concats import norms_into_concatenated_convs, split_convs_as_grouped
from ios_ray.frontend.gates import broadcasts_without_expands, channel_convs_as_pointwise
from ios_ray.frontend.paths import path_sums
from ios_ray.frontend.outputs import BARE, OutputStructure, one_output, output_structure, output_tensor
from ios_ray.frontend.sizes import fold_sizes
from ios_ray.frontend.trace import defaulted_arguments, propagate, record_batch_layout, trace
from ios_ray.frontend.units import build_graph
from ios_ray.frontend.writes import state_versions, state_written_since, unfollowed_write
from ios_ray.ir import Graph
from ios_ray.vocabulary import DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT

__all__ = ["CAPTURES", "Imported", "Model", "OPAQUE_WARNING_SHARE", "OpaqueReport", "OutputStructure",
           "capture_forward", "import_model", "import_module", "in_eval_mode", "load_model", "opaque_report",
           "output_tensor"]


@dataclass
class Imported:
    """A graph and the traced module it was imported from (what the runtime needs to execute it), and the structure
    the module returns the graph's output in."""

    graph: Graph
    module: fx.GraphModule
    constants: dict[str, Any] = field(default_factory=dict)
    output: OutputStructure = BARE


#: How :func:`capture_forward` captures a forward: torch.export, falling back to torch.fx where export fails
#: (``auto``), or only one of them (for tests and benchmarks).
CAPTURES = ("auto", "export", "fx")


def import_module(module: nn.Module, example_input: torch.Tensor, name: str | None = None, *,
                  capture: str = "auto") -> Imported:
    """Import a module (in eval mode: every submodule's mode is as it was afterwards) and an example input (batch
    first) into the IR; the graph records the memory format of the module's 4-D parameters. UserError where the
    forward cannot be captured."""
    name = name or type(module).__name__
    with _one_at_a_time(), in_eval_mode(module):
        gm, output = capture_forward(module, example_input, name, capture)
        gm = views_as_reshapes(drop_eval_identities(functionalize(gm)))
        gm = functional_linears_as_modules(functional_convs_as_modules(batch_norms_as_modules(gm)))
        gm = padding_modes_as_pads(same_padding_as_torch_layers(linears_before_batch_moves(gm)))
        gm = path_sums(norms_into_concatenated_convs(split_convs_as_grouped(branches_as_one_conv(gm))))
        gm = channel_convs_as_pointwise(broadcasts_without_expands(gm))
        gm = fold_sizes(gm)
        graph, constants = build_graph(gm, name, tuple(example_input.shape[1:]))
    return Imported(dataclasses.replace(graph, memory_format=module_memory_format(module)), gm, constants, output)


def _one_at_a_time() -> Any:
    """The lock an import holds: torch.compile's own (Dynamo compiles one frame at a time under it). A capture patches
    process-wide state for its duration (torch.fx's tracer patches ``nn.Module.__call__``, torch.export its config
    and a recorder of torch's tracer), which another thread's import or Dynamo compile would otherwise see half
    done, and a backend's graph imports on its first call, where a compile in another thread may be under way."""
    from torch._dynamo.convert_frame import compile_lock

    return compile_lock


@contextlib.contextmanager
def in_eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """The module in eval mode inside the block; afterwards each submodule is back in the mode it was in (a caller's
    model in training mode stays so)."""
    training = [m for m in module.modules() if m.training]
    module.eval()
    try:
        yield module
    finally:
        for m in training:
            m.training = True


def capture_forward(module: nn.Module, example_input: torch.Tensor, name: str, method: str = "auto"
                    ) -> tuple[fx.GraphModule, OutputStructure]:
    """The module's forward as a torch-level fx graph returning one tensor, with shapes, size values and batch
    layout recorded for the example input, and the structure the module returns it in: captured by torch.export,
    else (where export fails) traced by torch.fx (``method``: one of :data:`CAPTURES`); UserError where neither
    can."""
    defaulted_arguments(module)  # a forward that needs a second input is refused up front
    batch = example_input.shape[0]
    try:
        if method == "fx":
            raise ExportError("torch.fx was asked for")
        gm = capture(module, example_input)
    except ExportError as failure:
        if method == "export":
            raise ImportRefused(f"torch.export cannot capture the forward of {type(module).__name__}: {failure}.") \
                from failure
        with attributes_kept(module):  # the trace runs the model: what its forward caches on itself is undone
            return _traced_forward(module, example_input, name, failure)
    unbatched = unbatched_output(gm)
    if unbatched is not None:
        raise _not_batch_first(name, unbatched)
    output = output_structure(output_example(gm, batch), batch)
    gm, _ = one_output(gm)
    record_shapes(gm, batch)
    return gm, output


def _not_batch_first(name: str, shape: str) -> UserError:
    """The sentence for a model that returns a tensor of ``shape`` (in terms of the batch size B), not batch first."""
    return ImportRefused(f"{name} returns a tensor of shape {shape} for a batch of B samples, whose first dimension "
                         "is not the batch; ios-ray schedules models whose outputs are batch first: wrap the model to "
                         "return the batch-first tensors it computes and do the rest after.")


def _traced_forward(module: nn.Module, example_input: torch.Tensor, name: str, failure: ExportError
                    ) -> tuple[fx.GraphModule, OutputStructure]:
    """What :func:`capture_forward` gives through a torch.fx trace, which runs the model twice for its shapes."""
    versions = state_versions(module)
    try:
        gm, structured = one_output(trace(module))
    except UserError as error:
        cause = first_line(error.__cause__) if error.__cause__ is not None else str(error)
        raise ImportRefused(f"ios-ray cannot capture the forward of {type(module).__name__}: {failure}, nor can "
                            f"torch.fx trace it ({cause}); move the code it stops at into a submodule, which then "
                            "runs as one opaque unit.") from error
    returned = _run(module, example_input, name)
    other = example_input[:1].expand(example_input.shape[0] + 1, *example_input.shape[1:]).clone()
    try:
        second = _run(module, other, name)
    except UserError:
        second = None  # a model that runs at its import batch size only: its dimension 0 stands for the batch
    written = state_written_since(module, versions) or unfollowed_write(gm)
    if written is not None:
        raise ImportRefused(f"ios-ray cannot schedule {type(module).__name__}: torch.export cannot capture its "
                            f"forward ({failure}), and in the torch.fx trace that stands in, {written}.")
    unbatched = None if second is None else _unbatched(returned, second, example_input.shape[0], other.shape[0])
    if unbatched is not None:
        raise _not_batch_first(name, unbatched)
    output = output_structure(returned, example_input.shape[0]) if structured else BARE
    propagate(gm, example_input, name)
    record_batch_layout(gm, example_input)
    return gm, output


def _run(module: nn.Module, x: torch.Tensor, name: str) -> Any:
    """What the module returns for ``x`` (without gradients); UserError where it fails."""
    try:
        with torch.no_grad():
            return module(x)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's forward is reported in one line
        raise ImportRefused(f"running {name} on an input of shape {tuple(x.shape)} failed: {type(exc).__name__}: "
                            f"{first_line(exc)}{_batch_in_the_shape(x)}") from exc


def _batch_in_the_shape(x: torch.Tensor) -> str:
    """A hint where the input shape given looks like a whole batch's (1xCxHxW): it is one sample's."""
    if x.dim() < 5 or x.shape[1] != 1:
        return ""
    return f" (the input shape is one sample's, without the batch size: {'x'.join(map(str, x.shape[2:]))}?)"


def _unbatched(first: Any, second: Any, batch: int, other: int) -> str | None:
    """The shape, in terms of the batch size ``B``, of the first tensor among a module's outputs at ``batch`` samples
    (``first``) and at ``other`` (``second``) whose first dimension is not the batch; None where all are batch first."""
    pairs = zip(pytree.tree_leaves(first), pytree.tree_leaves(second))
    for a, b in ((a, b) for a, b in pairs if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        if a.dim() == 0 or a.shape[0] != batch or b.shape[0] != other or a.shape[1:] != b.shape[1:]:
            return "(" + ", ".join(str(m) if m == n else "B" for m, n in zip(a.shape, b.shape)) + ")"
    return None


@dataclass(frozen=True)
class Model:
    """A model as a search knows it: its name, its module (as given, or built from the spec, not converted), its
    per-sample input shape, and the spec it was built from (None for a module object)."""

    name: str
    module: nn.Module
    input_shape: tuple[int, ...]
    spec: str | None = None


def load_model(model: str | nn.Module, input_shape: Sequence[int] | None = None, name: str | None = None) -> Model:
    """Build a model spec (a zoo name, ``torchvision:NAME``, ``timm:NAME``, ``package.module:factory``) with the
    global seed fixed at 0, so that the driver and every actor bind the same weights, or take a module object.
    ``input_shape`` and ``name`` default to the spec's (for an object: its ``input_shape`` attribute, else 3x224x224,
    and its class name)."""
    from ios_ray.models import DEFAULT_INPUT_SHAPE, resolve_model

    if isinstance(model, str):
        spec = resolve_model(model, input_shape=input_shape)
        torch.manual_seed(0)
        return Model(name or spec.name, spec.build(), tuple(input_shape or spec.input_shape), model)
    if isinstance(model, nn.Module):
        shape: Sequence[int] = input_shape if input_shape else getattr(model, "input_shape", DEFAULT_INPUT_SHAPE)
        return Model(name or type(model).__name__, model, tuple(shape))
    raise ImportRefused(f"model must be an nn.Module or a model spec string, not a {type(model).__name__}.")


def import_model(
    model: str | nn.Module | Model, input_shape: Sequence[int] | None = None, dtype: str | torch.dtype = DEFAULT_DTYPE,
    memory_format: str = DEFAULT_MEMORY_FORMAT,
) -> Imported:
    """Import a model (a spec or a module object, as :func:`load_model` takes it, or what it gave) in ``dtype`` and
    ``memory_format`` (a converted copy where the module holds others) with a seeded batch-1 example input: the one
    way the driver, the actors, the CLI and the reports turn a model into a graph."""
    loaded = model if isinstance(model, Model) else load_model(model, input_shape)
    held = converted(loaded.module, dtype_name(dtype), memory_format)
    return import_module(held, example_input(held, loaded.input_shape), loaded.name)
