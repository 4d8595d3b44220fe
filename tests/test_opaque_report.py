"""The opaque report: counts and shares (pure), ``ios-ray inspect`` printing it, the search's one-line warning."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from rich.console import Console

from ios_ray.app.search.progress import RichSearchProgress
from ios_ray.blocks import find_blocks
from ios_ray.frontend import opaque_report
from ios_ray.ir import GRAPH_INPUT, Graph, Unit, Value
from ios_ray.scheduler import SearchParams, plan_graph
from tests.helpers import HANG_S


def chain_graph(kinds: list[str]) -> Graph:
    """A chain of units of these kinds; opaque ones run a permute (the second one then a LayerNorm), 10 FLOPs each."""
    units, source = [], GRAPH_INPUT
    for i, kind in enumerate(kinds):
        attrs = {"op": "call_method:permute", "args": "x"} if kind == "opaque" else {}
        if kind == "opaque" and sum(u.kind == "opaque" for u in units) == 1:
            attrs["then"] = ("call_module:LayerNorm(('x',), {})", "relu")
        units.append(Unit(f"u{i}", kind, (Value.of(source),), (4, 2, 2), attrs, flops=10))
        source = units[-1].id
    return Graph("chain", (4, 2, 2), tuple(units), Value.of(source), find_blocks(units, Value.of(source)))


def test_report_counts_shares_and_op_kinds() -> None:
    report = opaque_report(chain_graph(["pool", "opaque", "pool", "opaque", "pool"]))
    assert (report.units, report.opaque, report.share, report.flops_share) == (5, 2, 0.4, 0.4)
    assert report.ops == (("permute", 2), ("LayerNorm", 1))
    assert report.summary() == "2 of 5 units are opaque (40.0% of units, 40.0% of FLOPs): permute x2, LayerNorm x1"
    assert opaque_report(chain_graph(["pool"])).summary() == "0 of 1 units are opaque (0.0% of units, 0.0% of FLOPs)"


def planned_output(graph: Graph) -> str:
    console = Console(file=io.StringIO(), width=60)
    RichSearchProgress(console).planned(graph, plan_graph(graph, SearchParams(r=2, s=2)))
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_search_warns_in_one_line_above_ten_percent_opaque() -> None:
    warned = [line for line in planned_output(chain_graph(["pool"] * 8 + ["opaque"] * 2)).splitlines()
              if "opaque" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: 2 of 10 units are opaque (20.0% of units")
    assert warned[0].endswith("(see ios-ray inspect)"), "one line, however narrow the console"
    assert "warning" not in planned_output(chain_graph(["pool"] * 9 + ["opaque"]))


@pytest.mark.slow
def test_inspect_prints_the_opaque_report() -> None:
    result = subprocess.run([sys.executable, "-m", "ios_ray", "inspect", "--model", "tests.user_models:unknown_ops"],
                            capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    assert "1 of 4 units are opaque (25.0% of units" in result.stdout.splitlines()[-1]
    as_json = subprocess.run([sys.executable, "-m", "ios_ray", "inspect", "--model", "tests.user_models:unknown_ops",
                              "--json"], capture_output=True, text=True, timeout=HANG_S)
    opaque = json.loads(as_json.stdout)["opaque"]
    assert (opaque["units"], opaque["opaque"]) == (4, 1) and {o["op"] for o in opaque["ops"]} == {"cumsum"}
