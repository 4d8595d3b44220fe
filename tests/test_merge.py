"""Operator merge: the merged conv equals its separate convs, for mixed kernels, with and without bias and BN."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ios_ray.errors import UserError
from ios_ray.frontend import import_module
from ios_ray.ir import GRAPH_INPUT
from ios_ray.runtime import Program, compile_stage, merge_convs
from ios_ray.stage import Stage, can_merge
from tests.helpers import relative_error

# (kernel, padding) of each conv of a merge; all keep the 16x16 input size at stride 1.
KERNEL_SETS = {
    "1x3+3x1": [((1, 3), (0, 1)), ((3, 1), (1, 0))],
    "1x1+3x3": [((1, 1), (0, 0)), ((3, 3), (1, 1))],
    "1x1+3x3+5x5+1x7": [((1, 1), (0, 0)), ((3, 3), (1, 1)), ((5, 5), (2, 2)), ((1, 7), (0, 3))],
}


class Branches(nn.Module):
    """Several convs (each optionally with a bias, a BatchNorm, a ReLU before and after) on one input."""

    def __init__(self, kernels: list, bias: bool, bn: bool, stride: int = 1, pre_act: bool = False) -> None:
        super().__init__()
        self.pre_act = pre_act
        self.convs = nn.ModuleList(nn.Conv2d(6, 4 + i, k, stride, p, bias=bias) for i, (k, p) in enumerate(kernels))
        self.bns = nn.ModuleList(nn.BatchNorm2d(4 + i) if bn else nn.Identity() for i in range(len(kernels)))
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for bn_module in self.bns:
                if isinstance(bn_module, nn.BatchNorm2d):
                    size = bn_module.num_features
                    bn_module.running_mean.copy_(torch.randn(size, generator=generator))
                    bn_module.running_var.copy_(0.5 + torch.rand(size, generator=generator))
                    bn_module.weight.copy_(0.5 + torch.rand(size, generator=generator))
                    bn_module.bias.copy_(torch.randn(size, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [torch.relu(bn(conv(torch.relu(x) if self.pre_act else x))) for conv, bn in zip(self.convs, self.bns)]
        return torch.cat(outs, 1)


def program_of(module: nn.Module, kernels: str = "eager") -> Program:
    torch.manual_seed(0)
    return Program.from_imported(import_module(module, torch.randn(1, 6, 16, 16)), "cpu", kernels)


def conv_units(program: Program) -> list[str]:
    return [u.id for u in program.graph.units if u.kind == "conv"]


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("bias, bn", [(True, False), (False, False), (False, True), (True, True)])
@pytest.mark.parametrize("kernels", list(KERNEL_SETS))
@pytest.mark.parametrize("runs_with", ["eager", "fused"])
def test_merged_conv_equals_separate_convs(kernels: str, bias: bool, bn: bool, batch: int, runs_with: str) -> None:
    program = program_of(Branches(KERNEL_SETS[kernels], bias, bn), runs_with)
    units = conv_units(program)
    assert can_merge(program.graph, units)
    env = {GRAPH_INPUT: torch.randn(batch, 6, 16, 16)}
    merged = merge_convs(program, units)(env[GRAPH_INPUT])
    for unit_id in units:
        assert relative_error(merged[unit_id], program.run_unit(unit_id, env)) <= 1e-5


@pytest.mark.parametrize("batch", [1, 4])
def test_merge_stage_with_stride_and_shared_pre_act(batch: int) -> None:
    program = program_of(Branches(KERNEL_SETS["1x1+3x3"], True, True, stride=2, pre_act=True))
    units = conv_units(program)
    assert all(program.graph.unit(u).attrs["pre_act"] == "relu" for u in units)
    stage = compile_stage(program, Stage("merge", tuple((u,) for u in units)), torch.device("cpu"))
    env = {GRAPH_INPUT: torch.randn(batch, 6, 16, 16)}
    outputs = stage(env)
    assert set(outputs) == set(units) and stage.inputs == (GRAPH_INPUT,)
    for unit_id in units:
        assert relative_error(outputs[unit_id], program.run_unit(unit_id, env)) <= 1e-5


def test_merged_weights_are_built_once() -> None:
    program = program_of(Branches(KERNEL_SETS["1x3+3x1"], True, False))
    merged = merge_convs(program, conv_units(program))
    assert merged.conv.weight.shape == (9, 6, 3, 3) and merged.conv.padding == (1, 1)
    assert [(start, stop) for _, start, stop in merged.splits] == [(0, 4), (4, 9)]


class MixedActivations(nn.Module):
    """Two convs on one input, only one followed by a ReLU: they cannot merge."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(6, 4, 3, padding=1)
        self.b = nn.Conv2d(6, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(self.a(x)), self.b(x)], 1)


def test_unmergeable_convs_are_a_user_error() -> None:
    program = program_of(MixedActivations())
    units = conv_units(program)
    with pytest.raises(UserError, match="cannot run as one merged conv"):
        merge_convs(program, units)
    with pytest.raises(UserError, match="cannot run as one merged conv"):
        compile_stage(program, Stage("merge", tuple((u,) for u in units)), torch.device("cpu"))


class DilatedPair(nn.Module):
    """A dilated 3x3 and a dilated 1x1 conv at stride 3; whether they centre together depends on the 1x1's padding."""

    def __init__(self, padding: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(6, 4, 3, stride=3, padding=2, dilation=2)
        self.b = nn.Conv2d(6, 4, 1, stride=3, padding=padding, dilation=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], 1)


def test_dilated_kernels_merge_only_where_their_taps_centre() -> None:
    shifted = program_of(DilatedPair(padding=1))  # equal output sizes, but the 1x1 tap is off the 3x3's centre
    assert not can_merge(shifted.graph, conv_units(shifted))
    centred = program_of(DilatedPair(padding=0))
    units = conv_units(centred)
    assert can_merge(centred.graph, units)
    x = torch.randn(2, 6, 17, 17)
    merged = merge_convs(centred, units)(x)
    for unit in units:
        assert relative_error(merged[unit], centred.fns[unit]([x])) <= 1e-5
