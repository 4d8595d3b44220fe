"""Search cost: a repeated search reuses the store, and more sim actors measure faster.

(a) The same ``ios-ray search`` on one store, first once, then ``--reruns`` times, each run as the user would (a
CLI subprocess, the whole command timed): every rerun must measure nothing and finish at least 20x faster than the
first. The stages measured are read from each printed table and checked against the store's row count before and
after. When every device is simulated and everything is cached, a rerun does not even start Ray (by design). The
speedup is the median of first / rerun over the reruns, with its 95% interval (:func:`~ios_ray.paired.median_interval`):
that interval holds the reruns' noise only, since a store has only one first search (six first searches would take
35 minutes for a figure some 3x above its target).

(b) The same search (every candidate stage of one model, one device, one batch) on fresh stores with 1 and with
4 sim actors, in one process on one local Ray, ``--rounds`` times in alternating order: the measuring phase, from
``device_started`` to the last ``advanced`` with done == total (actor start-up and the DP excluded), must be at
least 3x faster with 4, by the whole 95% interval of the per-round ratios.

Run: python bench/search_cost.py   (exit code 1 when a target is missed; about 12 minutes with the defaults)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.verdict import clears, run_parts  # noqa: E402
from ios_ray.paired import REPORT_CONFIDENCE, median_interval, percent, ratios_of
from ios_ray.app.search.job import SearchRequest, run_search
from ios_ray.app.search.progress import SilentProgress
from ios_ray.store import LatencyStore

REPEAT_TARGET = 20.0
SCALING_TARGET = 3.0
SCALING_ACTORS = (1, 4)
OBJECT_STORE_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class CliRun:
    """One timed ``ios-ray search`` subprocess: wall time, the measured/cached sums of its table, store rows."""

    wall_s: float
    measured: int
    cached: int
    rows_before: int
    rows_after: int


@dataclass(frozen=True)
class ScalingRun:
    """One in-process search with a number of sim actors: stages measured and seconds of the measuring phase."""

    actors: int
    stages: int
    seconds: float

    @property
    def rate(self) -> float:
        """Stages measured per second."""
        return self.stages / self.seconds


class MeasuringClock(SilentProgress):
    """A SearchProgress that records when measuring starts and when the last stage is in."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.finished: float | None = None
        self.total = 0

    def device_started(self, device: str, total: int, cached: int) -> None:
        """Start the clock."""
        self.started = time.perf_counter()
        self.total = total

    def advanced(self, device: str, done: int, total: int) -> None:
        """Stop the clock when every stage is measured."""
        if total and done == total and self.finished is None:
            self.finished = time.perf_counter()

    @property
    def seconds(self) -> float:
        """Seconds from device_started to the last stage measured."""
        if self.started is None or self.finished is None:
            raise RuntimeError("the search never reported that it finished measuring")
        return self.finished - self.started


def store_rows(path: Path) -> int:
    """Rows in a store file (0 where there is none yet)."""
    if not path.exists():
        return 0
    store = LatencyStore(path, create=False)
    try:
        return sum(store.stats()["rows"].to_pylist())
    finally:
        store.close()


def table_sums(output: str) -> tuple[int, int]:
    """The sums of the 'measured' and 'cached' columns of the table ``ios-ray search`` prints."""
    header = next(line for line in output.splitlines() if "┃" in line and "measured" in line)
    names = [cell.strip() for cell in header.split("┃")]
    measured, cached = names.index("measured / planned"), names.index("cached")
    rows = [[cell.strip() for cell in line.split("│")] for line in output.splitlines() if line.count("│") >= 3]
    if not rows:
        raise RuntimeError("no table rows in the output of ios-ray search")
    return sum(int(r[measured].split("/")[0]) for r in rows), sum(int(r[cached]) for r in rows)


def cli_search(command: list[str], store: Path) -> CliRun:
    """Run the search command once, timing the whole subprocess."""
    before = store_rows(store)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"ios-ray search failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    measured, cached = table_sums(done.stdout)
    return CliRun(wall, measured, cached, before, store_rows(store))


def repeat_cost(args: argparse.Namespace) -> tuple[list[str], CliRun, list[CliRun]]:
    """(a): the same CLI search on one fresh store, first once, then ``args.reruns`` times."""
    with tempfile.TemporaryDirectory() as tmp:
        store, out = Path(tmp) / "latency.duckdb", Path(tmp) / "schedules"
        command = [sys.executable, "-m", "ios_ray", "search", "--model", args.model, "--devices", args.devices,
                   "--batches", args.batches, "--store", str(store), "--out", str(out)]
        if args.sim_actors is not None:
            command += ["--sim-actors", str(args.sim_actors)]
        first = cli_search(command, store)
        reruns = [cli_search(command, store) for _ in range(args.reruns)]
    shown = ["python", *command[1:]]
    shown[shown.index(str(store))], shown[shown.index(str(out))] = "TMP/latency.duckdb", "TMP/schedules"
    return shown, first, reruns


