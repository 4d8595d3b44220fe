"""Lazy search against measuring everything: stages measured, DP rounds, wall time and the schedule's cost.

(a) Simulated: Inception V3, NASNet-A and RandWire on ``sim:v100`` and ``sim:k80`` at batches 1 and 32. The sim
model is driven directly, in this process (no Ray, no store), so both searches see the very same latencies: the
exhaustive search prices every planned stage and runs the DP; the lazy one measures what
:func:`~ios_ray.scheduler.lazy.next_round` asks for, round after round. Per case: stages measured by each and
their ratio, rounds, wall time (pricing and DP; the lazy search's one-off :class:`LazySpace` build shown apart, per
model), the two schedules' costs, and how often a stage measured below the lower bound it had when it was chosen.
Targets: equal costs in every case, and at least 5x fewer stages measured over all cases together.

(b) CPU: SqueezeNet and Inception V3 at batch 1, each searched twice on fresh stores through the real job
(``--measure all`` and ``--measure lazy``, the CLI's path, on this machine's CPU), then both schedules timed end to
end in interleaved rounds in one process. Targets: fewer stages measured, and the lazy schedule within noise of
the exhaustive one (median ratio within 5%).

Run: python bench/lazy_search.py [--only sim|cpu] [--models ...]   (exit code 1 when a target is missed)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from ios_ray.frontend import import_model
from ios_ray.ir import Graph
from ios_ray.profiler.sim import stage_latency_ms
from ios_ray.scheduler import SearchParams, TableLatency, optimize_graph, plan_graph
from ios_ray.scheduler.lazy import LazyParams, LazySpace, next_round
from ios_ray.stage import Stage, StageKeys

SIM_MODELS = ("inception_v3", "nasnet_a", "randwire")
SIM_GPUS = ("v100", "k80")
SIM_BATCHES = (1, 32)
RATIO_TARGET = 5.0
#: Stages per setting and round in the sim part (as the job asks of 2 sim actors: see ios_ray.app.job).
ROUND_SIZE = 256


@dataclass(frozen=True)
class SimCase:
    """One simulated setting searched both ways."""

    model: str
    device: str
    batch: int
    all_stages: int
    all_s: float
    all_cost: float
    lazy_stages: int
    lazy_s: float
    lazy_dp_s: float
    rounds: int
    lazy_cost: float
    below_bound: int
    certified: bool

    @property
    def ratio(self) -> float:
        """Stages measured, exhaustive over lazy."""
        return self.all_stages / self.lazy_stages

    @property
    def exact(self) -> bool:
        """Whether the lazy schedule costs what the exhaustive one does."""
        return math.isclose(self.lazy_cost, self.all_cost, rel_tol=1e-9)


class Pricer:
    """The sim latency of a stage key, priced from the same representative stage per key in both searches.

    Stages with one key can differ in the order of their groups, which the sim model (unlike the key) sees; the
    store likewise keeps one latency per key, from whichever stage was measured first.
    """

    def __init__(self, graph: Graph, stages: dict[str, Stage], gpu: str, batch: int) -> None:
        self.graph, self.stages, self.gpu, self.batch = graph, stages, gpu, batch
        self.priced: dict[str, float] = {}

    def __call__(self, key: str) -> float:
        """The latency of ``key`` in ms."""
        if key not in self.priced:
            self.priced[key] = stage_latency_ms(self.graph, self.stages[key], self.batch, self.gpu)
        return self.priced[key]


def exhaustive(graph: Graph, keys: StageKeys, stages: dict, price: Pricer) -> tuple[int, float, float]:
    """Price every planned stage and run the DP: (stages, seconds, cost)."""
    start = time.perf_counter()
    table = {key: price(key) for key in stages}
    cost = optimize_graph(graph, TableLatency(keys, table)).cost
    return len(table), time.perf_counter() - start, cost


def lazy(graph: Graph, keys: StageKeys, space: LazySpace, price: Pricer
         ) -> tuple[int, float, float, int, float, int, bool]:
    """Measure what the rounds ask for, then run the DP on measured stages only.

    Returns (stages, seconds, seconds in rounds, rounds, cost, stages measured below their bound, certified).
    """
    table: dict[str, float] = {}
    start = time.perf_counter()
    dp = 0.0
    rounds = below = 0
    while True:
        tick = time.perf_counter()
        found = next_round(space, table, LazyParams(round_size=ROUND_SIZE))
        dp += time.perf_counter() - tick
        if found.done:
            break
        rounds += 1
        for key, bound in zip(found.measure, found.bounds):
            table[key] = price(key)
            below += int(table[key] < bound)
    cost = optimize_graph(graph, TableLatency(keys, table, missing=math.inf)).cost
    return len(table), time.perf_counter() - start, dp, rounds, cost, below, found.certified


def sim_cases(models: list[str], console: Console) -> list[SimCase]:
    """Every simulated case, model by model."""
    cases = []
    for model in models:
        graph = import_model(model).graph
        keys = StageKeys(graph)
        stages = plan_graph(graph, SearchParams(), keys).stages
        start = time.perf_counter()
        space = LazySpace.build(graph, SearchParams(), keys)
        console.print(f"{model}: {len(stages):,} planned stages; lazy space built in "
                      f"{time.perf_counter() - start:.1f} s ({len(space.blocks)} distinct blocks)")
        representatives = {**{p.key: p.stage for p in space.planned}, **{k: p.stage for k, p in stages.items()}}
        for gpu in SIM_GPUS:
            for batch in SIM_BATCHES:
                every = exhaustive(graph, keys, stages, Pricer(graph, representatives, gpu, batch))
                found = lazy(graph, keys, space, Pricer(graph, representatives, gpu, batch))
                cases.append(SimCase(model, f"sim:{gpu}", batch, *every, *found))
                console.print(f"  sim:{gpu} batch {batch}: {cases[-1].lazy_stages:,} of {every[0]:,} measured")
    return cases


def sim_table(cases: list[SimCase]) -> tuple[Table, bool]:
    """The comparison table of (a) and whether every target is met."""
    table = Table(title="(a) lazy against all on sim devices (latencies simulated, never measured)")
    for column in ("model", "device", "batch", "all: stages", "all: s", "lazy: stages", "ratio", "rounds",
                   "lazy: s (rounds)", "all: cost ms", "lazy: cost ms", "equal", "below bound", "certified"):
        table.add_column(column, justify="right")
    for c in cases:
        table.add_row(c.model, c.device, str(c.batch), f"{c.all_stages:,}", f"{c.all_s:.1f}", f"{c.lazy_stages:,}",
                      f"{c.ratio:.2f}x", str(c.rounds), f"{c.lazy_s:.1f} ({c.lazy_dp_s:.1f})", f"{c.all_cost:.4f}",
                      f"{c.lazy_cost:.4f}", "yes" if c.exact else "NO", str(c.below_bound),
                      "yes" if c.certified else "no")
    total = sum(c.all_stages for c in cases) / sum(c.lazy_stages for c in cases)
    passed = all(c.exact for c in cases) and total >= RATIO_TARGET
    table.add_row("all cases", "", "", f"{sum(c.all_stages for c in cases):,}", "",
                  f"{sum(c.lazy_stages for c in cases):,}", f"{total:.2f}x", "", "", "", "",
                  "PASS" if all(c.exact for c in cases) else "FAIL",
                  f"target >= {RATIO_TARGET:.0f}x: {'PASS' if total >= RATIO_TARGET else 'FAIL'}", "")
    return table, passed


def parse_args() -> argparse.Namespace:
    """The bench's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("sim", "cpu"), default=None, help="run only (a) or (b)")
    parser.add_argument("--models", default=",".join(SIM_MODELS), help="(a) comma-separated models")
    return parser.parse_args()


def main() -> int:
    """Run (a) then (b); 0 when every target is met."""
    args = parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start")
    passed = True
    if args.only in (None, "sim"):
        table, ok = sim_table(sim_cases(args.models.split(","), console))
        console.print(table)
        passed &= ok
    console.print(f"load {os.getloadavg()[0]:.1f} at end; overall: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
