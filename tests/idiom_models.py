"""Models written in the idioms of torchvision and timm (our own code), loadable as ``tests.idiom_models:<factory>``.

They spell things the way those libraries do: ``F.relu(x, inplace=True)`` after a conv and batch-norm, eval-mode
dropout, ``out += identity`` then a shared ``nn.ReLU(inplace=True)``, pre-activation batch-norms on a list of
features, squeeze-excitation gates, stochastic depth (an fx-wrapped function, as torchvision's), timm's
``BatchNormAct2d`` (``F.batch_norm`` on parameters, then an activation), size arithmetic on ``x.size()``, a channel
shuffle, ``permute``/``LayerNorm``, a layer scale, timm's TensorFlow-"SAME" convs and pools, weight-standardised and
functional convs, attention with the batch folded into its heads, split attention over paths (SKNet's and ResNeSt's), and a segmentation head that returns a dict. All
but the Inception V3 are small, for quick tests.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn


def stochastic_depth(x: torch.Tensor, p: float, mode: str, training: bool = True) -> torch.Tensor:
    """Drops whole samples (mode ``row``) with probability ``p`` while training; the identity otherwise."""
    if not training or p == 0.0:
        return x
    keep = torch.empty([x.shape[0]] + [1] * (x.dim() - 1) if mode == "row" else [1] * x.dim()).bernoulli_(1 - p)
    return x * keep / (1 - p)


torch.fx.wrap("stochastic_depth")  # as torchvision does: traced as one call, not through its branches


class StochasticDepth(nn.Module):
    """torchvision-style stochastic depth module."""

    def __init__(self, p: float, mode: str = "row") -> None:
        super().__init__()
        self.p, self.mode = p, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stochastic_depth(x, self.p, self.mode, self.training)


def drop_path(x: torch.Tensor, drop_prob: float = 0.0, training: bool = False) -> torch.Tensor:
    """timm-style drop path: traced through (its early return vanishes in eval mode)."""
    if drop_prob == 0.0 or not training:
        return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1 - drop_prob)
    return x * keep / (1 - drop_prob)


class DropPath(nn.Module):
    """timm-style DropPath module."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training)


# ------------------------------------------------------------------------------------------ Inception V3 (torchvision)


class BasicConv2d(nn.Module):
    """conv (no bias) -> batch-norm (eps 0.001) -> ``F.relu(x, inplace=True)``."""

    def __init__(self, cin: int, cout: int, **conv: object) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **conv)  # type: ignore[arg-type]
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = self.bn(x)
        return F.relu(x, inplace=True)


