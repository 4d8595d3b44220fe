"""Profiler scaling: stages per second measured on sim:v100 with 1, 2 and 4 actors (same stages each time).

The stages are the first ``STAGES`` candidate stages (by key) that the planner lists for Inception V3 at
r=3, s=8, at batch 1 under the default GPU timing protocol. A sim actor takes as long as measuring would take
on the device, so the speedup shows what the dispatch loop delivers. Actor start-up is not timed. Each round runs
every actor count once, the order reversed from round to round, and a speedup is the median of its per-round ratios
with their 95% interval (:func:`~ios_ray.paired.median_interval`): the target is met only where the whole interval
clears it.

Run: python bench/profile_scaling.py [--rounds N]   (exit code 1 when the target is missed)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import ray
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.verdict import clears  # noqa: E402
from ios_ray.frontend import import_model
from ios_ray.paired import REPORT_CONFIDENCE, median_interval, percent, ratios_of
from ios_ray.profiler import DevicePool, MeasureJob, ModelSource
from ios_ray.scheduler.plan import plan_graph
from ios_ray.scheduler.space import SearchParams

DEVICE = "sim:v100"
MODEL = "inception_v3"
STAGES = 400
BATCH = 1
ACTOR_COUNTS = (1, 2, 4)
TARGET_SPEEDUP = 3.2


def planned_jobs() -> list[MeasureJob]:
    """The first STAGES planned stages of the model, as measurement jobs."""
    graph = import_model(MODEL).graph
    plan = plan_graph(graph, SearchParams(r=3, s=8))
    chosen = [plan.stages[key] for key in sorted(plan.stages)[:STAGES]]
    return [MeasureJob(p.key, p.stage, p.description, graph, ModelSource(MODEL, graph.input_shape, spec=MODEL), BATCH) for p in chosen]


def stages_per_second(jobs: list[MeasureJob], actors: int) -> float:
    """Measure every job with this many sim actors; stages per second of the measuring alone."""
    with DevicePool.start([DEVICE], sim_actors=actors) as pool:
        start = time.perf_counter()
        report = pool.measure({DEVICE: jobs}, lambda rows: None)
        elapsed = time.perf_counter() - start
    if not report.complete:
        raise RuntimeError(f"only {report.done} of {report.total} stages were measured")
    return len(jobs) / elapsed


def main() -> int:
    """Run the comparison and print the table; 0 when 4 actors reach the target speedup."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds, each measuring with every actor count")
    args = parser.parse_args()
    jobs = planned_jobs()
    ray.init(address="local", num_cpus=2, object_store_memory=100 * 1024 * 1024, include_dashboard=False)
    rates: dict[int, list[float]] = {n: [] for n in ACTOR_COUNTS}
    try:
        for index in range(args.rounds):
            for n in ACTOR_COUNTS if index % 2 == 0 else reversed(ACTOR_COUNTS):
                rates[n].append(stages_per_second(jobs, n))
    finally:
        ray.shutdown()
    table = Table(title=f"Profiler scaling: {len(jobs)} {MODEL} stages on {DEVICE}, batch {BATCH}, {args.rounds} "
                        "rounds")
    for column in ("actors", "stages/s (median)", "speedup vs 1", f"{percent(REPORT_CONFIDENCE)} interval",
                   "target", "result"):
        table.add_column(column, justify="right")
    passed = True
    for n, found in rates.items():
        speedup = median_interval(ratios_of(found, rates[1]), REPORT_CONFIDENCE)
        target = TARGET_SPEEDUP if n == max(ACTOR_COUNTS) else None
        ok = target is None or clears(speedup, least=target)
        passed &= ok
        table.add_row(str(n), f"{statistics.median(found):.1f}", f"{speedup.median:.2f}x", speedup.span,
                      f">= {target}x" if target else "-", ("PASS" if ok else "FAIL") if target else "-")
    Console().print(table)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
