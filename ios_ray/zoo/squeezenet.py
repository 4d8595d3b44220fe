"""SqueezeNet 1.0 with simple bypass (Iandola et al. 2016), for 3x224x224 inputs."""

from __future__ import annotations

import torch
from torch import nn


class Fire(nn.Module):
    """Squeeze 1x1 conv, then 1x1 and 3x3 expand convs concatenated (each conv followed by ReLU)."""

    def __init__(self, in_ch: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(in_ch, squeeze, 1)
        self.squeeze_relu = nn.ReLU()
        self.expand1x1 = nn.Conv2d(squeeze, expand, 1)
        self.expand1x1_relu = nn.ReLU()
        self.expand3x3 = nn.Conv2d(squeeze, expand, 3, padding=1)
        self.expand3x3_relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze_relu(self.squeeze(x))
        return torch.cat([self.expand1x1_relu(self.expand1x1(s)), self.expand3x3_relu(self.expand3x3(s))], 1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.0 whose fire3, fire5, fire7 and fire9 add their input to their output."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 96, 7, stride=2)
        self.relu1 = nn.ReLU()
        self.maxpool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.fire2 = Fire(96, 16, 64)
        self.fire3 = Fire(128, 16, 64)
        self.fire4 = Fire(128, 32, 128)
        self.maxpool4 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.fire5 = Fire(256, 32, 128)
        self.fire6 = Fire(256, 48, 192)
        self.fire7 = Fire(384, 48, 192)
        self.fire8 = Fire(384, 64, 256)
        self.maxpool8 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.fire9 = Fire(512, 64, 256)
        self.conv10 = nn.Conv2d(512, num_classes, 1)
        self.relu10 = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fire2(self.maxpool1(self.relu1(self.conv1(x))))
        x = x + self.fire3(x)
        x = self.maxpool4(self.fire4(x))
        x = x + self.fire5(x)
        x = self.fire6(x)
        x = x + self.fire7(x)
        x = self.maxpool8(self.fire8(x))
        x = x + self.fire9(x)
        return torch.flatten(self.avgpool(self.relu10(self.conv10(x))), 1)


def squeezenet(num_classes: int = 1000) -> SqueezeNet:
    """A randomly initialised SqueezeNet 1.0 with simple bypass, in eval mode."""
    return SqueezeNet(num_classes).eval()
