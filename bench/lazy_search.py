"""Lazy search against measuring everything: stages measured, DP rounds, wall time and the schedule's cost.

(a) Simulated: Inception V3, NASNet-A and RandWire on ``sim:v100`` and ``sim:k80`` at batches 1 and 32. The sim
model is driven directly, in this process (no Ray, no store), so both searches see the very same latencies: the
exhaustive search prices every planned stage and runs the DP; the lazy one measures what
:func:`~ios_ray.scheduler.lazy.next_round` asks for, round after round. Per case: stages measured by each and
their ratio, rounds, wall time (pricing and DP; the lazy search's one-off :class:`LazySpace` build shown apart, per
model), the two schedules' costs, and how often a stage measured below the lower bound it had when it was chosen.
Targets: equal costs in every case, and at least 5x fewer stages measured over all cases together.

(b) CPU: SqueezeNet and Inception V3 at batch 1, each searched three times on fresh stores through the real job
(``--measure all`` twice, ``--measure lazy`` once: the CLI's path, on this machine's CPU), then the three schedules
and the sequential one timed end to end in interleaved rounds in one process. Two exhaustive searches of the same
model on the same machine measure every stage with its own noise and need not pick the same schedule: the second
one is the noise reference. Each schedule is also priced on the first exhaustive search's rows (noise-free view:
how much worse than that search's optimum its own measurements make it). Targets: fewer stages measured, and the
lazy schedule within noise of the exhaustive one: at most 5% slower than the slower of the two exhaustive schedules,
by the whole 95% interval of the per-round ratios (rounds time all four side by side; a lazy schedule faster than
both loses nothing, so no lower bound).

(c) Stored, with ``--store S``: a store's latencies (a GPU's, imported from the Parquet export of a gpu_check run) at
each margin of :data:`MARGINS`: per device fingerprint, how many measured stages of several units lie below the lower
bound the others give them, and the worst bound / latency: how much margin that device's noise needs (a report, no
target).

Run: python bench/lazy_search.py [--only sim|cpu|stored] [--models ...] [--store S [--store-model M]]
(exit code 1 when a target is missed)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.verdict import clears, run_parts  # noqa: E402
from ios_ray.app.cli.bench import schedule_variants, side_by_side
from ios_ray.app.cli.evaluation import predicted_ms
from ios_ray.app.search.job import SearchRequest, run_search
from ios_ray.app.search.measuring import LAZY_MARGIN
from ios_ray.app.search.progress import SilentProgress
from ios_ray.app.search.rounds import ROUND_STAGES_PER_ACTOR
from ios_ray.vocabulary import DEFAULT_SIM_ACTORS
from ios_ray.frontend import import_model, import_module
from ios_ray.ir import Graph
from ios_ray.models import resolve_model
from ios_ray.paired import REPORT_CONFIDENCE, RatioInterval, median_interval, ratios_of
from ios_ray.profiler.sim_model import stage_latency_ms
from ios_ray.runtime import Program
from ios_ray.schedule import Schedule
from ios_ray.scheduler import SearchParams, TableLatency, baseline_schedule, optimize_graph, plan_graph
from ios_ray.scheduler.estimate import estimate
from ios_ray.scheduler.lazy import LazyParams, LazySpace, next_round
from ios_ray.stage import Stage, StageKeys
from ios_ray.store import LatencyStore

SIM_MODELS = ("inception_v3", "nasnet_a", "randwire")
SIM_GPUS = ("v100", "k80")
SIM_BATCHES = (1, 32)
RATIO_TARGET = 5.0
CPU_MODELS = ("squeezenet", "inception_v3")
#: How much slower than an exhaustive search's schedule the lazy one may run (beyond noise) and still count as equal.
CPU_NOISE = 0.05
#: (c) The margins a stored run's bounds are tried at (the job's own among them).
MARGINS = (0.0, 0.02, 0.05, LAZY_MARGIN)
#: Stages per setting and round in the sim part, as the job asks of a sim device's default actors.
ROUND_SIZE = ROUND_STAGES_PER_ACTOR * DEFAULT_SIM_ACTORS


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
    """The sim latency of a stage key, priced once from any stage with that key (the sim gives a key one price)."""

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
        representatives = {p.key: p.stage for p in space.planned}
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


@dataclass(frozen=True)
class CpuSearch:
    """One search on this machine's CPU: stages measured of planned, wall time, the DP's schedule and its
    prediction, and how many measured stages fell below the lower bound the other measurements give them."""

    measured: int
    planned: int
    wall_s: float
    schedule: Schedule
    below_bound: int
    below_raw_bound: int


def cpu_search(model: str, measure: str, store: Path) -> CpuSearch:
    """Search ``model`` at batch 1 on the CPU with a fresh store (no end-to-end check: the DP's own schedule)."""
    request = SearchRequest(model=model, devices=("cpu",), batches=(1,), store=store, measure=measure, check_rounds=0)
    start = time.perf_counter()
    [outcome] = run_search(request, SilentProgress())
    wall = time.perf_counter() - start
    below = below_raw = 0
    if measure == "lazy":
        below, below_raw = bound_misses(model, store, outcome.schedule.device_fingerprint)
    return CpuSearch(outcome.measured, outcome.planned, wall, outcome.schedule, below, below_raw)


def cpu_searches(model: str, graph: Graph, console: Console) -> tuple[dict[str, CpuSearch], dict[str, float]]:
    """The model searched exhaustively (``all``), exhaustively again (``again``: the noise reference) and lazily,
    each on a fresh store; and each schedule's cost priced on the first exhaustive search's rows, over its own."""
    keys = StageKeys(graph)
    searches: dict[str, CpuSearch] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, measure in (("all", "all"), ("again", "all"), ("lazy", "lazy")):
            searches[name] = cpu_search(model, measure, Path(tmp) / f"{name}.duckdb")
            console.print(f"  {model}: {name} measured {searches[name].measured} stages in "
                          f"{searches[name].wall_s:.0f} s")
        rows = LatencyStore(Path(tmp) / "all.duckdb", create=False)
        priced = {name: predicted_ms(search.schedule, keys, rows.lookup, 1, searches["all"].schedule.device_fingerprint)
                  for name, search in searches.items()}
        rows.close()
    return searches, {name: cost / priced["all"] for name, cost in priced.items()}


def within_noise(samples: dict[str, list[float]]) -> tuple[RatioInterval, bool]:
    """The lazy schedule's time over the slower exhaustive schedule's, per round, with its interval; and whether
    that interval lies wholly at or below 1 + :data:`CPU_NOISE`."""
    slower = max(("all", "again"), key=lambda name: statistics.median(samples[name]))
    ratio = median_interval(ratios_of(samples["lazy"], samples[slower]), REPORT_CONFIDENCE)
    return ratio, clears(ratio, most=1 + CPU_NOISE)


def bound_misses(model: str, store: Path, fingerprint: str) -> tuple[int, int]:
    """How many measured stages of several units lie below the lower bound all other measurements give them, with
    the job's margin and without: measurement noise makes a bound miss on a real device."""
    space = LazySpace.build(import_model(model).graph, SearchParams())
    latency = space.vector(LatencyStore(store, create=False).lookup(space.keys, fingerprint, 1))
    misses = below_bounds(space, latency, several_units(space, latency), (LAZY_MARGIN, 0.0))
    return len(misses[LAZY_MARGIN]), len(misses[0.0])


def several_units(space: LazySpace, latency: np.ndarray) -> np.ndarray:
    """The numbers of the measured stages (``latency`` not NaN) of several units."""
    units = np.array([len(p.stage.units) for p in space.planned])
    return np.flatnonzero(~np.isnan(latency) & (units > 1))


def below_bounds(space: LazySpace, latency: np.ndarray, stages: np.ndarray, margins: Sequence[float]
                 ) -> dict[float, list[float]]:
    """Per margin, for each of ``stages`` (measured) that lies below the lower bound the other measurements in
    ``latency`` give it at that margin, bound / latency."""
    misses: dict[float, list[float]] = {margin: [] for margin in margins}
    for stage in stages:
        others = latency.copy()
        others[stage] = np.nan
        for margin in margins:
            bound = estimate(space.relations, others, margin).lower[stage]
            if latency[stage] < bound:
                misses[margin].append(float(bound / latency[stage]))
    return misses


def margin_table(model: str, store: Path, batch: int, console: Console) -> tuple[Table, bool]:
    """(c) A stored run's bounds at each of :data:`MARGINS`: per device fingerprint in ``store`` at ``batch``, how many
    measured stages of several units lie below the bound the others give them, and by how much (a report: no
    target)."""
    space = LazySpace.build(import_model(model).graph, SearchParams())
    found = LatencyStore(store, create=False)
    rows = found.query(batch=batch)
    table = Table(title=f"{model} bs{batch}: measured stages below the bound the others give them, per margin ({store})")
    for column in ("device", "fingerprint", "stages of several units", *(f"margin {m:g}" for m in MARGINS)):
        table.add_column(column, justify="right")
    for device, fingerprint in sorted(set(zip(rows.column("device").to_pylist(),
                                              rows.column("device_fingerprint").to_pylist()))):
        console.print(f"{device} {fingerprint[:12]}: relating every measured stage to the others ...")
        latency = space.vector(found.lookup(space.keys, fingerprint, batch))
        stages = several_units(space, latency)
        misses = below_bounds(space, latency, stages, MARGINS)
        table.add_row(device, fingerprint[:12], str(len(stages)), *(
            f"{len(misses[m])}" + (f" (worst {max(misses[m]):.3f})" if misses[m] else "") for m in MARGINS))
    return table, True


def time_side_by_side(model: str, schedules: dict[str, Schedule], rounds: int) -> dict[str, list[float]]:
    """Each schedule's ms per round, run whole on the CPU in interleaved rounds."""
    spec = resolve_model(model)
    torch.manual_seed(0)
    module = spec.build().eval()
    imported = import_module(module, torch.randn(1, *spec.input_shape), spec.name)
    variants = schedule_variants(Program.from_imported(imported, "cpu"), schedules)
    x = torch.randn(1, *spec.input_shape)
    return side_by_side(variants, x, warmup=3, rounds=rounds)


def cpu_table(models: list[str], rounds: int, console: Console) -> tuple[Table, bool]:
    """(b): each model searched three ways on fresh stores, then the schedules timed side by side."""
    table = Table(title=f"(b) lazy against all on this CPU, batch 1 (measured; {rounds} interleaved rounds)")
    for column in ("model", "all: stages", "all: s", "lazy: stages", "ratio", "lazy: s", "below bound (raw)",
                   "on all's rows: again, lazy", "run ms: all", "again", "lazy", "again / all", "lazy / all",
                   "lazy / slower exhaustive (95%)", "sequential ms", "target"):
        table.add_column(column, justify="right")
    passed = True
    for model in models:
        graph = import_model(model).graph
        searches, priced = cpu_searches(model, graph, console)
        every, lazy_run = searches["all"], searches["lazy"]
        sequential = baseline_schedule(graph, "sequential", every.schedule)
        samples = time_side_by_side(model, {**{name: s.schedule for name, s in searches.items()},
                                            "sequential": sequential}, rounds)
        timed = {name: statistics.median(ms) for name, ms in samples.items()}
        versus, close = within_noise(samples)
        ok = lazy_run.measured <= every.measured and close
        passed &= ok
        console.print(f"  {model}: run lazy / all {timed['lazy'] / timed['all']:.3f}, "
                      f"again / all {timed['again'] / timed['all']:.3f}, lazy / slower exhaustive "
                      f"{versus.median:.3f} ({versus.span})")
        table.add_row(model, str(every.measured), f"{every.wall_s:.0f}", str(lazy_run.measured),
                      f"{every.measured / lazy_run.measured:.2f}x", f"{lazy_run.wall_s:.0f}",
                      f"{lazy_run.below_bound} ({lazy_run.below_raw_bound})",
                      f"{priced['again']:.3f}, {priced['lazy']:.3f}", f"{timed['all']:.2f}", f"{timed['again']:.2f}",
                      f"{timed['lazy']:.2f}", f"{timed['again'] / timed['all']:.3f}",
                      f"{timed['lazy'] / timed['all']:.3f}", f"{versus.median:.3f} ({versus.span})",
                      f"{timed['sequential']:.2f}",
                      f"fewer, within noise: {'PASS' if ok else 'FAIL'}")
    return table, passed


def parse_args() -> argparse.Namespace:
    """The bench's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("sim", "cpu", "stored"), default=None, help="run only (a), (b) or (c)")
    parser.add_argument("--models", default=",".join(SIM_MODELS), help="(a) comma-separated models")
    parser.add_argument("--cpu-models", default=",".join(CPU_MODELS), help="(b) comma-separated models")
    parser.add_argument("--rounds", type=int, default=30, help="(b) interleaved timing rounds")
    parser.add_argument("--store", type=Path, default=None, help="(c) a store (a GPU's, imported from its Parquet "
                        "export) whose latencies of --store-model at --store-batch are tried at each margin")
    parser.add_argument("--store-model", default="inception_v3", help="(c) the model the store's stages are of")
    parser.add_argument("--store-batch", type=int, default=1, help="(c) the batch size")
    return parser.parse_args()


def main() -> int:
    """Run (a) then (b); 0 when every target is met."""
    args = parse_args()
    parts = {"sim": lambda console: sim_table(sim_cases(args.models.split(","), console)),
             "cpu": lambda console: cpu_table(args.cpu_models.split(","), args.rounds, console)}
    if args.store is not None:
        parts["stored"] = lambda console: margin_table(args.store_model, args.store, args.store_batch, console)
    return run_parts(parts, args.only, width=240)


if __name__ == "__main__":
    sys.exit(main())