class MixedA(nn.Module):
    """35x35 mixing block."""

    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(cin, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch1x1(x)
        b = self.branch5x5_2(self.branch5x5_1(x))
        c = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        d = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        outputs = [a, b, c, d]
        return torch.cat(outputs, 1)


class MixedB(nn.Module):
    """35x35 -> 17x17 reduction."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch3x3(x)
        b = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([a, b, F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class MixedC(nn.Module):
    """17x17 block with 1x7 / 7x1 factorised convolutions."""

    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch7x7 = nn.Sequential(
            BasicConv2d(cin, c7, kernel_size=1), BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3)),
            BasicConv2d(c7, 192, kernel_size=(7, 1), padding=(3, 0)))
        self.branch7x7dbl = nn.Sequential(
            BasicConv2d(cin, c7, kernel_size=1), BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0)),
            BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3)),
            BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0)),
            BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3)))
        self.branch_pool = BasicConv2d(cin, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([self.branch1x1(x), self.branch7x7(x), self.branch7x7dbl(x), pool], 1)


class MixedD(nn.Module):
    """17x17 -> 8x8 reduction."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = nn.Sequential(BasicConv2d(cin, 192, kernel_size=1),
                                       BasicConv2d(192, 320, kernel_size=3, stride=2))
        self.branch7x7x3 = nn.Sequential(
            BasicConv2d(cin, 192, kernel_size=1), BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3)),
            BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0)), BasicConv2d(192, 192, kernel_size=3, stride=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch7x7x3(x), F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class MixedE(nn.Module):
    """8x8 block whose 3x3 branches fork into 1x3 and 3x1."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(cin, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fork = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(fork), self.branch3x3_2b(fork)], 1)
        fork = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        b3dbl = torch.cat([self.branch3x3dbl_3a(fork), self.branch3x3dbl_3b(fork)], 1)
        pool = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([self.branch1x1(x), b3, b3dbl, pool], 1)


class InceptionV3Style(nn.Module):
    """Inception V3 in torchvision's style: functional in-place ReLUs, an auxiliary head used only while training,
    eval dropout before the classifier."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            BasicConv2d(3, 32, kernel_size=3, stride=2), BasicConv2d(32, 32, kernel_size=3),
            BasicConv2d(32, 64, kernel_size=3, padding=1), nn.MaxPool2d(kernel_size=3, stride=2),
            BasicConv2d(64, 80, kernel_size=1), BasicConv2d(80, 192, kernel_size=3),
            nn.MaxPool2d(kernel_size=3, stride=2))
        self.mixed_5 = nn.Sequential(MixedA(192, 32), MixedA(256, 64), MixedA(288, 64))
        self.mixed_6 = nn.Sequential(MixedB(288), MixedC(768, 128), MixedC(768, 160), MixedC(768, 160),
                                     MixedC(768, 192))
        self.aux = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(768, num_classes))
        self.mixed_7 = nn.Sequential(MixedD(768), MixedE(1280), MixedE(2048))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=0.5)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mixed_6(self.mixed_5(self.stem(x)))
        if self.training:
            x = x + 0 * self.aux(x).mean()
        x = self.avgpool(self.mixed_7(x))
        x = self.dropout(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


# ------------------------------------------------------------------------------------------------- ResNet-style


class BasicBlock(nn.Module):
    """Two 3x3 convs, ``out += identity``, one ``nn.ReLU(inplace=True)`` used twice."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNetStyle(nn.Module):
    """A small ResNet: stem, three basic blocks, global pool, ``x.view(x.size(0), -1)``, fc."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 32, 2), BasicBlock(32, 32))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.layers(self.stem(x)))
        return self.fc(x.view(x.size(0), -1))


# ----------------------------------------------------------------------------------------------- DenseNet-style


class DenseLayer(nn.Module):
    """Pre-activation: BN -> ReLU -> 1x1 conv -> BN -> ReLU -> 3x3 conv, on the concatenation of a feature list."""

    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)
        self.drop_rate = 0.0

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        x = self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))
        if self.drop_rate > 0:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        return x