def scaling_cost(args: argparse.Namespace) -> list[ScalingRun]:
    """(b): ``args.rounds`` searches per actor count, each on a fresh store, the counts in alternating order, in this
    process, on one local Ray."""
    import ray

    ray.init(address="local", num_cpus=os.cpu_count(), object_store_memory=OBJECT_STORE_BYTES,
             include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    runs = []
    try:
        for actors in [n for index in range(args.rounds)
                       for n in (SCALING_ACTORS if index % 2 == 0 else SCALING_ACTORS[::-1])]:
            with tempfile.TemporaryDirectory() as tmp:
                request = SearchRequest(model=args.scaling_model, devices=(args.scaling_device,),
                                        batches=(args.scaling_batch,), store=Path(tmp) / "latency.duckdb",
                                        out=Path(tmp) / "schedules", sim_actors=actors, measure="all")
                clock = MeasuringClock()
                outcomes = run_search(request, clock)
            measured = sum(o.measured for o in outcomes)
            if measured != clock.total:
                raise RuntimeError(f"{actors} actors: {measured} stages measured, {clock.total} announced")
            runs.append(ScalingRun(actors, measured, clock.seconds))
    finally:
        ray.shutdown()
    return runs


def repeat_table(args: argparse.Namespace, first: CliRun, reruns: list[CliRun]) -> tuple[Table, bool]:
    """The comparison table of (a) and whether it passes."""
    speedup = median_interval(ratios_of([first.wall_s] * len(reruns), [r.wall_s for r in reruns]), REPORT_CONFIDENCE)
    nothing = all(r.measured == 0 for r in reruns)
    unchanged = all(r.rows_after == r.rows_before for r in reruns)
    speed_ok = clears(speedup, least=REPEAT_TARGET)
    table = Table(title=f"(a) the same search on one store, first then {len(reruns)} reruns: {args.model} on "
                        f"{args.devices}, batches {args.batches}")
    for column in ("", "first search", "reruns", "target", "result"):
        table.add_column(column, justify="left" if not column else "right")
    walls = sorted(r.wall_s for r in reruns)
    table.add_row("whole command, s", f"{first.wall_s:.1f}",
                  f"{statistics.median(walls):.1f} ({walls[0]:.1f}-{walls[-1]:.1f})", "", "")
    table.add_row("stages measured (printed table)", f"{first.measured:,}",
                  ", ".join(f"{r.measured:,}" for r in reruns), "reruns = 0", "PASS" if nothing else "FAIL")
    table.add_row("stages cached (printed table)", f"{first.cached:,}", f"{reruns[0].cached:,}", "", "")
    table.add_row("store rows before -> after", f"{first.rows_before:,} -> {first.rows_after:,}",
                  f"{reruns[0].rows_before:,} -> {reruns[-1].rows_after:,}", "reruns unchanged",
                  "PASS" if unchanged else "FAIL")
    table.add_row(f"speed ratio first / rerun ({percent(REPORT_CONFIDENCE)} interval)", "",
                  f"{speedup.median:.1f}x ({speedup.span})", f">= {REPEAT_TARGET:.0f}x", "PASS" if speed_ok else "FAIL")
    return table, nothing and unchanged and speed_ok


def scaling_table(args: argparse.Namespace, runs: list[ScalingRun]) -> tuple[Table, bool]:
    """The comparison table of (b) and whether it passes."""
    by_actors = {n: [run for run in runs if run.actors == n] for n in SCALING_ACTORS}
    base = by_actors[SCALING_ACTORS[0]]
    table = Table(title=f"(b) measuring phase by sim actors: {args.scaling_model} on {args.scaling_device}, "
                        f"batch {args.scaling_batch}, fresh store each, {args.rounds} rounds")
    for column in ("sim actors", "stages", "measuring s (median)", "stages/s", "speedup vs 1",
                   f"{percent(REPORT_CONFIDENCE)} interval", "target", "result"):
        table.add_column(column, justify="right")
    passed = True
    for actors, found in by_actors.items():
        seconds = [run.seconds for run in found]
        speedup = median_interval(ratios_of([run.seconds for run in base], seconds), REPORT_CONFIDENCE)
        target = SCALING_TARGET if actors == max(SCALING_ACTORS) else None
        ok = (target is None or clears(speedup, least=target)) and all(run.stages == base[0].stages for run in found)
        passed &= ok
        table.add_row(str(actors), f"{found[0].stages:,}", f"{statistics.median(seconds):.2f}",
                      f"{statistics.median(run.rate for run in found):.1f}", f"{speedup.median:.2f}x", speedup.span,
                      f">= {target:.0f}x" if target else "-", ("PASS" if ok else "FAIL") if target else "-")
    return table, passed


def parse_args() -> argparse.Namespace:
    """The bench's options; the defaults are the targets' settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception_v3", help="(a) model")
    parser.add_argument("--devices", default="sim:v100", help="(a) comma-separated devices")
    parser.add_argument("--batches", default="1,32,128", help="(a) comma-separated batch sizes")
    parser.add_argument("--sim-actors", type=int, default=None, help="(a) pass --sim-actors (default: the CLI's)")
    parser.add_argument("--scaling-model", default="inception_v3", help="(b) model")
    parser.add_argument("--scaling-device", default="sim:v100", help="(b) sim device")
    parser.add_argument("--scaling-batch", type=int, default=1, help="(b) batch size")
    parser.add_argument("--reruns", type=int, default=6, help="(a) searches after the first")
    parser.add_argument("--rounds", type=int, default=6, help="(b) searches per actor count")
    parser.add_argument("--only", choices=("repeat", "scaling"), default=None, help="run only (a) or (b)")
    return parser.parse_args()


def main() -> int:
    """Run (a) then (b), print both tables; 0 when every target is met."""
    args = parse_args()

    def repeat(console: Console) -> tuple[Table, bool]:
        command, first, reruns = repeat_cost(args)
        console.print(f"(a) command, run {1 + len(reruns)} times: {' '.join(command)}")
        return repeat_table(args, first, reruns)
    return run_parts({"repeat": repeat, "scaling": lambda console: scaling_table(args, scaling_cost(args))},
                     args.only, width=120)


if __name__ == "__main__":
    sys.exit(main())
