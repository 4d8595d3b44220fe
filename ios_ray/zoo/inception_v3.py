"""Inception V3 (Szegedy et al. 2016) without the auxiliary classifier, for 3x299x299 inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicConv2d(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d (eps 0.001) -> ReLU."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int | tuple[int, int],
                 stride: int = 1, padding: int | tuple[int, int] = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel_size, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(out_ch, eps=0.001)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class InceptionA(nn.Module):
    """35x35 block: 1x1, 1x1->5x5, 1x1->3x3->3x3 and avgpool->1x1 branches."""

    def __init__(self, in_ch: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_ch, 64, 1)
        self.branch5x5 = nn.Sequential(BasicConv2d(in_ch, 48, 1), BasicConv2d(48, 64, 5, padding=2))
        self.branch3x3dbl = nn.Sequential(
            BasicConv2d(in_ch, 64, 1), BasicConv2d(64, 96, 3, padding=1), BasicConv2d(96, 96, 3, padding=1))
        self.branch_pool = BasicConv2d(in_ch, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.branch_pool(F.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.branch1x1(x), self.branch5x5(x), self.branch3x3dbl(x), pool], 1)


class InceptionB(nn.Module):
    """Grid reduction 35x35 -> 17x17."""

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(in_ch, 384, 3, stride=2)
        self.branch3x3dbl = nn.Sequential(
            BasicConv2d(in_ch, 64, 1), BasicConv2d(64, 96, 3, padding=1), BasicConv2d(96, 96, 3, stride=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch3x3dbl(x), F.max_pool2d(x, 3, 2)], 1)


class InceptionC(nn.Module):
    """17x17 block with factorized 7x7 convolutions of width c7."""

    def __init__(self, in_ch: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_ch, 192, 1)
        self.branch7x7 = nn.Sequential(
            BasicConv2d(in_ch, c7, 1),
            BasicConv2d(c7, c7, (1, 7), padding=(0, 3)),
            BasicConv2d(c7, 192, (7, 1), padding=(3, 0)))
        self.branch7x7dbl = nn.Sequential(
            BasicConv2d(in_ch, c7, 1),
            BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv2d(c7, c7, (1, 7), padding=(0, 3)),
            BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv2d(c7, 192, (1, 7), padding=(0, 3)))
        self.branch_pool = BasicConv2d(in_ch, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.branch_pool(F.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.branch1x1(x), self.branch7x7(x), self.branch7x7dbl(x), pool], 1)


class InceptionD(nn.Module):
    """Grid reduction 17x17 -> 8x8."""

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch3x3 = nn.Sequential(BasicConv2d(in_ch, 192, 1), BasicConv2d(192, 320, 3, stride=2))
        self.branch7x7x3 = nn.Sequential(
            BasicConv2d(in_ch, 192, 1),
            BasicConv2d(192, 192, (1, 7), padding=(0, 3)),
            BasicConv2d(192, 192, (7, 1), padding=(3, 0)),
            BasicConv2d(192, 192, 3, stride=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch7x7x3(x), F.max_pool2d(x, 3, 2)], 1)


class InceptionE(nn.Module):
    """8x8 block whose 3x3 branches split into parallel 1x3 and 3x1 convolutions."""

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_ch, 320, 1)
        self.branch3x3_1 = BasicConv2d(in_ch, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(in_ch, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(in_ch, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_1(x)
        branch3x3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        d3 = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        branch3x3dbl = torch.cat([self.branch3x3dbl_3a(d3), self.branch3x3dbl_3b(d3)], 1)
        pool = self.branch_pool(F.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.branch1x1(x), branch3x3, branch3x3dbl, pool], 1)


class InceptionV3(nn.Module):
    """Inception V3: stem, 3xA, B, 4xC, D, 2xE, global average pool, fc."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.maxpool1 = nn.MaxPool2d(3, 2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.maxpool2 = nn.MaxPool2d(3, 2)
        self.Mixed_5b = InceptionA(192, 32)
        self.Mixed_5c = InceptionA(256, 64)
        self.Mixed_5d = InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, 128)
        self.Mixed_6c = InceptionC(768, 160)
        self.Mixed_6d = InceptionC(768, 160)
        self.Mixed_6e = InceptionC(768, 192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool1(self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x))))
        x = self.maxpool2(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)))
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(self.Mixed_6a(x)))))
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def inception_v3(num_classes: int = 1000) -> InceptionV3:
    """A randomly initialised Inception V3 in eval mode."""
    return InceptionV3(num_classes).eval()
