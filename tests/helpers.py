"""Helpers shared by the tests: randomised models and error measures."""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn

from ios_ray.app.bench import relative_error
from ios_ray.frontend import import_model
from ios_ray.ir import Graph
from ios_ray.scheduler import SearchParams, plan_graph
from ios_ray.scheduler.plan import Plan

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


@lru_cache(maxsize=None)
def zoo_graph(name: str) -> Graph:
    """A zoo model's graph, imported once per test session."""
    return import_model(name).graph


@lru_cache(maxsize=None)
def zoo_plan(name: str, r: int = 3, s: int = 8) -> Plan:
    """A zoo model's plan at (r, s), made once per test session (NASNet-A's takes tens of seconds)."""
    return plan_graph(zoo_graph(name), SearchParams(r=r, s=s))
