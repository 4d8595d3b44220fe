"""Predicted against measured end to end on the CPU: at search time, and later in fresh processes.

For each model, several searches, each on a fresh store: ``ios-ray search`` measures every candidate stage on this
machine's CPU, runs the DP, and its end-to-end check times the DP's schedule and the sequential one whole, side by
side, right after (the file keeps the faster). After each search ``ios-ray bench --json`` runs in a few fresh
processes, each timing eager and the schedules side by side. A schedule's prediction is the sum of its stage
latencies in the store.

This machine is shared, and its speed drifts by up to 25% over seconds to minutes (eager drifts alike: see the
per-process medians), so one measurement can land in a slow spell; each target is a median over searches or
processes:

* search time (the cost model): the sequential schedule's and the kept schedule's end-to-end time in the check
  against their predictions: within 15%;
* bench time (deployment): the IOS schedule (the file's) never slower than sequential beyond noise: IOS /
  sequential at most 1.05 by the whole 95% interval of the per-round ratios of every bench process together
  (:func:`~ios_ray.paired.median_interval`; a round times both side by side). Measured / predicted is shown too.

The DP's own schedule is shown at search time even where the check dropped it: that is what the check is for.

Run: python bench/prediction.py   (exit code 1 when a target is missed; about 15 minutes with the defaults)
"""

from __future__ import annotations

import argparse
import json
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
from bench.verdict import clears  # noqa: E402
from ios_ray.paired import REPORT_CONFIDENCE, RatioInterval, median_interval, percent, ratios_of
from ios_ray.schedule import EndToEnd, read_schedule

PREDICTION_TOLERANCE = 0.15
NOISE = 0.05
SHOWN = ("eager", "sequential", "greedy", "IOS")


@dataclass(frozen=True)
class Setting:
    """One model at one batch size after one search: the search's check, the predictions, and the median latency
    of each variant in each bench process."""

    model: str
    batch: int
    check: EndToEnd
    predicted_ms: dict[str, float | None]
    medians_ms: dict[str, tuple[float, ...]]
    samples_ms: dict[str, tuple[tuple[float, ...], ...]]


