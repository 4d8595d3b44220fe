"""``frontend.weights.summed_conv``: parallel branches on one input summed as one conv computes their sum, for any
kernels whose taps line up (RepVGG's, MobileOne's, ACNet's asymmetric ones, dilated ones), in float64; branches
that cannot be one conv give None, never a wrong conv."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from torch import nn

from ios_ray.frontend.weights import Branch, summed_conv
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
