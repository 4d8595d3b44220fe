"""Helpers shared by the tests: randomised models and error measures."""

from __future__ import annotations

import torch
from torch import nn

from ios_ray.app.bench import relative_error

__all__ = ["randomise_batchnorm", "relative_error"]


def randomise_batchnorm(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm random running statistics and affine parameters, so that folding is exercised."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for bn in module.modules():
            if isinstance(bn, nn.BatchNorm2d):
                size = bn.num_features
                bn.running_mean.copy_(torch.rand(size, generator=generator) - 0.5)
                bn.running_var.copy_(torch.rand(size, generator=generator) + 0.5)
                if bn.affine:
                    bn.weight.copy_(torch.rand(size, generator=generator) + 0.5)
                    bn.bias.copy_(torch.rand(size, generator=generator) - 0.5)
    return module.eval()
