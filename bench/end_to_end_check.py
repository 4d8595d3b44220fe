"""The search's end-to-end check against noise, on this machine's CPU: no win where there is no difference, a real
difference found, what the check costs against the unpaired check it replaced, and Quick start's reruns.

(a) A/A. Twenty checks in a row at the defaults of ``ios-ray search`` (:mod:`ios_ray.paired`): of two copies of
SqueezeNet's sequential schedule (two runners, each with its own worker threads), through the actor's own code
(:meth:`~ios_ray.profiler.real.RealBackend.time_schedules`); and of a chain of convolutions, whose DP schedule is
the sequential one, through ``ios_ray.search`` on one store (the real job: the check runs on a Ray actor). Target:
no check reports a win for either (every verdict ``within noise``).

(b) A real difference: SqueezeNet's sequential schedule against itself followed by a sleep of 10% of the time that
call took (so 10% slower whatever the machine's speed of the moment), ten checks at the defaults, the slower one
first in five and second in five. Target: decided slower (the
interval wholly on the slow side of 1) in 10 of 10, within the default cap.

(c) Cost: the check before pairing (10 rounds of both schedules in a fixed order, each timed call after an untimed
one, two warm-up calls each, the lower median kept; re-implemented here as :func:`unpaired_check`) and the paired
check at its defaults, on the DP's and the sequential schedule of SqueezeNet and Inception V3 at batch 1 (the DP's
from a lazy search of this CPU, stored under ``--work``), timed alternately, old then new, ``--pairs`` times. The
cost of each is its wall time (the runners built, warm-up, rounds). Target: new / old at most 1.5, by the whole
95% interval of the per-pair ratios.

(d) Quick start: ``ios-ray search --model squeezenet --devices cpu --batches 1`` three times on one store, each a
fresh process as a user runs it (the first measures the stages, the others reuse them). Target: every run makes the
same decision and keeps the same schedule (the decision in words: ``within noise`` where the interval straddles 1).

Run: python bench/end_to_end_check.py [--only a|b|c|d] [--work DIR]   (exit code 1 when a target is missed)
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.verdict import clears, inverted  # noqa: E402
import ios_ray
from ios_ray.app.search.job import SearchRequest, run_search
from ios_ray.app.search.progress import SilentProgress
from ios_ray.frontend import import_model
from ios_ray.models import resolve_model
from ios_ray.paired import (REPORT_CONFIDENCE, SLOWER, WITHIN_NOISE, LookPlan, PairedTiming, median_interval, percent,
                            ratios_of)
from ios_ray.vocabulary import DEFAULT_CHECK_CONFIDENCE, DEFAULT_CHECK_ROUNDS, DEFAULT_CHECK_SECONDS
from ios_ray.profiler import CheckJob, ModelSource
from ios_ray.profiler.real import RealBackend
from ios_ray.devices import parse_device
from ios_ray.scheduler import baseline_schedule
from ios_ray.runtime import Program, ScheduleRunner
from ios_ray.runtime.compare import paired_timing
from ios_ray.runtime.timing import sample_ms
from ios_ray.schedule import Schedule, read_schedule

CHECKS = 20
SLOWER_BY = 0.10
SLOW_RUNS = 10
COST_TARGET = 1.5
MODELS = ("squeezenet", "inception_v3")


class Chain(nn.Module):
    """Convolutions one after another: every schedule of it, the DP's included, is the sequential one."""

    input_shape = (3, 96, 96)

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c_in, c_out in ((3, 32), (32, 64), (64, 64), (64, 96), (96, 96)):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()]
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load() -> str:
    """The machine's load averages, for the tables."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def sequential_of(model: str, batch: int = 1) -> Schedule:
    """The sequential schedule of a zoo model for the CPU."""
    graph = import_model(model).graph
    return baseline_schedule(graph, model=model, device="cpu", batch=batch)


def check_job(model: str, first: Schedule, second: Schedule) -> CheckJob:
    """The check of two schedules of a zoo model at the defaults of ``ios-ray search``."""
    graph = import_model(model).graph
    source = ModelSource(model, tuple(resolve_model(model).input_shape), spec=model)
    return CheckJob(source, graph, (first, second), first.batch)


def aa_checks(console: Console) -> tuple[Table, bool]:
    """(a): twenty A/A checks of two copies of one schedule, and twenty of a model whose DP schedule is sequential."""
    backend = RealBackend(parse_device("cpu"))
    squeezenet = sequential_of("squeezenet")
    job = check_job("squeezenet", squeezenet, squeezenet)
    copies = []
    for index in range(CHECKS):
        copies.append(backend.time_schedules(job).ratio)
        console.print(f"  (a) squeezenet copies {index + 1}: {copies[-1].median:.3f} {copies[-1].span} "
                      f"{copies[-1].rounds} rounds, {copies[-1].verdict} (load {load()})")
    chains = []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(CHECKS):
            result = ios_ray.search(Chain().eval(), "cpu", 1, store=Path(tmp) / "chain.duckdb", progress=False)
            outcome = result["cpu", 1]
            if any(len(stage.units) > 1 for stage in outcome.schedule.stages):
                raise RuntimeError("the chain's DP schedule is not the sequential one")
            assert outcome.end_to_end is not None and outcome.end_to_end.ratio is not None
            chains.append(outcome.end_to_end.ratio)
            console.print(f"  (a) chain search {index + 1}: {outcome.end_to_end.decision} "
                          f"({outcome.end_to_end.rounds} rounds, load {load()})")
    table = Table(title=f"(a) A/A: {CHECKS} checks in a row at the defaults ({DEFAULT_CHECK_ROUNDS} rounds at most, "
                        f"{percent(DEFAULT_CHECK_CONFIDENCE)} interval), batch 1")
    for column in ("what", "within noise", "wins", "median ratios (min-max)", "interval widths (median)",
                   "rounds", "target"):
        table.add_column(column, justify="left" if column == "what" else "right")
    passed = True
    for what, found in (("SqueezeNet, two copies of its sequential schedule (the actor's code)", copies),
                        ("a chain of convs: DP schedule = sequential (ios_ray.search, Ray actor)", chains)):
        wins = sum(r.verdict != WITHIN_NOISE for r in found)
        passed &= wins == 0
        medians = [r.median for r in found]
        widths = [r.high - r.low for r in found if r.low is not None and r.high is not None]
        table.add_row(what, f"{len(found) - wins}/{len(found)}", str(wins),
                      f"{statistics.median(medians):.3f} ({min(medians):.3f}-{max(medians):.3f})",
                      f"{statistics.median(widths):.3f}" if widths else "-",
                      ",".join(sorted({str(r.rounds) for r in found})), f"0 wins: {'PASS' if wins == 0 else 'FAIL'}")
    return table, passed


def slower_checks(console: Console) -> tuple[Table, bool]:
    """(b): the sequential schedule against itself made 10% slower by a sleep after it, ten checks."""
    graph = import_model("squeezenet").graph
    program = Program.from_imported(import_model("squeezenet"), "cpu")
    schedule = sequential_of("squeezenet")
    plain, other = ScheduleRunner(program, schedule, "cpu"), ScheduleRunner(program, schedule, "cpu")
    x = torch.randn(1, *graph.input_shape)
    with torch.inference_mode():
        base_ms = statistics.median(sample_ms(functools.partial(plain, x), torch.device("cpu")) for _ in range(20))

    def slowed() -> None:
        """The schedule, then a sleep of 10% of what it just took (10% slower whatever the machine's speed)."""
        start = time.perf_counter()
        other(x)
        time.sleep(SLOWER_BY * (time.perf_counter() - start))

    plan = LookPlan.planned(DEFAULT_CHECK_ROUNDS, DEFAULT_CHECK_CONFIDENCE)
    table = Table(title=f"(b) SqueezeNet batch 1 ({base_ms:.2f} ms at the start), its sequential schedule against "
                        f"itself followed by a sleep of {SLOWER_BY:.0%} of its own time: {SLOW_RUNS} checks at the "
                        "defaults")
    for column in ("run", "slower one", "ratio slower / plain",
                   f"{percent(DEFAULT_CHECK_CONFIDENCE)} interval", "rounds", "s", "verdict", "load"):
        table.add_column(column, justify="right")
    found = 0
    for run in range(SLOW_RUNS):
        first_slow = run % 2 == 0
        first, second = (slowed, functools.partial(plain, x)) if first_slow else (functools.partial(plain, x), slowed)
        start = time.perf_counter()
        timing = paired_timing(first, second, "cpu", plan, max_seconds=DEFAULT_CHECK_SECONDS)
        seconds = time.perf_counter() - start
        ratio = timing.ratio if first_slow else inverted(timing.ratio)
        decided = ratio.verdict == SLOWER
        found += decided
        table.add_row(str(run + 1), "first" if first_slow else "second", f"{ratio.median:.3f}", ratio.span,
                      str(timing.rounds), f"{seconds:.1f}", ratio.verdict, load())
        console.print(f"  (b) run {run + 1}: {ratio.median:.3f} {ratio.span}, {timing.rounds} rounds, {ratio.verdict}")
    table.add_row("all", "", "", "", "", "", f"slower in {found}/{SLOW_RUNS}: "
                  f"{'PASS' if found == SLOW_RUNS else 'FAIL'}", "")
    return table, found == SLOW_RUNS


def unpaired_check(first: Callable[[], object], second: Callable[[], object], rounds: int = 10,
                   warmup: int = 2) -> tuple[float, float]:
    """The check before pairing: ``warmup`` untimed calls of each, then ``rounds`` rounds timing both in a fixed
    order, each timed call after an untimed one; the median of each (the lower was kept)."""
    cpu = torch.device("cpu")
    samples: tuple[list[float], list[float]] = ([], [])
    with torch.inference_mode():
        for fn in (first, second):
            for _ in range(warmup):
                fn()
        for _ in range(rounds):
            for fn, found in zip((first, second), samples):
                fn()
                found.append(sample_ms(fn, cpu))
    return statistics.median(samples[0]), statistics.median(samples[1])


def dp_schedule(model: str, work: Path) -> Schedule:
    """The DP's schedule of a model at batch 1 on this CPU, from a lazy search without the check (its store and
    schedules kept under ``work``, so that a rerun measures nothing)."""
    request = SearchRequest(model=model, devices=("cpu",), batches=(1,), store=work / "latency.duckdb",
                            out=work / "dp", check_rounds=0)
    [outcome] = run_search(request, SilentProgress())
    return outcome.schedule


def cost(work: Path, pairs: int, console: Console) -> tuple[Table, bool]:
    """(c): the unpaired check and the paired one timed alternately on each model's DP and sequential schedule."""
    table = Table(title=f"(c) cost of one check, batch 1: the unpaired check (10 rounds) and the paired one at its "
                        f"defaults, {pairs} pairs timed alternately; new / old with its "
                        f"{percent(REPORT_CONFIDENCE)} interval")
    for column in ("model", "old s: median (p10-p90)", "new s: median (p10-p90)", "new rounds", "new verdicts",
                   "new / old", "interval", "target"):
        table.add_column(column, justify="left" if column == "model" else "right")
    passed = True
    for model in MODELS:
        dp = dp_schedule(model, work / model)
        sequential = sequential_of(model)
        graph = import_model(model).graph
        program = Program.from_imported(import_model(model), "cpu")
        x = torch.randn(1, *graph.input_shape)
        plan = LookPlan.planned(DEFAULT_CHECK_ROUNDS, DEFAULT_CHECK_CONFIDENCE)
        old_s, new_s, new_runs = [], [], []
        for pair in range(pairs):
            start = time.perf_counter()
            unpaired_check(functools.partial(ScheduleRunner(program, dp, "cpu"), x),
                           functools.partial(ScheduleRunner(program, sequential, "cpu"), x))
            old_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            timing: PairedTiming = paired_timing(functools.partial(ScheduleRunner(program, dp, "cpu"), x),
                                                 functools.partial(ScheduleRunner(program, sequential, "cpu"), x),
                                                 "cpu", plan, max_seconds=DEFAULT_CHECK_SECONDS)
            new_s.append(time.perf_counter() - start)
            new_runs.append(timing)
            console.print(f"  (c) {model} pair {pair + 1}: old {old_s[-1]:.2f} s, new {new_s[-1]:.2f} s "
                          f"({timing.rounds} rounds, {timing.ratio.verdict}, load {load()})")
        ratio = median_interval(ratios_of(new_s, old_s), REPORT_CONFIDENCE)
        ok = clears(ratio, most=COST_TARGET)
        passed &= ok
        verdicts = ", ".join(f"{v} {sum(t.ratio.verdict == v for t in new_runs)}"
                             for v in dict.fromkeys(t.ratio.verdict for t in new_runs))
        table.add_row(model, spread(old_s), spread(new_s), ",".join(sorted({str(t.rounds) for t in new_runs})),
                      verdicts, f"{ratio.median:.2f}", ratio.span, f"<= {COST_TARGET}: {'PASS' if ok else 'FAIL'}")
    return table, passed


def spread(values: list[float]) -> str:
    """Median (p10-p90) of some seconds."""
    ordered = sorted(values)
    p10, p90 = ordered[int(0.1 * (len(ordered) - 1))], ordered[round(0.9 * (len(ordered) - 1))]
    return f"{statistics.median(ordered):.2f} ({p10:.2f}-{p90:.2f})"


def quick_start(console: Console) -> tuple[Table, bool]:
    """(d): README Quick start's command 1, three times on one store, each a fresh process."""
    command = ["search", "--model", "squeezenet", "--devices", "cpu", "--batches", "1"]
    table = Table(title=f"(d) `ios-ray {' '.join(command)}` three times on one store (fresh processes)")
    for column in ("run", "wall s", "measured", "decision", "rounds", "kept stages", "load"):
        table.add_column(column, justify="right")
    decisions, kept = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(3):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "ios_ray", *command], cwd=tmp, capture_output=True,
                                  text=True)
            wall = time.perf_counter() - start
            if done.returncode != 0:
                raise RuntimeError(f"ios-ray search failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
            schedule = read_schedule(Path(tmp) / "schedules" / "squeezenet" / "cpu" / "bs1.json")
            check = schedule.end_to_end
            assert check is not None and check.ratio is not None
            decisions.append((check.kept, check.ratio.verdict))
            kept.append(schedule.stages)
            measured = next((line.strip().strip("│").split("│")[5].strip() for line in done.stdout.splitlines()
                             if line.strip().startswith("│ cpu")), "?")
            table.add_row(str(run + 1), f"{wall:.1f}", measured, check.decision, str(check.rounds),
                          f"{len(schedule.stages)}", load())
            console.print(f"  (d) run {run + 1}: {check.decision} ({check.rounds} rounds)")
    stable = len(set(decisions)) == 1 and all(stages == kept[0] for stages in kept)
    table.add_row("all", "", "", f"the same decision and schedule: {'PASS' if stable else 'FAIL'}", "", "", "")
    return table, stable


def main() -> int:
    """Run (a) to (d); 0 when every target is met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("a", "b", "c", "d"), default=None, help="run one part only")
    parser.add_argument("--work", type=Path, default=None, help="(c) keep the searches' stores here (default: temp)")
    parser.add_argument("--pairs", type=int, default=7, help="(c) old/new pairs per model")
    args = parser.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(f"{os.cpu_count()} CPUs, load {load()} at start")
    passed = True
    parts: dict[str, Callable[[], tuple[Table, bool]]] = {
        "a": lambda: aa_checks(console), "b": lambda: slower_checks(console),
        "c": lambda: cost(args.work or Path(tempfile.mkdtemp()), args.pairs, console),
        "d": lambda: quick_start(console),
    }
    for name, part in parts.items():
        if args.only in (None, name):
            table, ok = part()
            console.print(table)
            passed &= ok
    console.print(f"load {load()} at end; overall: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
