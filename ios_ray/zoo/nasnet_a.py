"""NASNet-A (Zoph et al. 2018); the defaults give NASNet-A Large (6 @ 4032) for 3x331x331 inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SepConv(nn.Module):
    """ReLU -> depthwise kxk conv -> pointwise 1x1 conv -> BatchNorm (one "sepconv" unit)."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, stride: int = 1) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.depthwise = nn.Conv2d(in_ch, in_ch, kernel_size, stride, kernel_size // 2, groups=in_ch, bias=False)
        self.pointwise = nn.Conv2d(in_ch, out_ch, 1, bias=False)
        self.bn = nn.BatchNorm2d(out_ch, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.pointwise(self.depthwise(self.relu(x))))


def branch_sep(in_ch: int, out_ch: int, kernel_size: int, stride: int = 1) -> nn.Sequential:
    """NASNet's separable branch: two sepconvs, only the first one strided."""
    return nn.Sequential(SepConv(in_ch, out_ch, kernel_size, stride), SepConv(out_ch, out_ch, kernel_size))


class ReLUConvBN(nn.Module):
    """ReLU -> 1x1 conv (no bias, optionally strided) -> BatchNorm: a cell input adjust path."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv = nn.Conv2d(in_ch, out_ch, 1, stride, bias=False)
        self.bn = nn.BatchNorm2d(out_ch, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(self.relu(x)))


class FactorizedReduce(nn.Module):
    """Halves the resolution: two strided 1x1 convs, one on the input shifted by one pixel, concatenated."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv_1 = nn.Conv2d(in_ch, out_ch // 2, 1, 2, bias=False)
        self.bn_1 = nn.BatchNorm2d(out_ch // 2, eps=0.001)
        self.conv_2 = nn.Conv2d(in_ch, out_ch - out_ch // 2, 1, 2, bias=False)
        self.bn_2 = nn.BatchNorm2d(out_ch - out_ch // 2, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(x)
        shifted = F.pad(x, (-1, 1, -1, 1))  # drop the first row and column, pad one zero row and column
        return torch.cat([self.bn_1(self.conv_1(x)), self.bn_2(self.conv_2(shifted))], 1)


def _avg_pool(stride: int) -> nn.AvgPool2d:
    return nn.AvgPool2d(3, stride, 1, count_include_pad=False)


class NormalCell(nn.Module):
    """NASNet-A normal cell: 5 pairwise combinations, the adjusted prev-prev input and all 5 sums concatenated."""

    def __init__(self, prev_prev_ch: int, prev_ch: int, filters: int, reduce_prev_prev: bool) -> None:
        super().__init__()
        self.adjust_prev_prev = (FactorizedReduce(prev_prev_ch, filters) if reduce_prev_prev
                                 else ReLUConvBN(prev_prev_ch, filters))
        self.adjust_prev = ReLUConvBN(prev_ch, filters)
        self.comb_0_left = branch_sep(filters, filters, 5)
        self.comb_0_right = branch_sep(filters, filters, 3)
        self.comb_1_left = branch_sep(filters, filters, 5)
        self.comb_1_right = branch_sep(filters, filters, 3)
        self.comb_2_left = _avg_pool(1)
        self.comb_3_left = _avg_pool(1)
        self.comb_3_right = _avg_pool(1)
        self.comb_4_left = branch_sep(filters, filters, 3)

    def forward(self, prev_prev: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        left = self.adjust_prev_prev(prev_prev)
        right = self.adjust_prev(prev)
        comb_0 = self.comb_0_left(right) + self.comb_0_right(left)
        comb_1 = self.comb_1_left(left) + self.comb_1_right(left)
        comb_2 = self.comb_2_left(right) + left
        comb_3 = self.comb_3_left(left) + self.comb_3_right(left)
        comb_4 = self.comb_4_left(right) + right
        return torch.cat([left, comb_0, comb_1, comb_2, comb_3, comb_4], 1)


class ReductionCell(nn.Module):
    """NASNet-A reduction cell: halves the resolution; the 4 unused combinations are concatenated."""

    def __init__(self, prev_prev_ch: int, prev_ch: int, filters: int, reduce_prev_prev: bool) -> None:
        super().__init__()
        self.adjust_prev_prev = (FactorizedReduce(prev_prev_ch, filters) if reduce_prev_prev
                                 else ReLUConvBN(prev_prev_ch, filters))
        self.adjust_prev = ReLUConvBN(prev_ch, filters)
        self.comb_0_left = branch_sep(filters, filters, 5, 2)
        self.comb_0_right = branch_sep(filters, filters, 7, 2)
        self.comb_1_left = nn.MaxPool2d(3, 2, 1)
        self.comb_1_right = branch_sep(filters, filters, 7, 2)
        self.comb_2_left = _avg_pool(2)
        self.comb_2_right = branch_sep(filters, filters, 5, 2)
        self.comb_3_right = _avg_pool(1)
        self.comb_4_left = branch_sep(filters, filters, 3)
        self.comb_4_right = nn.MaxPool2d(3, 2, 1)

    def forward(self, prev_prev: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        left = self.adjust_prev_prev(prev_prev)
        right = self.adjust_prev(prev)
        comb_0 = self.comb_0_left(right) + self.comb_0_right(left)
        comb_1 = self.comb_1_left(right) + self.comb_1_right(left)
        comb_2 = self.comb_2_left(right) + self.comb_2_right(left)
        comb_3 = self.comb_3_right(comb_0) + comb_1
        comb_4 = self.comb_4_left(comb_0) + self.comb_4_right(right)
        return torch.cat([comb_1, comb_2, comb_3, comb_4], 1)


class NASNetA(nn.Module):
    """Stem conv, two stem reduction cells, then 3 stacks of normal cells separated by 2 reduction cells."""

    def __init__(self, cell_repeats: int = 6, penultimate_filters: int = 4032, num_classes: int = 1000,
                 stem_filters: int = 96) -> None:
        super().__init__()
        if cell_repeats < 1 or penultimate_filters % 24:
            raise ValueError("NASNet-A needs cell_repeats >= 1 and penultimate_filters divisible by 24")
        filters = penultimate_filters // 24
        self.stem_conv = nn.Conv2d(3, stem_filters, 3, 2, bias=False)
        self.stem_bn = nn.BatchNorm2d(stem_filters, eps=0.001)
        self.stem_0 = ReductionCell(stem_filters, stem_filters, filters // 4, False)
        self.stem_1 = ReductionCell(stem_filters, 4 * (filters // 4), filters // 2, True)
        # Each cell reads the outputs of the two cells before it; the first normal cell of a stack follows a
        # reduction cell, so its prev-prev input has twice the resolution and goes through FactorizedReduce.
        prev_prev_ch, prev_ch = 4 * (filters // 4), 4 * (filters // 2)
        cells: list[nn.Module] = []
        for stack in range(3):
            if stack:
                filters *= 2
                cells.append(ReductionCell(prev_prev_ch, prev_ch, filters, False))
                prev_prev_ch, prev_ch = prev_ch, 4 * filters
            for i in range(cell_repeats):
                cells.append(NormalCell(prev_prev_ch, prev_ch, filters, reduce_prev_prev=i == 0))
                prev_prev_ch, prev_ch = prev_ch, 6 * filters
        self.cells = nn.ModuleList(cells)
        self.relu = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(prev_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.stem_bn(self.stem_conv(x))
        prev_prev, prev = conv, self.stem_0(conv, conv)
        prev_prev, prev = prev, self.stem_1(conv, prev)
        for cell in self.cells:
            prev_prev, prev = prev, cell(prev_prev, prev)
        return self.fc(torch.flatten(self.avgpool(self.relu(prev)), 1))


def nasnet_a(cell_repeats: int = 6, penultimate_filters: int = 4032) -> NASNetA:
    """A randomly initialised NASNet-A in eval mode (defaults: NASNet-A Large, 3x331x331 inputs)."""
    return NASNetA(cell_repeats, penultimate_filters).eval()
