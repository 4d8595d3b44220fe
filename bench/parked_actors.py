"""Searches in one process, each with fresh actors or with the actors the search before it parked.

A notebook, a test session or ``gpu_check`` runs many searches in one process; each used to start its actors afresh
(a process that imports torch, Ray and ios-ray, then torch.export's machinery at its first build and Inductor's at
its first compile). Now a search that ends parks its CPU actor for the next (:mod:`ios_ray.profiler.parking`). Here
the same search runs ``--rounds`` times each way on one local Ray, in alternating order: *fresh* kills the parked
actors first, *parked* takes them. Two searches of ``--model`` on ``cpu``: on a fresh store (all stages measured, the
kernels timed, the check) and on a store that already holds them (a re-search: start-up, build, check). Target: the
parked search is faster beyond noise (the whole 95% interval of the per-round ratios parked / fresh below 1).

Run: python bench/parked_actors.py   (about 4 minutes on 2 cores with the defaults)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import ray
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ios_ray  # noqa: E402
from bench.verdict import clears, run_parts  # noqa: E402
from ios_ray.paired import median_interval, percent, ratios_of, summary_ms  # noqa: E402
from ios_ray.profiler import parking  # noqa: E402


def timed_search(model: str, store: Path, parked: bool) -> float:
    """Seconds one search takes, with the parked actors taken (``parked``) or killed first."""
    if not parked:
        parking.release()
    start = time.perf_counter()
    ios_ray.search(model, ["cpu"], [1], store=store, progress=False)
    return time.perf_counter() - start


def series(args: argparse.Namespace, warm_store: bool, folder: Path) -> dict[str, list[float]]:
    """Per way, the seconds of each round's search (on one store that holds the model, or a fresh store each)."""
    held = folder / "held.duckdb"
    if warm_store:
        timed_search(args.model, held, parked=False)  # fills it (and parks the actor for the first parked run)
    times: dict[str, list[float]] = {"fresh": [], "parked": []}
    for round_ in range(args.rounds):
        order = ("fresh", "parked") if round_ % 2 == 0 else ("parked", "fresh")
        for way in order:
            store = held if warm_store else folder / f"{way}{round_}.duckdb"
            times[way].append(timed_search(args.model, store, parked=way == "parked"))
    return times


def table(args: argparse.Namespace) -> tuple[Table, bool]:
    """Both searches, each way: medians, spread, and the ratio parked / fresh with its interval."""
    ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        with tempfile.TemporaryDirectory() as folder:
            timed_search(args.model, Path(folder) / "warm-up.duckdb", parked=False)  # Inductor's cache, imports
            runs = {name: series(args, warm, Path(folder)) for name, warm in
                    (("fresh store", False), ("store holds it", True))}
    finally:
        parking.release()
        ray.shutdown()
    result = Table(title=f"{args.model} on cpu, batch 1: searches in one process, {args.rounds} rounds alternated")
    for column in ("search", "fresh actors s (p10-p90)", "parked actors s (p10-p90)",
                   f"parked / fresh ({percent(0.95)} interval)", "target < 1"):
        result.add_column(column)
    passed = True
    for name, times in runs.items():
        interval = median_interval(ratios_of(times["parked"], times["fresh"]), 0.95)
        met = clears(interval, most=1.0)
        passed &= met
        cells = [f"{m:.2f} ({lo:.2f}-{hi:.2f})" for m, lo, hi in (summary_ms(times[w]) for w in ("fresh", "parked"))]
        result.add_row(name, *cells, f"{interval.median:.2f} ({interval.span})", "met" if met else "missed")
    return result, passed


def main() -> int:
    """Print the table; 0 when the parked searches are faster beyond noise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="squeezenet", help="a model spec (default squeezenet)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each way per search (default 6)")
    args = parser.parse_args()
    return run_parts({"parked": lambda console: table(args)}, None, width=140)


if __name__ == "__main__":
    sys.exit(main())
