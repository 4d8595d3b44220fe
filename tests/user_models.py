"""Small user models for the tests, loadable as ``tests.user_models:<factory>``."""

from __future__ import annotations

import torch
from torch import nn


class Untraceable(nn.Module):
    """A module whose inner block branches on tensor data, which torch.fx cannot trace through (the import keeps
    the block as one call, an opaque unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.gate = _DataDependent()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.stem(x))


class _DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x
        return -x


class UnknownOps(nn.Module):
    """Two parallel branches using ops the importer has no unit kind for (opaque units)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 8, 1)
        self.scale = nn.Parameter(torch.randn(1, 8, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.sigmoid(self.a(x)) * self.scale
        b = torch.cumsum(self.b(x), 1)
        return torch.cat([a, b.tanh()], 1).mean(dim=(2, 3))


class BranchingForward(nn.Module):
    """A module whose own forward branches on tensor data, which torch.fx cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return x if x.sum() > 0 else -x


class BatchBranching(nn.Module):
    """A forward that branches on the batch size: one graph cannot hold for every batch size."""

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.threshold = threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        if x.shape[0] > self.threshold:
            return x * 2
        return x


def untraceable() -> nn.Module:
    """Factory: a module with a block torch.fx cannot trace through."""
    return Untraceable()


def branching_forward() -> nn.Module:
    """Factory: a module whose own forward torch.fx cannot trace."""
    return BranchingForward()


def unknown_ops() -> nn.Module:
    """Factory: a module with ops that become opaque units."""
    return UnknownOps()


unknown_ops.input_shape = (3, 16, 16)  # type: ignore[attr-defined]
untraceable.input_shape = (3, 16, 16)  # type: ignore[attr-defined]
branching_forward.input_shape = (3, 16, 16)  # type: ignore[attr-defined]


class Wide(nn.Module):
    """Five parallel branches (chains of one to three convs) between a stem and a concat: a block wide enough that
    a lazy search has stages of three and more groups to leave unmeasured."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        widths = ((8,), (16, 8), (8, 8, 8), (24,), (8, 16))
        self.branches = nn.ModuleList(
            nn.Sequential(*(nn.Conv2d(16 if i == 0 else chain[i - 1], c, 3 if i % 2 else 1, padding=i % 2)
                            for i, c in enumerate(chain)))
            for chain in widths
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        return torch.cat([branch(x) for branch in self.branches], dim=1)


def wide() -> nn.Module:
    """The :class:`Wide` model."""
    return Wide()


wide.input_shape = (3, 16, 16)  # type: ignore[attr-defined]


class FixedSize(nn.Module):
    """A module that says its own input size, and whose head only fits that size (a flatten into a linear)."""

    input_shape = (3, 20, 20)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.head = nn.Linear(4 * 10 * 10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(torch.relu(self.conv(x)), 1))


def fixed_size() -> nn.Module:
    """Factory without an ``input_shape`` of its own: the module it returns has one."""
    return FixedSize()


class Cancelling(nn.Module):
    """Two nearly equal branches (conv and batch-norm, the second's weights 0.1% off), subtracted: their difference
    keeps few of float32's digits, so eager float32 strays from float64 by about 2e-4, and so does a schedule (its
    batch-norms folded into the convs) from eager."""

    input_shape = (3, 16, 16)

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(36)
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)).eval()
        self.b = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)).eval()
        with torch.no_grad():
            self.a[0].weight.copy_(torch.randn(self.a[0].weight.shape, generator=generator))
            noise = torch.randn(self.a[0].weight.shape, generator=generator)
            self.b[0].weight.copy_(self.a[0].weight * (1 + 1e-3 * noise))
            for branch in (self.a, self.b):
                branch[0].bias.fill_(0.5)
                branch[1].running_mean.fill_(-30.0)
                branch[1].running_var.fill_(0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) - self.b(x)


def cancelling() -> nn.Module:
    """The :class:`Cancelling` model."""
    return Cancelling()


class Unbatched(nn.Module):
    """A model that returns its feature map with a leading dimension of one (as RT-DETR returns its decoder's
    layers stacked in front of the batch): not batch first."""

    input_shape = (3, 16, 16)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).unsqueeze(0)


def unbatched() -> nn.Module:
    """The :class:`Unbatched` model."""
    return Unbatched()


class ShapeCaching(nn.Module):
    """A detection head in Ultralytics' way: it caches the shape of its feature map and recomputes the grid it adds
    from it only where a call's shape differs from the cached one (the whole model, so that torch.fx cannot keep the
    head as one call either)."""

    input_shape = (3, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.a, self.b = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, padding=1)
        self.shape: torch.Size | None = None
        self.grid = torch.empty(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.stem(x))
        y = self.a(y) + self.b(y)
        if self.shape != y.shape:
            h, w = y.shape[2:]
            self.grid = torch.arange(h * w, dtype=y.dtype, device=y.device).view(1, 1, h, w) / (h * w)
            self.shape = y.shape
        return y + self.grid