class DenseNetStyle(nn.Module):
    """A small DenseNet: stem, a dense block of three layers, a transition, another block, norm -> relu -> pool."""

    def __init__(self, growth: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.block1 = nn.ModuleList(DenseLayer(16 + i * growth, growth) for i in range(3))
        self.transition = nn.Sequential(nn.BatchNorm2d(40), nn.ReLU(inplace=True), nn.Conv2d(40, 20, 1, bias=False),
                                        nn.AvgPool2d(2, 2))
        self.block2 = nn.ModuleList(DenseLayer(20 + i * growth, growth) for i in range(2))
        self.norm5 = nn.BatchNorm2d(36)
        self.classifier = nn.Linear(36, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in (self.block1, self.block2):
            features = [x]
            for layer in block:
                features.append(layer(features))
            x = torch.cat(features, 1)
            if block is self.block1:
                x = self.transition(x)
        out = F.relu(self.norm5(x), inplace=True)
        out = F.adaptive_avg_pool2d(out, (1, 1))
        return self.classifier(torch.flatten(out, 1))


# ----------------------------------------------------------------------------- MobileNetV3 and EfficientNet-style


def conv_norm_act(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1,
                  act: Callable[..., nn.Module] | None = nn.ReLU) -> nn.Sequential:
    """conv -> BN -> activation (inplace), as torchvision's Conv2dNormActivation."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    """Global average pool -> 1x1 conv -> activation -> 1x1 conv -> gate activation, then ``scale * input``."""

    def __init__(self, channels: int, squeeze: int, act: Callable[..., nn.Module] = nn.ReLU,
                 gate: Callable[..., nn.Module] = nn.Sigmoid) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)
        self.activation, self.scale_activation = act(), gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class InvertedResidual(nn.Module):
    """Expand 1x1 -> depthwise kxk -> squeeze-excitation -> project 1x1, with a residual where shapes allow."""

    def __init__(self, cin: int, expanded: int, cout: int, kernel: int, stride: int, act: Callable[..., nn.Module],
                 gate: Callable[..., nn.Module], se_act: Callable[..., nn.Module], drop: float = 0.0) -> None:
        super().__init__()
        self.use_residual = stride == 1 and cin == cout
        self.block = nn.Sequential(
            conv_norm_act(cin, expanded, act=act),
            conv_norm_act(expanded, expanded, kernel, stride, groups=expanded, act=act),
            SqueezeExcitation(expanded, max(8, expanded // 4), se_act, gate),
            conv_norm_act(expanded, cout, act=None))
        self.stochastic_depth = StochasticDepth(drop) if drop else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.block(x)
        if self.use_residual:
            result = self.stochastic_depth(result)
            result += x
        return result


class MobileNetStyle(nn.Module):
    """MobileNetV3 (hardswish, hardsigmoid gates) or EfficientNet (SiLU, sigmoid gates, stochastic depth), small."""

    def __init__(self, efficientnet: bool) -> None:
        super().__init__()
        act = nn.SiLU if efficientnet else nn.Hardswish
        gate = nn.Sigmoid if efficientnet else nn.Hardsigmoid
        se_act = nn.SiLU if efficientnet else nn.ReLU
        drop = 0.2 if efficientnet else 0.0
        self.features = nn.Sequential(
            conv_norm_act(3, 16, 3, 2, act=act),
            InvertedResidual(16, 64, 24, 3, 2, act, gate, se_act, drop),
            InvertedResidual(24, 72, 24, 5, 1, act, gate, se_act, drop),
            conv_norm_act(24, 96, act=act))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(96, 128), act(inplace=True), nn.Dropout(0.2, inplace=True),
                                        nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# ------------------------------------------------------------------------------------------ timm-style EfficientNet


class SigmoidGate(nn.Module):
    """timm's own sigmoid layer: a tensor method, in place where asked."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sigmoid_() if self.inplace else x.sigmoid()


class BatchNormAct2d(nn.BatchNorm2d):
    """timm's BatchNormAct2d: ``F.batch_norm`` on its own parameters, a (no-op) drop, then an activation."""

    def __init__(self, channels: int, act: bool = True) -> None:
        super().__init__(channels)
        self.drop = nn.Identity()
        self.act = nn.SiLU(inplace=True) if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.ndim == 4, "expected a 4-d input")
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                         self.momentum or 0.0, self.eps)
        return self.act(self.drop(x))


class SqueezeExcite(nn.Module):
    """timm's SE: ``x.mean((2, 3), keepdim=True)`` -> reduce -> SiLU -> expand, then ``x * gate(x_se)``."""

    def __init__(self, channels: int, reduced: int) -> None:
        super().__init__()
        self.conv_reduce = nn.Conv2d(channels, reduced, 1)
        self.act1 = nn.SiLU(inplace=True)
        self.conv_expand = nn.Conv2d(reduced, channels, 1)
        self.gate = SigmoidGate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_se = self.conv_expand(self.act1(self.conv_reduce(x.mean((2, 3), keepdim=True))))
        return x * self.gate(x_se)


