"""The zoo imports as it did before the frontend learnt torchvision's and timm's idioms (``zoo_baseline.json``).

No zoo model gains units, blocks or distinct candidate stages. Inception V3, SqueezeNet and RandWire import into the
very same graph (the fingerprint covers every unit's kind, attributes, inputs and shapes), so their stage keys and
the measurements users stored under them stay valid. NASNet-A changed on purpose: its five ReLUs that were opaque
units are now an ``elementwise`` unit (four, each on a tensor several units read) and the epilogue of a ``concat``
(the last one), since no opaque unit may be an activation; 62 of its 34,254 stage keys changed, the count did not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ios_ray.scheduler import BlockDag
from ios_ray.zoo import ZOO
from tests.helpers import zoo_graph, zoo_plan

BASELINE = json.loads((Path(__file__).parent / "zoo_baseline.json").read_text())
UNCHANGED = ("inception_v3", "squeezenet", "randwire")


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name == "nasnet_a" else name
                                  for name in ZOO])
def test_no_zoo_model_gains_units_or_blocks(name: str) -> None:
    graph, baseline = zoo_graph(name), BASELINE[name]
    assert len(graph.units) == baseline["units"]
    assert [len(b.units) for b in graph.blocks] == baseline["blocks"]
    assert [BlockDag.of(graph, b).width for b in graph.blocks] == baseline["widths"]


@pytest.mark.parametrize("name", UNCHANGED)
def test_unchanged_zoo_graphs_keep_their_fingerprint(name: str) -> None:
    assert zoo_graph(name).fingerprint == BASELINE[name]["fingerprint"]


@pytest.mark.parametrize("name", ["inception_v3", "squeezenet"])
def test_zoo_distinct_stages_unchanged(name: str) -> None:
    assert len(zoo_plan(name).stages) == BASELINE[name]["distinct_stages"]


@pytest.mark.slow
def test_nasnet_distinct_stages_unchanged() -> None:
    graph = zoo_graph("nasnet_a")
    assert not [u.id for u in graph.units if u.kind == "opaque" and u.attrs["op"].endswith("ReLU")]
    assert len(zoo_plan("nasnet_a").stages) == BASELINE["nasnet_a"]["distinct_stages"]
