"""Small models for the torch.compile backend's tests: graph breaks, a data-dependent branch, two inputs, wide
bottlenecks."""

from __future__ import annotations

import torch
from torch import nn

INPUT_SHAPE = (3, 12, 12)


class Broken(nn.Module):
    """Two branches side by side before and after a ``print`` (a graph break), and a head that reshapes by the
    batch size read from its input."""

    input_shape = INPUT_SHAPE

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.a = nn.Conv2d(8, 8, 1)
        self.b = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.c = nn.Conv2d(16, 8, 1)
        self.d = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = torch.cat([self.a(y), self.b(y)], 1)
        print("between the graphs")
        y = torch.cat([self.c(y), self.d(y)], 1)
        return self.head(y.mean((2, 3)).view(y.size(0), -1))


class Branching(Broken):
    """:class:`Broken` with a branch on the values of a tensor in place of the ``print``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = torch.cat([self.a(y), self.b(y)], 1)
        if float(y.detach().mean()) > 0:
            y = torch.cat([self.c(y), self.d(y)], 1)
        else:
            y = torch.cat([self.d(y), self.c(y)], 1)
        return self.head(y.mean((2, 3)).view(y.size(0), -1))


class Caching(Broken):
    """:class:`Broken` whose graph break happens on its first call only, when it caches its input's shape (as
    Ultralytics' detection head caches its anchors): compiled after it ran, it is one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: torch.Size | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = torch.cat([self.a(y), self.b(y)], 1)
        if self.seen != x.shape:
            print("first call: caching the input's shape")
            self.seen = x.shape
        y = torch.cat([self.c(y), self.d(y)], 1)
        return self.head(y.mean((2, 3)).view(y.size(0), -1))


class TwoInputs(nn.Module):
    """A model whose graph reads two input tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.a(y)


class Counting(nn.Module):
    """A model that counts its calls in a buffer and scales its output by the count: each call computes another
    thing."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.a(x) * self.calls


class Bottlenecks(nn.Module):
    """Four branches that widen to 64 channels and narrow again, then a concat: run side by side, their wide middles
    are alive at once, so a concurrent schedule peaks far above the sequential one."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 1)
        self.branches = nn.ModuleList(nn.Sequential(nn.Conv2d(8, 64, 1), nn.Conv2d(64, 4, 3, padding=1))
                                      for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        return torch.cat([branch(x) for branch in self.branches], dim=1)


def broken() -> Broken:
    """The :class:`Broken` model, seeded, in eval mode (a factory for specs)."""
    torch.manual_seed(0)
    return Broken().eval()