class DepthwiseSeparable(nn.Module):
    """timm's depthwise-separable block: dw conv -> BN+act -> SE -> pw conv -> BN, residual through drop path."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv_dw = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.bn1 = BatchNormAct2d(channels)
        self.se = SqueezeExcite(channels, channels // 4)
        self.conv_pw = nn.Conv2d(channels, channels, 1, bias=False)
        self.bn2 = BatchNormAct2d(channels, act=False)
        self.drop_path = DropPath(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.bn2(self.conv_pw(self.se(self.bn1(self.conv_dw(x)))))
        return self.drop_path(x) + shortcut


class TimmStyle(nn.Module):
    """A small timm-style EfficientNet: conv_stem -> bn1 -> blocks -> conv_head -> bn2 -> pooled mean -> classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_stem = nn.Conv2d(3, 16, 3, 2, 1, bias=False)
        self.bn1 = BatchNormAct2d(16)
        self.blocks = nn.Sequential(DepthwiseSeparable(16), DepthwiseSeparable(16))
        self.conv_head = nn.Conv2d(16, 64, 1, bias=False)
        self.bn2 = BatchNormAct2d(64)
        self.classifier = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn2(self.conv_head(self.blocks(self.bn1(self.conv_stem(x)))))
        return self.classifier(x.mean((2, 3)))


# ------------------------------------------------------------------------------------------------ ShuffleNet-style


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Interleave the channels of ``groups`` groups, written with size arithmetic as torchvision does."""
    batch, channels, height, width = x.size()
    x = x.view(batch, groups, channels // groups, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batch, -1, height, width)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: split the channels (stride 1) or branch twice (stride 2), concatenate, shuffle."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        half = cout // 2
        self.stride = stride
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                nn.Conv2d(cin, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(inplace=True))
        self.branch2 = nn.Sequential(
            nn.Conv2d(cin if stride > 1 else half, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(inplace=True),
            nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False), nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetStyle(nn.Module):
    """A small ShuffleNetV2: stem, one stride-2 and two stride-1 units, conv5, ``x.mean([2, 3])``, fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, 24, 3, 2, 1, bias=False), nn.BatchNorm2d(24), nn.ReLU(inplace=True))
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.stage2 = nn.Sequential(ShuffleUnit(24, 48, 2), ShuffleUnit(48, 48, 1), ShuffleUnit(48, 48, 1))
        self.conv5 = nn.Sequential(nn.Conv2d(48, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv5(self.stage2(self.maxpool(self.conv1(x))))
        return self.fc(x.mean([2, 3]))


# -------------------------------------------------------------------------------------------------- ConvNeXt-style


class Permute(nn.Module):
    """``torch.permute`` as a module."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.permute(x, self.dims)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (permute, normalise, permute back)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """7x7 depthwise conv -> permute -> LayerNorm -> Linear -> GELU -> Linear -> permute, layer scale, residual."""

    def __init__(self, dim: int, drop: float) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, 7, padding=3, groups=dim), Permute([0, 2, 3, 1]), nn.LayerNorm(dim, eps=1e-6),
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), Permute([0, 3, 1, 2]))
        self.layer_scale = nn.Parameter(torch.full((dim, 1, 1), 0.5))
        self.stochastic_depth = StochasticDepth(drop, "row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.layer_scale * self.block(x)
        result = self.stochastic_depth(result)
        result += x
        return result


class ConvNeXtStyle(nn.Module):
    """A small ConvNeXt: patchify stem with LayerNorm2d, two blocks, downsample, one block, pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 4, 4), LayerNorm2d(16, eps=1e-6))
        self.stage1 = nn.Sequential(ConvNeXtBlock(16, 0.1), ConvNeXtBlock(16, 0.1))
        self.down = nn.Sequential(LayerNorm2d(16, eps=1e-6), nn.Conv2d(16, 32, 2, 2))
        self.stage2 = ConvNeXtBlock(32, 0.1)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(LayerNorm2d(32, eps=1e-6), nn.Flatten(1), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.avgpool(self.stage2(self.down(self.stage1(self.stem(x))))))


