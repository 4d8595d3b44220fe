"""Operator merge: several convs that read the same input run as one wider conv, sliced back per unit.

The merged conv stacks the convs' (batch-norm folded) weights along output channels, each smaller kernel
zero-padded and centred to the largest kernel, with the padding of :func:`ios_ray.stage.merged_padding`, and
concatenates their biases (zeros for a conv without one); the stacked weight is laid out in the program's
activation format, and the merged conv runs as the program's kernels run a conv. Its output is sliced back per unit
along channels.
The convs share their input, stride, dilation and activations (:func:`ios_ray.stage.can_merge`), so the shared
``pre_act`` is applied once to the input and the shared ``act`` once to the merged output. The merged weights
are built once, when the stage is compiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ios_ray.dtypes import in_memory_format
from ios_ray.errors import UserError
from ios_ray.runtime.kernels import folded
from ios_ray.runtime.program import Env, Program
from ios_ray.runtime.units import FoldedConv, UnitFn
from ios_ray.stage import can_merge, merged_padding


@dataclass(frozen=True)
class MergedConv:
    """One conv standing for several (as the program's kernels run it): ``splits`` gives each unit's (id, first
    channel, end channel)."""

    conv: UnitFn
    splits: tuple[tuple[str, int, int], ...]

    def __call__(self, x: torch.Tensor) -> Env:
        """Run the merged conv once on the shared input and slice its output back per unit."""
        y = self.conv([x])
        return {unit_id: y[:, start:stop] for unit_id, start, stop in self.splits}


def merge_convs(program: Program, unit_ids: Sequence[str]) -> MergedConv:
    """Build the merged conv of these conv units; UserError where they cannot merge."""
    graph = program.graph
    if not can_merge(graph, unit_ids):
        raise UserError(f"units {list(unit_ids)} cannot run as one merged conv; use a schedule made by ios-ray search.")
    units = [graph.unit(u) for u in unit_ids]
    found = [folded(program.fns[u]) for u in unit_ids]
    if any(c is None for c in found):
        raise TypeError(f"units {list(unit_ids)} are not all bound to folded convs")
    convs: list[FoldedConv] = found  # type: ignore[assignment]
    kernel = tuple(max(c.weight.shape[d] for c in convs) for d in (2, 3))
    padding = merged_padding(units)
    assert padding is not None, "can_merge accepts only kernels that centre together"
    first = convs[0]
    weight = _stacked_weight(convs, kernel, program.layout)
    merged = FoldedConv(weight, _stacked_bias(convs), first.stride, padding, first.dilation, 1, first.act,
                        first.pre_act)
    bound = program.bind_conv(merged, graph.value_shape(units[0].inputs[0]))
    return MergedConv(bound, _splits(unit_ids, convs))


def _stacked_weight(convs: Sequence[FoldedConv], kernel: tuple[int, ...], memory_format: str) -> torch.Tensor:
    """Each weight zero-padded and centred to ``kernel``, stacked along output channels, laid out in
    ``memory_format`` (the program's activations')."""
    padded = []
    for conv in convs:
        extra_h, extra_w = (kernel[0] - conv.weight.shape[2]) // 2, (kernel[1] - conv.weight.shape[3]) // 2
        padded.append(F.pad(conv.weight, (extra_w, extra_w, extra_h, extra_h)))
    return in_memory_format(torch.cat(padded, 0), memory_format)


def _stacked_bias(convs: Sequence[FoldedConv]) -> torch.Tensor | None:
    """The biases concatenated (zeros for a conv without one), or None where no conv has a bias."""
    if all(c.bias is None for c in convs):
        return None
    return torch.cat([c.bias if c.bias is not None else c.weight.new_zeros(c.weight.shape[0]) for c in convs])


def _splits(unit_ids: Sequence[str], convs: Sequence[FoldedConv]) -> tuple[tuple[str, int, int], ...]:
    """Each unit's channel range in the merged output."""
    splits, start = [], 0
    for unit_id, conv in zip(unit_ids, convs):
        stop = start + conv.weight.shape[0]
        splits.append((unit_id, start, stop))
        start = stop
    return tuple(splits)
