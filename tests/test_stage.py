"""Stage keys: content hashes independent of unit names and positions; identical stages share one key."""

from __future__ import annotations

import json

import pytest

from ios_ray.frontend import import_model
from ios_ray.ir import GRAPH_INPUT, Graph, Value
from ios_ray.stage import Stage, StageKeys, can_merge
from tests.helpers import zoo_graph, zoo_plan
from tests.random_graphs import conv_unit


def _fork(prefix: str, kernels: tuple[int, int] = (1, 3)) -> Graph:
    units = (
        conv_unit(f"{prefix}stem", [GRAPH_INPUT], 3, 16, 3),
        conv_unit(f"{prefix}a", [f"{prefix}stem"], 16, 32, kernels[0]),
        conv_unit(f"{prefix}b", [f"{prefix}stem"], 16, 32, kernels[1]),
    )
    return Graph(prefix or "g", (3, 8, 8), units, Value(((f"{prefix}a",), (f"{prefix}b",))))


def test_description_is_canonical_json() -> None:
    graph = import_model("squeezenet").graph
    keys = StageKeys(graph)
    stage = Stage("concurrent", (("fire2.expand1x1",), ("fire2.expand3x3",)))
    text = keys.describe_json(stage)
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    assert "fire2" not in text


def test_key_ignores_names_and_group_order_but_not_content() -> None:
    one, two = StageKeys(_fork("x_")), StageKeys(_fork("y_"))
    assert one.key(Stage("concurrent", (("x_a",), ("x_b",)))) == two.key(Stage("concurrent", (("y_b",), ("y_a",))))
    assert one.key(Stage("concurrent", (("x_a",), ("x_b",)))) != one.key(Stage("merge", (("x_a",), ("x_b",))))
    assert one.key(Stage("concurrent", (("x_a",),))) != one.key(Stage("concurrent", (("x_b",),)))
    other = StageKeys(_fork("x_", kernels=(1, 5)))
    assert one.key(Stage("concurrent", (("x_a",), ("x_b",)))) != other.key(Stage("concurrent", (("x_a",), ("x_b",))))


def test_mergeable_convs() -> None:
    graph = _fork("")
    assert can_merge(graph, ["a", "b"])
    assert not can_merge(graph, ["a"])
    assert not can_merge(graph, ["stem", "a"])


@pytest.mark.slow
def test_nasnet_normal_cells_share_stage_keys() -> None:
    graph, plan = zoo_graph("nasnet_a"), zoo_plan("nasnet_a")
    by_size: dict[int, list[frozenset[str]]] = {}
    for block, block_plan in zip(graph.blocks, plan.blocks):
        by_size.setdefault(len(block.units), []).append(block_plan.keys)
    normal = by_size[16]
    assert len(normal) >= 12
    assert normal[1] == normal[2] == normal[3]  # cells 2-4 of the first stack: one set of keys
    assert len(plan.stages) < plan.block_stage_sum