# ------------------------------------------------------------------------ TensorFlow "SAME" padding (timm's tf_ models)


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> int:
    """The total padding TensorFlow's "SAME" gives one dimension: the output has ceil(size / stride) positions."""
    return max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)


def pad_same(x: torch.Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...] = (1, 1),
             value: float = 0.0) -> torch.Tensor:
    """Pad as "SAME" does, reading the input's size when called (control flow torch.fx cannot trace through)."""
    height, width = x.size()[-2:]
    pad_h = same_padding(height, kernel[0], stride[0], dilation[0])
    pad_w = same_padding(width, kernel[1], stride[1], dilation[1])
    if pad_h > 0 or pad_w > 0:
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=value)
    return x


class Conv2dSame(nn.Conv2d):
    """timm's TensorFlow-like conv: padding 0 in the module, "SAME" padding of the input's size in ``forward``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, bias: bool = False) -> None:
        super().__init__(cin, cout, kernel, stride, 0, 1, groups, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.weight.shape[-2:], self.stride, self.dilation)
        return F.conv2d(x, self.weight, self.bias, self.stride, (0, 0), self.dilation, self.groups)


class MaxPool2dSame(nn.MaxPool2d):
    """timm's TensorFlow-like max pool (pads with -inf)."""

    def __init__(self, kernel: int, stride: int) -> None:
        super().__init__((kernel, kernel), (stride, stride), (0, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.kernel_size, self.stride, value=-float("inf"))
        return F.max_pool2d(x, self.kernel_size, self.stride, (0, 0), self.dilation, self.ceil_mode)


class AvgPool2dSame(nn.AvgPool2d):
    """timm's TensorFlow-like average pool (pads with zeros, which count)."""

    def __init__(self, kernel: int, stride: int) -> None:
        super().__init__((kernel, kernel), (stride, stride), (0, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.kernel_size, self.stride)
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)


class TfSameStyle(nn.Module):
    """A stride-2 "SAME" stem, then a cell of a depthwise "SAME" conv, a "SAME" max and average pool and a plain
    conv side by side, concatenated; on a 33x30 input the paddings differ per side and per dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(Conv2dSame(3, 16, 3, stride=2), nn.BatchNorm2d(16), nn.SiLU(inplace=True))
        self.depthwise = nn.Sequential(Conv2dSame(16, 16, 5, stride=2, groups=16), nn.BatchNorm2d(16))
        self.max_pool = MaxPool2dSame(3, 2)
        self.avg_pool = AvgPool2dSame(3, 2)
        self.pointwise = nn.Sequential(Conv2dSame(16, 16, 1, stride=2, bias=True), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.cat([self.depthwise(x), self.max_pool(x), self.avg_pool(x), self.pointwise(x)], 1)
        return self.head(x.mean((2, 3)))


# ------------------------------------------------------------------------------- batch folded into other dimensions


class HeadsAttention(nn.Module):
    """Self-attention over positions written as timm's BoTNet writes it: the batch folded into the heads
    (``reshape(B * heads, ...)``), a size read from a folded tensor, then the positions laid out batch second
    (``permute(2, 0, 1)``) and the batch size read back from dimension 1."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Conv2d(dim, 3 * dim, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        q, k, v = torch.split(self.qkv(x), [C, C, C], dim=1)
        q = q.reshape(B * self.heads, C // self.heads, -1).transpose(-1, -2)
        k = k.reshape(B * self.heads, C // self.heads, -1)
        v = v.reshape(B * self.heads, C // self.heads, -1).transpose(-1, -2)
        attended = (q @ k).softmax(dim=-1) @ v
        out = attended.transpose(-1, -2).reshape(q.shape[0] // self.heads, C, H, W)
        positions = self.proj(out).flatten(2).permute(2, 0, 1)  # (H * W, B, C)
        return positions.permute(1, 2, 0).reshape(positions.size(1), C, H, W) + x


class AttentionStyle(nn.Module):
    """A conv stem, attention with the batch folded into its heads, a conv, a pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.attention = HeadsAttention()
        self.conv = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(self.attention(self.stem(x))).mean((2, 3)))


# ----------------------------------------------------------------- convs on computed weights (timm's BiT and NFNets)


class SplitAttention(nn.Module):
    """Split attention over ``paths`` paths of a conv's channels, as SKNet (``torch.stack``) and ResNeSt (a reshape
    that splits the channels) write it: the paths summed, pooled, a softmax over the paths, and the paths weighted and
    summed; ``largest_too`` adds the paths' largest value, so that something other than a sum reads them."""

    def __init__(self, stacked: bool, paths: int = 2, channels: int = 4, largest_too: bool = False) -> None:
        super().__init__()
        self.stacked, self.paths, self.channels, self.largest_too = stacked, paths, channels, largest_too
        self.conv = nn.Conv2d(3, paths * channels, 3, padding=1)
        self.fc = nn.Conv2d(channels, paths * channels, 1)
        self.out = nn.Conv2d(channels, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        if self.stacked:
            y = torch.stack([y[:, i * self.channels:(i + 1) * self.channels] for i in range(self.paths)], 1)
        else:
            y = y.reshape(y.size(0), self.paths, self.channels, y.size(2), y.size(3))
        attention = self.fc(y.sum(1).mean((2, 3), keepdim=True))
        attention = attention.reshape(attention.size(0), self.paths, self.channels, 1, 1).softmax(1)
        out = self.out((y * attention).sum(1))
        return out + y.amax(1).mean(1, keepdim=True) if self.largest_too else out


class StdConv2d(nn.Conv2d):
    """timm's weight-standardised conv: each filter normalised by ``F.batch_norm`` in training mode, every call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True, momentum=0.0,
                              eps=1e-6).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class FunctionalConv(nn.Module):
    """A conv written with ``F.conv2d`` on the module's own parameters, keyword arguments included."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin, 3, 3) * 0.2)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, padding=1)


class StdConvStyle(nn.Module):
    """A weight-standardised stem, two branches (a standardised 1x1 conv; a functional 3x3 conv, batch-norm, ReLU)
    summed, a pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = StdConv2d(3, 16, 3, stride=2, padding=1)
        self.left = StdConv2d(16, 16, 1, bias=False)
        self.right = nn.Sequential(FunctionalConv(16, 16), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        return self.head((self.left(x) + self.right(x)).mean((2, 3)))


class NormFreeBlock(nn.Module):
    """timm's NF-ResNet bottleneck in small: no batch-norm; its input's activation times ``beta`` feeds the convs (and
    the downsampling conv, where it has one), its last conv's output times ``alpha`` is summed with the shortcut."""

    def __init__(self, channels: int, beta: float, alpha: float = 0.2, downsample: bool = False) -> None:
        super().__init__()
        self.beta, self.alpha = beta, alpha
        self.downsample = nn.Conv2d(channels, channels, 1) if downsample else None
        self.conv1 = nn.Conv2d(channels, channels // 2, 1)
        self.conv2 = nn.Conv2d(channels // 2, channels // 2, 3, padding=1)
        self.conv3 = nn.Conv2d(channels // 2, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(x) * self.beta
        shortcut = self.downsample(out) if self.downsample is not None else x
        out = self.conv3(F.relu(self.conv2(F.relu(self.conv1(out)))))
        return out.mul_(self.alpha) + shortcut


class NormFreeStyle(nn.Module):
    """A stem, three normaliser-free blocks (the first with a downsampling conv), a pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(NormFreeBlock(16, 1.0, downsample=True), NormFreeBlock(16, 0.98),
                                    NormFreeBlock(16, 0.96))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.blocks(self.stem(x))).mean((2, 3)))


class RepBlock(nn.Module):
    """MobileOne's and RepVGG's training-time block in small, as timm builds it: ``kxk`` convs (``branches`` of them)
    and a 1x1 conv on one input, each with its batch-norm, the input's batch-norm where the block keeps its shape,
    summed in place, then a ReLU."""

    def __init__(self, channels: int, out: int, stride: int = 1, groups: int = 1, branches: int = 1) -> None:
        super().__init__()
        self.kxk = nn.ModuleList(nn.Sequential(nn.Conv2d(channels, out, 3, stride, 1, groups=groups, bias=False),
                                               nn.BatchNorm2d(out)) for _ in range(branches))
        self.scale = nn.Sequential(nn.Conv2d(channels, out, 1, stride, groups=groups, bias=False), nn.BatchNorm2d(out))
        self.identity = nn.BatchNorm2d(out) if stride == 1 and channels == out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.scale(x)
        for conv in self.kxk:
            out += conv(x)
        out += self.identity(x) if self.identity is not None else 0
        return F.relu(out)


class RepStyle(nn.Module):
    """A RepVGG stage and a MobileOne-like one (depthwise blocks of three 3x3 branches between dense ones), a pooled
    head: every block's branches one conv once imported."""

    def __init__(self) -> None:
        super().__init__()
        self.repvgg = nn.Sequential(RepBlock(3, 16, stride=2), RepBlock(16, 16))
        self.mobileone = nn.Sequential(RepBlock(16, 16, groups=16, branches=3), RepBlock(16, 24),
                                       RepBlock(24, 24, stride=2, groups=24, branches=3), RepBlock(24, 24))
        self.head = nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mobileone(self.repvgg(x)).mean((2, 3)))


# ------------------------------------------------------------------------ parallel branches long as well as many


class MultiResolutionStyle(nn.Module):
    """HRNet's shape in small: three branches at three resolutions, each a chain of four convs, fused by strided
    convs into the lowest resolution and summed: one block whose states multiply across the branches."""

    def __init__(self, width: int = 8, depth: int = 4) -> None:
        super().__init__()
        self.stem = conv_norm_act(3, width, 3)
        self.branches = nn.ModuleList(
            nn.Sequential(conv_norm_act(width, width, 3, stride=2 ** b),
                          *(conv_norm_act(width, width, 3) for _ in range(depth - 1)))
            for b in range(3))
        self.fuse = nn.ModuleList(conv_norm_act(width, width, 3, stride=2 ** (2 - b)) for b in range(3))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        fused = sum(fuse(branch(x)) for branch, fuse in zip(self.branches, self.fuse))
        return self.head(fused.mean((2, 3)))


# ----------------------------------------------------------------- segmentation (torchvision's DeepLabV3), a dict out


class ImagePooling(nn.Sequential):
    """ASPP's image-pooling branch as torchvision writes it: pool to 1x1, a 1x1 conv, upsampled to the input's size."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        for module in self:
            x = module(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class SegmentationStyle(nn.Module):
    """DeepLabV3 in small: a backbone, an ASPP head (a 1x1 conv, two dilated 3x3 convs and image pooling side by
    side, concatenated and projected), logits upsampled to the input's size and returned as ``{"out": logits}``."""

    def __init__(self, width: int = 16, classes: int = 5) -> None:
        super().__init__()
        self.backbone = nn.Sequential(conv_norm_act(3, width, 3, stride=2), conv_norm_act(width, width, 3))
        dilated = (nn.Sequential(nn.Conv2d(width, width, 3, padding=r, dilation=r, bias=False), nn.BatchNorm2d(width),
                                 nn.ReLU()) for r in (2, 3))
        self.aspp = nn.ModuleList([conv_norm_act(width, width), *dilated, ImagePooling(width, width)])
        self.project = nn.Sequential(nn.Conv2d(4 * width, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                     nn.Dropout(0.5))
        self.classifier = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        size = x.shape[-2:]
        features = self.backbone(x)
        logits = self.classifier(self.project(torch.cat([branch(features) for branch in self.aspp], 1)))
        result = OrderedDict()
        result["out"] = F.interpolate(logits, size=size, mode="bilinear", align_corners=False)
        return result


# ----------------------------------------------------------------------------------------------------- factories


def inception_v3_style() -> nn.Module:
    """Factory: Inception V3 written like torchvision's."""
    return InceptionV3Style().eval()


def resnet_style() -> nn.Module:
    """Factory: a small ResNet."""
    return ResNetStyle().eval()


def densenet_style() -> nn.Module:
    """Factory: a small DenseNet."""
    return DenseNetStyle().eval()


def mobilenet_v3_style() -> nn.Module:
    """Factory: a small MobileNetV3."""
    return MobileNetStyle(efficientnet=False).eval()


def efficientnet_style() -> nn.Module:
    """Factory: a small EfficientNet (torchvision style)."""
    return MobileNetStyle(efficientnet=True).eval()


def timm_style() -> nn.Module:
    """Factory: a small timm-style EfficientNet."""
    return TimmStyle().eval()


def shufflenet_style() -> nn.Module:
    """Factory: a small ShuffleNetV2."""
    return ShuffleNetStyle().eval()


def convnext_style() -> nn.Module:
    """Factory: a small ConvNeXt."""
    return ConvNeXtStyle().eval()


def attention_style() -> nn.Module:
    """Factory: attention with the batch folded into its heads, between convs."""
    return AttentionStyle().eval()


def std_conv_style() -> nn.Module:
    """Factory: weight-standardised and functional convs."""
    return StdConvStyle().eval()


def norm_free_style() -> nn.Module:
    """Factory: NF-ResNet's scaled blocks without batch-norms."""
    return NormFreeStyle().eval()


def rep_style() -> nn.Module:
    """Factory: RepVGG's and MobileOne's training-time blocks of branches summed."""
    return RepStyle().eval()


def multi_resolution_style() -> nn.Module:
    """Factory: three long branches side by side (HRNet-like)."""
    return MultiResolutionStyle().eval()


def tf_same_style() -> nn.Module:
    """Factory: timm's TensorFlow-"SAME" layers in a small cell."""
    return TfSameStyle().eval()


def segmentation_style() -> nn.Module:
    """Factory: a small DeepLabV3 that returns ``{"out": logits}``."""
    return SegmentationStyle().eval()


inception_v3_style.input_shape = (3, 299, 299)  # type: ignore[attr-defined]
for _factory in (resnet_style, densenet_style, mobilenet_v3_style, efficientnet_style, timm_style, shufflenet_style,
                 convnext_style, attention_style, std_conv_style, norm_free_style, rep_style, multi_resolution_style,
                 segmentation_style):
    _factory.input_shape = (3, 32, 32)  # type: ignore[attr-defined]
tf_same_style.input_shape = (3, 33, 30)  # type: ignore[attr-defined]

#: The small idiom models by name (Inception V3 is left out: it is checked on its own).
SMALL: dict[str, Callable[[], nn.Module]] = {
    "resnet": resnet_style, "densenet": densenet_style, "mobilenet_v3": mobilenet_v3_style,
    "efficientnet": efficientnet_style, "timm": timm_style, "shufflenet": shufflenet_style,
    "convnext": convnext_style, "tf_same": tf_same_style, "attention": attention_style,
    "std_conv": std_conv_style, "norm_free": norm_free_style, "rep": rep_style,
    "multi_resolution": multi_resolution_style,
    "segmentation": segmentation_style,
}
