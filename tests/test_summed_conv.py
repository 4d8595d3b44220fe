"""``frontend.weights.summed_conv``: parallel branches on one input summed as one conv computes their sum, for any
kernels whose taps line up (RepVGG's, MobileOne's, ACNet's asymmetric ones, dilated ones), in float64; branches
that cannot be one conv give None, never a wrong conv. And the import pass around it
(``frontend.branches.branches_as_one_conv``): any linear combination of branches imports to what the model
computes."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from torch import nn

from ios_ray.frontend import import_module
from ios_ray.frontend.weights import Branch, summed_conv
from ios_ray.runtime import Program
from tests.helpers import randomise_batchnorm

CHANNELS = 4


def branch_sum(branches: list[Branch], x: torch.Tensor) -> torch.Tensor:
    """What the branches compute, one by one, summed with their signs."""
    total = torch.zeros(())
    for branch in branches:
        y = branch.conv(x) if branch.conv is not None else x
        y = branch.bn(y) if branch.bn is not None else y
        total = total + branch.factor * y
    return total


def norm(seed: int) -> nn.BatchNorm2d:
    """An eval-mode batch-norm with random statistics and affine parameters."""
    return randomise_batchnorm(nn.BatchNorm2d(CHANNELS).double(), seed).eval()  # type: ignore[return-value]


@st.composite
def aligned_branches(draw: st.DrawFn) -> tuple[list[Branch], int]:
    """Two to four convs with centred taps (odd kernels, each dimension its own size, padding (k - 1) / 2 times the
    dilation) sharing stride, dilation and groups, each with a batch-norm or none and a sign, and maybe the input."""
    stride, dilation = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    groups = draw(st.sampled_from([1, 2, CHANNELS]))
    branches = []
    for _ in range(draw(st.integers(2, 4))):
        kernel = (draw(st.sampled_from([1, 3, 5])), draw(st.sampled_from([1, 3])))
        conv = nn.Conv2d(CHANNELS, CHANNELS, kernel, stride, tuple(dilation * (k - 1) // 2 for k in kernel),
                         dilation, groups, bias=draw(st.booleans())).double().eval()
        branches.append(Branch(conv, norm(draw(st.integers(0, 99))) if draw(st.booleans()) else None,
                               draw(st.sampled_from([1.0, -1.0]))))
    if stride == 1 and draw(st.booleans()):
        branches.append(Branch(None, norm(draw(st.integers(0, 99))) if draw(st.booleans()) else None))
    return branches, stride


@settings(max_examples=60, deadline=None)
@given(aligned_branches(), st.integers(5, 9))
def test_aligned_branches_summed_are_one_conv_computing_their_sum(drawn: tuple[list[Branch], int], size: int) -> None:
    branches, stride = drawn
    torch.manual_seed(0)
    x = torch.randn(2, CHANNELS, size, size + 1, dtype=torch.float64)
    expected = branch_sum(branches, x)
    summed = summed_conv(branches, (size, size + 1), tuple(expected.shape[2:]))  # type: ignore[arg-type]
    assert summed is not None and summed.stride == (stride, stride)
    assert summed.kernel_size[0] == max(b.conv.kernel_size[0] for b in branches if b.conv is not None)
    with torch.no_grad():
        assert torch.allclose(summed(x), expected, rtol=1e-12, atol=1e-12)


def conv(kernel: int | tuple[int, int], padding: int | tuple[int, int], **how: int) -> nn.Conv2d:
    return nn.Conv2d(CHANNELS, CHANNELS, kernel, padding=padding, **how).double().eval()


@pytest.mark.parametrize("branches", [
    [conv(3, 1), conv(3, 2, dilation=2)],                   # dilations differ
    [conv(3, 1), conv(1, 0, groups=CHANNELS)],              # groups differ
    [conv(3, 1), conv(1, 0, stride=2)],                     # strides differ
    [conv(3, 2, dilation=2), conv(1, 1, dilation=2)],       # a dilated tap that falls between the frame's
], ids=["dilation", "groups", "stride", "between-taps"])
def test_branches_that_are_no_one_conv_give_none(branches: list[nn.Conv2d]) -> None:
    assert summed_conv([Branch(c) for c in branches], (8, 8), tuple(branches[0](torch.zeros(1, CHANNELS, 8, 8)
                                                                               .double()).shape[2:])) is None


def test_the_input_itself_with_a_strided_conv_or_other_output_size_gives_none() -> None:
    strided = nn.Conv2d(CHANNELS, CHANNELS, 3, 2, 1).double()
    assert summed_conv([Branch(strided), Branch(None)], (8, 8), (4, 4)) is None
    assert summed_conv([Branch(conv(3, 1)), Branch(conv(1, 0))], (8, 8), (6, 6)) is None, "the size is checked"


class LinearCombination(nn.Module):
    """A sum of terms on one input ``x`` (convs with a batch-norm or none, ``x``, a batch-norm of ``x``, and a term on
    another tensor, ``relu(x)``), each weighed by a number, a per-channel layer scale or nothing, added or subtracted
    in the drawn order; then, for some, a layer scale on the whole sum."""

    def __init__(self, terms: list[tuple[str, tuple[int, int], int, bool, str, bool]], stride: int, groups: int,
                 scale_all: bool) -> None:
        super().__init__()
        self.kinds = [kind for kind, *_ in terms]
        self.signs = [subtract for *_, subtract in terms]
        self.weighing = [weigh for *_, weigh, _ in terms]
        self.convs = nn.ModuleList(
            nn.Conv2d(CHANNELS, CHANNELS, kernel, stride if kind.startswith("conv") else 1,
                      (kernel[0] // 2 * dilation, kernel[1] // 2 * dilation), dilation, groups, bias=bias).double()
            for kind, kernel, dilation, bias, _, _ in terms)
        self.norms = nn.ModuleList(nn.BatchNorm2d(CHANNELS).double() for _ in terms)
        self.gammas = nn.ParameterList(nn.Parameter(torch.rand(CHANNELS, 1, 1, dtype=torch.float64) + 0.5)
                                       for _ in range(len(terms) + 1))
        self.scale_all = scale_all

    def term(self, i: int, x: torch.Tensor) -> torch.Tensor:
        kind = self.kinds[i]
        y = {"conv": lambda: self.convs[i](x), "conv-bn": lambda: self.norms[i](self.convs[i](x)), "input": lambda: x,
             "input-bn": lambda: self.norms[i](x), "other": lambda: self.convs[i](F.relu(x))}[kind]()
        return {"none": lambda: y, "number": lambda: y * 0.75, "divide": lambda: y / 4,
                "layer-scale": lambda: self.gammas[i] * y}[self.weighing[i]]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = self.term(0, x)
        for i in range(1, len(self.kinds)):
            total = total - self.term(i, x) if self.signs[i] else total + self.term(i, x)
        return total * self.gammas[-1] if self.scale_all else total


@st.composite
def combinations(draw: st.DrawFn) -> LinearCombination:
    """Two to five terms, mostly convs on one input, sometimes ones no single conv can hold (a stride on the convs
    with the input among the terms is left out: the shapes would not add)."""
    stride, groups = draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 2, CHANNELS]))
    kinds = ["conv", "conv-bn"] + (["input", "input-bn", "other"] if stride == 1 else [])
    terms = [(draw(st.sampled_from(kinds)) if i else "conv-bn", (draw(st.sampled_from([1, 3])),
              draw(st.sampled_from([1, 3]))), draw(st.sampled_from([1, 1, 2])), draw(st.booleans()),
              draw(st.sampled_from(["none", "none", "number", "divide", "layer-scale"])), draw(st.booleans()))
             for i in range(draw(st.integers(2, 5)))]
    torch.manual_seed(draw(st.integers(0, 99)))
    model = LinearCombination(terms, stride, groups, draw(st.booleans()))
    return randomise_batchnorm(model, draw(st.integers(0, 99)))  # type: ignore[return-value]


@settings(max_examples=40, deadline=None)
@given(combinations())
def test_any_linear_combination_of_branches_imports_to_what_the_model_computes(model: LinearCombination) -> None:
    """Whatever the pass makes of a combination (one conv, one conv plus the rest, or nothing), the imported program
    computes what the model does, in float64, and it never has more conv units than the model has convs."""
    x = torch.randn(2, CHANNELS, 7, 8, dtype=torch.float64)
    imported = import_module(model, x[:1])
    with torch.no_grad():
        assert torch.allclose(Program.from_imported(imported).run(x), model(x), rtol=1e-10, atol=1e-10)
    convs = sum(kind.startswith("conv") or kind == "other" for kind in model.kinds)
    assert sum(u.kind == "conv" for u in imported.graph.units) <= convs
