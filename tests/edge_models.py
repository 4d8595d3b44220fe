"""Small models at the edges of what the import folds and what fused kernels run: layer options that change what a
conv, a batch-norm, an activation or a pool computes (padding modes, batch statistics, per-channel slopes, ceil mode,
a divisor), sums that are not residual adds, multiplies that are not by numbers, tensors read before and after an
activation or a shortcut. Each must equal eager, whatever units it imports into (``tests/test_edge_models.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

C = 8


class Edge(nn.Module):
    """A model of :data:`C` channels, 12x12."""

    input_shape = (C, 12, 12)


def conv(cin: int = C, cout: int = C, k: int = 3, **options: object) -> nn.Conv2d:
    """A conv padded to keep the size unless told otherwise."""
    options.setdefault("padding", k // 2)
    return nn.Conv2d(cin, cout, k, **options)  # type: ignore[arg-type]


class PaddingModes(Edge):
    """Convs padded by reflection, circularly and by replication (not with zeros)."""

    def __init__(self) -> None:
        super().__init__()
        self.r, self.c, self.p = (conv(padding_mode=mode) for mode in ("reflect", "circular", "replicate"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.relu(self.r(x)), F.relu(self.c(x)), self.p(x)], 1)


class BatchStatistics(Edge):
    """A batch-norm without running statistics (it normalises by the batch's, even in eval mode) and one without
    affine parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = conv(), conv(bias=False), conv()
        self.batch, self.plain = nn.BatchNorm2d(C, track_running_stats=False), nn.BatchNorm2d(C, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(F.relu(self.batch(self.a(x))) + F.relu(self.plain(self.b(x))))


class Activations(Edge):
    """Activations with their options: a per-channel PReLU, slopes, bounds, GELU's tanh form, softplus's beta."""

    def __init__(self) -> None:
        super().__init__()
        self.acts = nn.ModuleList([nn.ReLU6(), nn.Hardswish(), nn.LeakyReLU(0.3), nn.PReLU(C), nn.ELU(0.7),
                                   nn.GELU(approximate="tanh"), nn.SiLU(), nn.Mish(), nn.Hardtanh(-0.3, 0.4),
                                   nn.Softplus(beta=2.0)])
        self.convs = nn.ModuleList(conv() for _ in self.acts)
        with torch.no_grad():
            self.acts[3].weight.copy_(torch.linspace(-1, 1, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([act(c(x)) for act, c in zip(self.acts, self.convs)], 1)


class Differences(Edge):
    """Differences and a weighted add where a residual sum would be: ``relu(conv(x) - x)``, ``add(a, x, alpha=)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = conv(), conv()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.a(x) - x) + F.relu(x - self.b(x)) + torch.add(self.a(x), x, alpha=2.5)


class ReadBeforeAndAfter(Edge):
    """A conv's output read before its activation and batch-norm too, and a shortcut read again after its sum."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = conv(), conv(), conv(), conv()
        self.bn = nn.BatchNorm2d(C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        s = self.b(F.relu(a)) + self.bn(a) + a
        y = F.relu(self.c(s) + s)
        return self.d(y) + s * 3


class Pools(Edge):
    """Pools with ceil mode, padding left out of the average, and a divisor of their own."""

    input_shape = (C, 13, 13)

    def __init__(self) -> None:
        super().__init__()
        self.a = conv()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        return torch.cat([
            F.max_pool2d(a, 3, 2, ceil_mode=True),
            F.avg_pool2d(a, 3, 2, padding=1, count_include_pad=False, ceil_mode=True)[:, :, 1:, 1:],
            F.avg_pool2d(a, 3, 2, padding=1, divisor_override=5, ceil_mode=True)[:, :, :-1, :-1],
        ], 1)


class ConvOptions(Edge):
    """Dilation, groups, ``padding="same"`` with dilation, a 1x5 kernel, no bias, and a transposed conv with an
    output padding."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = conv(dilation=2, padding=2), conv(groups=4)
        self.c, self.d = conv(padding="same", dilation=3), nn.Conv2d(C, C, (1, 5), padding=(0, 2))
        self.e, self.t = conv(bias=False), nn.ConvTranspose2d(C, C, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([self.a(x), self.b(x), self.c(x), self.d(x), self.e(x)], 1)
        return y.sum(1, keepdim=True) + F.avg_pool2d(F.relu(self.t(x)), 2)


class Multiplies(Edge):
    """Multiplies by numbers, by a scalar parameter, by a per-channel parameter, and by a per-sample tensor (which
    no conv's weights can hold)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = conv(), conv()
        self.s, self.v = nn.Parameter(torch.tensor(1.7)), nn.Parameter(torch.randn(1, C, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        per_sample = x.mean((1, 2, 3), keepdim=True)
        return self.a(x) * 0.3 + self.b(x) * self.s + self.a(x) * self.v + self.b(x) / 4 + self.a(x) * per_sample


class ParallelSums(Edge):
    """Parallel branches on one input summed (a re-parameterisation candidate: convs, a batch-norm of the input), then
    a dilated conv and a multiple of the first conv again."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = conv(), conv(k=1), conv(), conv(padding=2, dilation=2)
        self.bn = nn.BatchNorm2d(C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.a(x) + self.b(x) + self.bn(x) + self.c(x)) + self.d(x) - self.a(x) * 0.5


class InPlace(Edge):
    """In-place ops on tensors read before and after them: ``relu_`` on a tensor a conv read first, ``+=``, a
    ``mul_`` after the tensor fed a sum."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = conv(), conv(), conv()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        r = self.b(a)
        a.relu_()
        y = self.c(a)
        y += a
        a.mul_(2)
        return torch.cat([r, y + a], 1)


EDGE_MODELS = {model.__name__: model for model in (
    PaddingModes, BatchStatistics, Activations, Differences, ReadBeforeAndAfter, Pools, ConvOptions, Multiplies,
    ParallelSums, InPlace)}
