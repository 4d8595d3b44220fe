"""Schedule builders for the runtime tests (sequential, greedy, IOS-like, DP), and checks that they are valid.

The IOS-like builder mixes every kind of stage the runtime executes: per block it repeatedly takes the ready
units, runs the largest set of them that :func:`can_merge` allows as a merge stage, and otherwise runs them as
one concurrent stage whose groups are chains (a unit followed by the only user it alone unblocks, up to three).
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

from bench.synthetic import SyntheticCost
from ios_ray.frontend import import_module
from ios_ray.ir import Block, Graph
from ios_ray.schedule import BlockSchedule, Schedule, check_schedule
from ios_ray.scheduler import SearchParams, greedy_stages, optimize_graph, sequential_stages
from ios_ray.stage import Stage, can_merge
from tests.helpers import randomise_batchnorm
from ios_ray.zoo import ZOO

StageBuilder = Callable[[Graph, Block], tuple[Stage, ...]]
MAX_CHAIN = 3


def ios_like_stages(graph: Graph, block: Block) -> tuple[Stage, ...]:
    """Merge stages wherever ready convs can merge, else concurrent stages of chains (see the module docstring)."""
    inside, done, stages = set(block.units), set(), []
    while len(done) < len(inside):
        ready = [u for u in block.units if u not in done and _ready(graph, u, inside, done)]
        merged = largest_merge(graph, ready)
        if merged:
            stage = Stage("merge", tuple((u,) for u in merged))
        else:
            claimed: set[str] = set(ready)
            stage = Stage("concurrent", tuple(_chain(graph, u, inside, done, claimed) for u in ready))
        stages.append(stage)
        done.update(stage.units)
    return tuple(stages)


def largest_merge(graph: Graph, ready: list[str]) -> tuple[str, ...]:
    """The largest set of ready units that can run as one merged conv (empty if none)."""
    best: list[str] = []
    for anchor in ready:
        subset = [anchor]
        for other in ready:
            if other != anchor and can_merge(graph, [*subset, other]):
                subset.append(other)
        if len(subset) > max(1, len(best)):
            best = subset
    return tuple(best)


def _ready(graph: Graph, unit_id: str, inside: set[str], done: set[str]) -> bool:
    return all(s in done or s not in inside for s in graph.unit(unit_id).sources)


def _chain(graph: Graph, first: str, inside: set[str], done: set[str], claimed: set[str]) -> tuple[str, ...]:
    """``first`` then, while short enough, the one user of the last unit that needs nothing else left."""
    chain = [first]
    while len(chain) < MAX_CHAIN:
        users = [v for v in graph.users[chain[-1]] if v in inside and v not in claimed]
        if len(users) != 1 or not _ready(graph, users[0], inside, done | set(chain)):
            break
        chain.append(users[0])
        claimed.add(users[0])
    return tuple(chain)


def dp_blocks(graph: Graph) -> tuple[BlockSchedule, ...]:
    """The IOS DP's block schedules under the search's synthetic latency model (pruned r=2, s=2 to stay quick)."""
    return optimize_graph(graph, SyntheticCost(graph), SearchParams(r=2, s=2)).schedules


def make_schedule(graph: Graph, builder: StageBuilder | None, batch: int, device: str = "cpu",
                  model: str = "test", kernels: str = "eager") -> Schedule:
    """A schedule of ``graph`` with the stages of ``builder`` per block (None: the DP's stages), run with
    ``kernels``."""
    if builder is None:
        blocks = dp_blocks(graph)
    else:
        blocks = tuple(BlockSchedule(b.index, builder(graph, b)) for b in graph.blocks)
    return Schedule(model, graph.fingerprint, device, batch, blocks, input_shape=graph.input_shape,
                    memory_format=graph.memory_format, kernels=kernels)


BUILDERS: dict[str, StageBuilder | None] = {
    "sequential": sequential_stages, "greedy": greedy_stages, "ios_like": ios_like_stages, "dp": None,
}


class Tiny(nn.Module):
    """A small Inception-like model: a stem, four branches (two chains, a pool), a concat, a head."""

    input_shape = (3, 16, 16)

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.b1 = nn.Conv2d(8, 4, 1)
        self.b2 = nn.Sequential(nn.Conv2d(8, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU())
        self.b3 = nn.Sequential(nn.Conv2d(8, 4, (1, 3), padding=(0, 1)), nn.Conv2d(4, 4, (3, 1), padding=(1, 0)))
        self.b4 = nn.Sequential(nn.AvgPool2d(3, 1, 1), nn.Conv2d(8, 2, 1))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.head(torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1))


def tiny() -> nn.Module:
    """A Tiny model with randomised batch-norms."""
    torch.manual_seed(0)
    return randomise_batchnorm(Tiny())


@pytest.fixture(scope="module")
def inception_graph() -> Graph:
    model = ZOO["inception_v3"]
    return import_module(model.build(), torch.randn(1, *model.input_shape)).graph


@pytest.mark.parametrize("name", list(BUILDERS))
def test_builders_make_valid_schedules(inception_graph: Graph, name: str) -> None:
    check_schedule(make_schedule(inception_graph, BUILDERS[name], 1), inception_graph)


def test_ios_like_mixes_merges_and_multi_unit_groups(inception_graph: Graph) -> None:
    stages = make_schedule(inception_graph, ios_like_stages, 1).stages
    merges = [s for s in stages if s.strategy == "merge"]
    chained = [s for s in stages if sum(len(g) > 1 for g in s.groups) >= 2]
    assert len(merges) >= 5 and len(chained) >= 3
    assert all(can_merge(inception_graph, s.units) for s in merges)
