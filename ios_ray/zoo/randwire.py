"""RandWire-WS(N=32, K=4, P=0.75), small regime (Xie et al. 2019), for 3x224x224 inputs."""

from __future__ import annotations

import random

import torch
from torch import nn

from ios_ray.zoo.nasnet_a import SepConv


def watts_strogatz_dag(n: int, k: int, p: float, seed: int) -> list[tuple[int, int]]:
    """Edges (u < v) of a connected Watts-Strogatz graph, oriented from the lower to the higher node index."""
    if not 2 <= k < n:
        raise ValueError(f"a Watts-Strogatz graph needs 2 <= k < n, got k={k}, n={n}")
    rng = random.Random(seed)
    while True:
        adj: list[set[int]] = [set() for _ in range(n)]
        for u in range(n):
            for j in range(1, k // 2 + 1):
                adj[u].add((u + j) % n)
                adj[(u + j) % n].add(u)
        for j in range(1, k // 2 + 1):  # rewire each ring edge (u, u + j) with probability p
            for u in range(n):
                if rng.random() >= p or len(adj[u]) >= n - 1:
                    continue
                w = rng.randrange(n)
                while w == u or w in adj[u]:
                    w = rng.randrange(n)
                v = (u + j) % n
                adj[u].remove(v)
                adj[v].remove(u)
                adj[u].add(w)
                adj[w].add(u)
        seen, todo = {0}, [0]
        while todo:
            new = adj[todo.pop()] - seen
            seen |= new
            todo.extend(new)
        if len(seen) == n:
            return sorted({(min(u, v), max(u, v)) for u in range(n) for v in adj[u]})


class RandWireStage(nn.Module):
    """A randomly wired stage: each node sums its inputs, then ReLU-sepconv3x3-BN; output = sum of sink nodes."""

    def __init__(self, in_ch: int, out_ch: int, nodes: int, seed: int, k: int = 4, p: float = 0.75) -> None:
        super().__init__()
        self.edges = watts_strogatz_dag(nodes, k, p, seed)
        self.preds: list[list[int]] = [[u for u, w in self.edges if w == v] for v in range(nodes)]
        sources = {u for u, _ in self.edges}
        self.sinks = [v for v in range(nodes) if v not in sources]
        self.ops = nn.ModuleList(
            SepConv(out_ch, out_ch, 3) if preds else SepConv(in_ch, out_ch, 3, stride=2) for preds in self.preds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs: list[torch.Tensor] = []
        for op, preds in zip(self.ops, self.preds):
            agg = outs[preds[0]] if preds else x
            for u in preds[1:]:
                agg = agg + outs[u]
            outs.append(op(agg))
        y = outs[self.sinks[0]]
        for v in self.sinks[1:]:
            y = y + outs[v]
        return y


class RandWire(nn.Module):
    """Small-regime RandWire: conv stem (C/2, C), random stages of C, 2C, 4C channels, 1280-d 1x1 conv head."""

    def __init__(self, seed: int = 0, channels: int = 78, nodes: int = 32, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels // 2, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels // 2)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels // 2, channels, 3, 2, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.stage1 = RandWireStage(channels, channels, nodes, seed * 10 + 1)
        self.stage2 = RandWireStage(channels, 2 * channels, nodes, seed * 10 + 2)
        self.stage3 = RandWireStage(2 * channels, 4 * channels, nodes, seed * 10 + 3)
        self.relu = nn.ReLU()
        self.conv_head = nn.Conv2d(4 * channels, 1280, 1, bias=False)
        self.bn_head = nn.BatchNorm2d(1280)
        self.relu_head = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        x = self.relu(self.stage3(self.stage2(self.stage1(x))))
        x = self.relu_head(self.bn_head(self.conv_head(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def randwire(seed: int = 0, channels: int = 78, nodes: int = 32) -> RandWire:
    """A randomly initialised RandWire-WS(nodes, 4, 0.75) whose graphs derive from seed, in eval mode."""
    return RandWire(seed, channels, nodes).eval()
