"""The model zoo: every model builds in eval mode, traces with torch.fx and keeps the expected structure."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import fx, nn

from ios_ray.zoo import ZOO, ZooModel
from ios_ray.zoo.inception_v3 import InceptionA, InceptionB, InceptionC, InceptionD, InceptionE
from ios_ray.zoo.nasnet_a import NormalCell, ReductionCell, nasnet_a
from ios_ray.zoo.randwire import RandWireStage, randwire, watts_strogatz_dag

# NASNet-A Large is checked once, on its own, in test_nasnet_a_large; the others run in full here.
SMALL: dict[str, tuple[Callable[[], nn.Module], tuple[int, int, int]]] = {
    "inception_v3": (ZOO["inception_v3"].build, ZOO["inception_v3"].input_shape),
    "squeezenet": (ZOO["squeezenet"].build, ZOO["squeezenet"].input_shape),
    "randwire": (ZOO["randwire"].build, ZOO["randwire"].input_shape),
    "nasnet_a_1": (lambda: nasnet_a(cell_repeats=1), ZOO["nasnet_a"].input_shape),
}


def modules_of(model: nn.Module, kind: type) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, kind)]


def check_units(gm: fx.GraphModule) -> None:
    """Every BatchNorm reads a conv, and every depthwise conv reads a ReLU (sepconv units)."""
    mods = dict(gm.named_modules())
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        mod, arg = mods[node.target], node.args[0]
        if isinstance(mod, nn.BatchNorm2d):
            assert arg.op == "call_module" and isinstance(mods[arg.target], nn.Conv2d), node.name
        if isinstance(mod, nn.Conv2d) and mod.groups > 1:
            assert arg.op == "call_module" and isinstance(mods[arg.target], nn.ReLU), node.name


def dag_width(n: int, edges: list[tuple[int, int]]) -> int:
    """Largest antichain of a DAG: n minus a maximum matching of its transitive closure (Dilworth)."""
    reach: list[set[int]] = [set() for _ in range(n)]
    for u in reversed(range(n)):  # edges go from lower to higher index
        for a, b in edges:
            if a == u:
                reach[u] |= {b} | reach[b]
    match: dict[int, int] = {}

    def augment(u: int, seen: set[int]) -> bool:
        for v in reach[u] - seen:
            seen.add(v)
            if v not in match or augment(match[v], seen):
                match[v] = u
                return True
        return False

    return n - sum(augment(u, set()) for u in range(n))


def test_registry() -> None:
    assert list(ZOO) == ["inception_v3", "squeezenet", "nasnet_a", "randwire"]
    assert all(isinstance(m, ZooModel) and m.name == name and m.description for name, m in ZOO.items())


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in ("inception_v3", "nasnet_a_1")
                                  else name for name in SMALL])
def test_model_traces_and_matches(name: str) -> None:
    build, shape = SMALL[name]
    model = build()
    assert not any(m.training for m in model.modules())
    assert not modules_of(model, nn.Dropout)
    assert all(not r.inplace for r in modules_of(model, nn.ReLU))
    gm = fx.symbolic_trace(model)
    check_units(gm)
    x = torch.randn(1, *shape)
    with torch.no_grad():
        y = model(x)
        assert y.shape == (1, 1000)
        torch.testing.assert_close(gm(x), y, rtol=0, atol=0)


def test_inception_v3_blocks() -> None:
    model = ZOO["inception_v3"].build()
    counts = [len(modules_of(model, kind)) for kind in (InceptionA, InceptionB, InceptionC, InceptionD, InceptionE)]
    assert counts == [3, 1, 4, 1, 2]
    cats = [n for n in fx.symbolic_trace(model.Mixed_7b).graph.nodes if n.target is torch.cat]
    assert len(cats) == 3 and cats[-1].args[0][1] is cats[0] and cats[-1].args[0][2] is cats[1]


def test_squeezenet_bypass() -> None:
    model = ZOO["squeezenet"].build()
    adds = [n for n in fx.symbolic_trace(model).graph.nodes if n.op == "call_function" and n.target.__name__ == "add"]
    assert len(adds) == 4 and not modules_of(model, nn.BatchNorm2d)


def test_nasnet_a_large() -> None:
    model = ZOO["nasnet_a"].build()
    cells = list(model.cells)
    assert sum(isinstance(c, NormalCell) for c in cells) == 18
    assert [i for i, c in enumerate(cells) if isinstance(c, ReductionCell)] == [6, 13]
    for stack in (cells[0:6], cells[7:13], cells[14:20]):
        assert len({repr(c) for c in stack[2:]}) == 1  # identical cells, inputs included
        bodies = {repr([m for name, m in c.named_children() if name.startswith("comb")]) for c in stack}
        assert len(bodies) == 1  # all cells of a stack share their body; only input adjust paths differ
    fx.symbolic_trace(model)
    shapes: list[tuple[int, ...]] = []
    for cell in (cells[5], cells[12], cells[19]):
        cell.register_forward_hook(lambda _m, _i, out: shapes.append(tuple(out.shape)))
    model = model.to("meta")  # shapes only: no arithmetic
    with torch.no_grad():
        assert model(torch.randn(1, *ZOO["nasnet_a"].input_shape, device="meta")).shape == (1, 1000)
    assert shapes == [(1, 1008, 42, 42), (1, 2016, 21, 21), (1, 4032, 11, 11)]


def test_randwire_stages() -> None:
    stages = modules_of(randwire(), RandWireStage)
    assert len(stages) == 3
    assert [s.edges for s in stages] == [s.edges for s in modules_of(randwire(), RandWireStage)]
    assert len({tuple(s.edges) for s in stages}) == 3
    for s in stages:
        assert len(s.ops) == 32 and len(s.edges) == 64 and all(u < v for u, v in s.edges)
    assert max(len(s.ops) for s in stages) >= 30
    assert min(dag_width(len(s.ops), s.edges) for s in stages) >= 8


def test_watts_strogatz_is_connected_and_seeded() -> None:
    edges = watts_strogatz_dag(32, 4, 0.75, seed=7)
    assert edges == watts_strogatz_dag(32, 4, 0.75, seed=7) != watts_strogatz_dag(32, 4, 0.75, seed=8)
    comp = {0}
    for _ in range(32):
        comp |= {v for u, v in edges if u in comp} | {u for u, v in edges if v in comp}
    assert comp == set(range(32))
