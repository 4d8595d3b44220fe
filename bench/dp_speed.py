"""How fast the IOS DP runs: transitions per second on the largest blocks, with the synthetic cost.

Run ``python bench/dp_speed.py``. It searches every RandWire block of at least 30 units and one NASNet-A normal
cell, unpruned (the target: at least 50,000 transitions/s) and, for reference, with the paper's pruning r=3,
s=8. The paper's Table 1 counts for the largest blocks are shown beside ours.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.synthetic import SyntheticCost  # noqa: E402
from ios_ray.frontend import import_model
from ios_ray.ir import Block, Graph
from ios_ray.scheduler import BlockDag, SearchParams, optimize_block

TARGET = 50_000
PRUNED = SearchParams(r=3, s=8)
UNPRUNED = PRUNED.unpruned
#: The paper's Table 1: transitions #(S, S') of the largest block, unpruned.
PAPER_TRANSITIONS = {"randwire": 1.2e6, "nasnet_a": 3.1e5}


@dataclass(frozen=True)
class Case:
    """One block to search: the model it comes from, a label, the graph and the block."""

    model: str
    label: str
    graph: Graph
    block: Block


@dataclass(frozen=True)
class Row:
    """One timed search of one case."""

    case: Case
    params: SearchParams
    units: int
    width: int
    states: int
    transitions: int
    seconds: float

    @property
    def rate(self) -> float:
        """Transitions per second."""
        return self.transitions / self.seconds


def model_cases() -> list[Case]:
    """RandWire blocks of at least 30 units and one NASNet-A normal cell, from the frontend."""
    randwire = import_model("randwire").graph
    cases = [
        Case("randwire", f"randwire block {b.index}", randwire, b) for b in randwire.blocks if len(b.units) >= 30
    ]
    nasnet = import_model("nasnet_a").graph
    largest = max(nasnet.blocks, key=lambda b: len(b.units))
    normal = next((b for b in nasnet.blocks if any(u.startswith("cells.1.") for u in b.units)), largest)
    kind = "normal cell" if normal is not largest else "largest block"
    return [*cases, Case("nasnet_a", f"nasnet_a block {normal.index} ({kind})", nasnet, normal)]


def run(case: Case, params: SearchParams) -> Row:
    """Search one block once and time it."""
    dag = BlockDag.of(case.graph, case.block)
    cost = SyntheticCost(case.graph)
    start = time.perf_counter()
    result = optimize_block(case.graph, case.block, cost, params)
    seconds = time.perf_counter() - start
    stats = result.stats
    return Row(case, params, dag.size, dag.width, stats.states, stats.transitions, seconds)


def table(rows: list[Row]) -> str:
    """The rows as an aligned text table."""
    header = ("block", "pruning", "n", "d", "states", "transitions", "paper", "seconds", "trans/s", "target")
    lines = [header]
    for row in rows:
        unpruned = row.params == UNPRUNED
        paper = PAPER_TRANSITIONS.get(row.case.model) if unpruned else None
        verdict = ("PASS" if row.rate >= TARGET else "FAIL") if unpruned else "-"
        lines.append((
            row.case.label, "none" if unpruned else f"r={row.params.r} s={row.params.s}", str(row.units),
            str(row.width), f"{row.states:,}", f"{row.transitions:,}", f"{paper:.1e}" if paper else "-",
            f"{row.seconds:.2f}", f"{row.rate:,.0f}", verdict,
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in lines)


def main() -> None:
    """Run every case unpruned and pruned and print the table."""
    cases = model_cases()
    rows = [run(case, params) for case in cases for params in (UNPRUNED, PRUNED)]
    print(table(rows))
    unpruned = [row for row in rows if row.params == UNPRUNED]
    passed = all(row.rate >= TARGET for row in unpruned)
    print(f"\ntarget: unpruned DP >= {TARGET:,} transitions/s on every block: {'PASS' if passed else 'FAIL'}")


if __name__ == "__main__":
    main()