def ios_ray(*args: str) -> str:
    """Run one ios-ray command in a fresh process; its stdout, or RuntimeError with its output."""
    done = subprocess.run([sys.executable, "-m", "ios_ray", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ios-ray {args[0]} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def measure(model: str, batches: str, processes: int, rounds: int, folder: Path) -> list[Setting]:
    """Search once on a fresh store, then bench in ``processes`` fresh processes; one Setting per batch."""
    store, schedules = folder / "latency.duckdb", folder / "schedules"
    start = time.perf_counter()
    ios_ray("search", "--model", model, "--devices", "cpu", "--batches", batches, "--store", str(store),
            "--out", str(schedules))
    print(f"{model}: searched in {time.perf_counter() - start:.1f} s (every candidate stage measured on the CPU, "
          "then the check)", file=sys.stderr, flush=True)
    runs = [json.loads(ios_ray("bench", "--model", model, "--device", "cpu", "--batches", batches, "--schedules",
                               str(schedules), "--store", str(store), "--rounds", str(rounds), "--no-compile",
                               "--json"))["rows"] for _ in range(processes)]
    settings = []
    for batch in sorted({row["batch"] for row in runs[0]}):
        check = read_schedule(schedules / model / "cpu" / f"bs{batch}.json").end_to_end
        if check is None:
            raise RuntimeError(f"the schedule of {model} at batch {batch} carries no end-to-end check")
        first = [row for row in runs[0] if row["batch"] == batch]
        settings.append(Setting(
            model, batch, check, {row["name"]: row["predicted_ms"] for row in first},
            {row["name"]: tuple(r["median_ms"] for run in runs for r in run
                                if (r["batch"], r["name"]) == (batch, row["name"])) for row in first},
            {row["name"]: tuple(tuple(r["samples_ms"]) for run in runs for r in run
                                if (r["batch"], r["name"]) == (batch, row["name"])) for row in first}))
    return settings


def kept_ms(check: EndToEnd) -> tuple[float, float]:
    """(measured, predicted) of the schedule the check kept (its stage sum, uncorrected)."""
    kept = next((c for c in check.candidates if c.name == check.kept), None)
    if kept is not None:
        return kept.ms, kept.predicted_ms or float("nan")
    if check.kept == "sequential":
        return check.sequential_ms, check.sequential_predicted_ms or float("nan")
    return check.dp_ms, check.dp_predicted_ms or float("nan")


def by_setting(settings: list[Setting]) -> dict[tuple[str, int], list[Setting]]:
    """The settings of every search, grouped by (model, batch)."""
    groups: dict[tuple[str, int], list[Setting]] = {}
    for s in settings:
        groups.setdefault((s.model, s.batch), []).append(s)
    return groups


def search_ratios(group: list[Setting]) -> tuple[list[float], list[float]]:
    """Per search: measured / predicted of the sequential schedule and of the kept one, at search time."""
    sequential = [s.check.sequential_ms / (s.check.sequential_predicted_ms or float("nan")) for s in group]
    kept = [measured / predicted for measured, predicted in (kept_ms(s.check) for s in group)]
    return sequential, kept


def bench_ratios(group: list[Setting], variant: str) -> list[float]:
    """Per bench process: a variant's median over its prediction."""
    return [m / (s.predicted_ms[variant] or float("nan")) for s in group for m in s.medians_ms[variant]]


def paired_ratio(group: list[Setting], variant: str, over: str) -> RatioInterval:
    """A variant's time over another's, per round of every bench process of every search, with its interval."""
    ratios = [r for s in group for mine, theirs in zip(s.samples_ms[variant], s.samples_ms[over])
              for r in ratios_of(mine, theirs)]
    return median_interval(ratios, REPORT_CONFIDENCE)


def verdicts(settings: list[Setting]) -> list[tuple[str, str, str, bool]]:
    """(check, figure, target, passed) for every target, each a median over searches or processes."""
    out = []
    band = f"1 ± {PREDICTION_TOLERANCE:.2f}"
    for (model, batch), group in by_setting(settings).items():
        name = f"{model} bs{batch}"
        for label, ratios in zip(("sequential", "kept schedule"), search_ratios(group)):
            ratio = statistics.median(ratios)
            out.append((f"{name}, search time: {label} measured / predicted (median over searches)", f"{ratio:.3f}",
                        band, abs(ratio - 1) <= PREDICTION_TOLERANCE))
        paired = paired_ratio(group, "IOS", "sequential")
        out.append((f"{name}, bench time: IOS / sequential (per-round ratios of every process, "
                    f"{percent(paired.confidence)} interval)", f"{paired.median:.3f} ({paired.span})",
                    f"<= {1 + NOISE:.2f}", clears(paired, most=1 + NOISE)))
    return out


def search_table(settings: list[Setting]) -> Table:
    """At search time: each schedule's prediction against the check's end-to-end time, per search."""
    table = Table(title="search time: predicted (sum of stages) vs the end-to-end check, measured right after")
    for column in ("model", "batch", "search", "DP predicted", "DP measured", "seq predicted", "seq measured",
                   "decision (DP / seq interval)", "rounds", "kept measured / predicted"):
        table.add_column(column, justify="left" if column in ("model", "decision (DP / seq interval)") else "right")
    for (model, batch), group in by_setting(settings).items():
        for index, (s, kept) in enumerate(zip(group, search_ratios(group)[1]), 1):
            c = s.check
            table.add_row(model, str(batch), str(index), f"{c.dp_predicted_ms:.2f}", f"{c.dp_ms:.2f}",
                          f"{c.sequential_predicted_ms:.2f}", f"{c.sequential_ms:.2f}", c.decision, str(c.rounds),
                          f"{kept:.3f}")
    return table


def bench_table(settings: list[Setting]) -> Table:
    """At bench time: every variant's per-process medians, and measured over predicted (median over processes)."""
    table = Table(title=f"bench time: fresh `ios-ray bench` processes after each search ({os.cpu_count()} CPUs, "
                        f"load {os.getloadavg()[0]:.1f})")
    for column in ("model", "batch", "variant", "per-process medians ms", "measured / predicted (median)"):
        table.add_column(column, justify="left" if column in ("model", "variant") else "right")
    for (model, batch), group in by_setting(settings).items():
        kept = ",".join(dict.fromkeys(s.check.kept for s in group))
        for variant in SHOWN:
            medians = " ".join(f"{m:.1f}" for s in group for m in s.medians_ms[variant])
            ratio = "-" if variant == "eager" else f"{statistics.median(bench_ratios(group, variant)):.3f}"
            table.add_row(model, str(batch), f"IOS (kept {kept})" if variant == "IOS" else variant, medians, ratio)
    return table


def verdict_table(checks: list[tuple[str, str, str, bool]]) -> Table:
    """Each target with its figure and PASS/FAIL."""
    table = Table(title="targets")
    for column in ("check", "figure", "target", "result"):
        table.add_column(column, justify="left" if column == "check" else "right")
    for check, figure, target, passed in checks:
        table.add_row(check, figure, target, "PASS" if passed else "FAIL")
    return table


def main() -> int:
    """Run the bench and print its tables; 0 when every target holds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["squeezenet=1,8", "inception_v3=1"],
                        help="MODEL=BATCHES entries, e.g. squeezenet=1,8")
    parser.add_argument("--searches", type=int, default=3, help="searches per model, each on a fresh store")
    parser.add_argument("--processes", type=int, default=3, help="fresh bench processes after each search")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per bench process")
    args = parser.parse_args()
    settings: list[Setting] = []
    for entry in args.runs:
        model, _, batches = entry.partition("=")
        for _ in range(args.searches):
            with tempfile.TemporaryDirectory() as tmp:
                settings += measure(model, batches or "1", args.processes, args.rounds, Path(tmp))
    checks = verdicts(settings)
    console = Console(width=160)
    console.print(search_table(settings))
    console.print(bench_table(settings))
    console.print(verdict_table(checks))
    return 0 if all(passed for *_, passed in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
