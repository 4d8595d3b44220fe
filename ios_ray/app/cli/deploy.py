"""The commands that run schedules on this machine: ``run`` (a model with its schedules, checked against eager),
``bench`` (the schedules side by side with eager and torch.compile) and ``evaluate`` (each schedule on each setting).
They register on the app of :mod:`~ios_ray.app.cli.commands`."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.table import Table

from ios_ray.app.cli.commands import (DTYPE_HELP, INPUT_SHAPE_HELP, MEMORY_FORMAT_HELP, MODEL_HELP, STORE_HELP, app,
                                      console)
from ios_ray.app.cli.util import at_least_one, parse_batches, search_command, store_lookup, user_errors
from ios_ray.app.search.options import DEFAULT_OUT, parse_input_shape
from ios_ray.errors import UserError
from ios_ray.paired import percent
from ios_ray.store import DEFAULT_STORE_PATH
from ios_ray.vocabulary import DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, is_simulated

if TYPE_CHECKING:
    import torch

    from ios_ray.app.cli.bench import BenchResult
    from ios_ray.app.search.budgets import Lookup
    from ios_ray.ir import Graph
    from ios_ray.runtime import ScheduledModule
    from ios_ray.schedule import Schedule


@app.command()
@user_errors
def run(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    schedules: Path = typer.Option(DEFAULT_OUT, "--schedules", help="a schedule file or the --out folder of search"),
    batch: int = typer.Option(1, "--batch", "-b", help="batch size of the random input"),
    device: str = typer.Option("cpu", "--device", help="torch device to run on: cpu or cuda[:i]"),
    repeat: int = typer.Option(20, "--repeat", help="timed runs"),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", help=INPUT_SHAPE_HELP),
    dtype: str = typer.Option(DEFAULT_DTYPE, "--dtype", help=DTYPE_HELP),
    memory_format: str = typer.Option(DEFAULT_MEMORY_FORMAT, "--memory-format", help=MEMORY_FORMAT_HELP),
    any_device: bool = typer.Option(False, "--any-device", help="where no schedule fits --device, run one made for "
                                    "another device (a sim: plan, say) to check that it computes the model: a "
                                    "correctness check, without latency"),
) -> None:
    """Run a model with its schedules (ScheduledModule), check the output against eager, print the latency."""
    import torch

    from ios_ray.runtime.accuracy import relative_error
    from ios_ray.dtypes import in_memory_format, memory_format_name, to_memory_format, torch_dtype
    from ios_ray.frontend import load_model, output_tensor
    from ios_ray.runtime import ScheduledModule, device_rank

    parse_batches(str(batch))
    at_least_one(repeat=repeat)
    _searched(schedules, model, device, str(batch), input_shape, dtype, memory_format)
    target, precision, layout = _torch_device(device), torch_dtype(dtype), memory_format_name(memory_format)
    loaded = load_model(model, parse_input_shape(input_shape))
    module = to_memory_format(loaded.module.eval().to(target, precision), layout)
    scheduled = ScheduledModule(module, schedules, input_shape=loaded.input_shape, any_device=any_device)
    x = in_memory_format(torch.randn(batch, *loaded.input_shape, device=target, dtype=precision), layout)
    chosen, caught = _schedule_for(scheduled, x, f"no schedule under {schedules} fits device {device!r}", any_device)
    with torch.inference_mode():
        expected = output_tensor(module(x))
        error = relative_error(output_tensor(scheduled(x)), expected)
    gpu_name = torch.cuda.get_device_name(target) if target.type == "cuda" else None
    checked_only = device_rank(chosen.device, target.type, gpu_name) is None
    _print_schedule(chosen, device, checked_only, caught)
    limit = _print_error(module, x, expected, error)
    if not checked_only:
        _print_latency(scheduled, module, x, repeat)
    if error > limit:
        raise typer.Exit(1)


def _print_schedule(chosen: "Schedule", device: str, checked_only: bool, caught: list[warnings.WarningMessage]
                    ) -> None:
    """Say which schedule ``run`` runs: where it was planned for another device, that it is a correctness check only;
    else the notes choosing it gave, its prediction and its search's end-to-end check."""
    settings = (f"{chosen.device} batch {chosen.batch} {' '.join(chosen.numerics)} {chosen.kernels} kernels "
                f"({len(chosen.stages)} stages")
    if checked_only:
        console.print(f"schedule: {settings}) planned for {chosen.device}, run on {device} as a correctness check "
                      f"only (its speed here says nothing of {chosen.device})")
        return
    for note in caught:
        console.print(f"note: {note.message}")
    predicted = chosen.predicted_latency or float("nan")
    console.print(f"schedule: {settings}, predicted {predicted:.3f} ms {chosen.source} at batch {chosen.batch})")
    if chosen.end_to_end is not None:
        console.print(f"search's end-to-end check: {chosen.end_to_end.summary()}")


def _print_latency(scheduled: "ScheduledModule", module: "torch.nn.Module", x: "torch.Tensor", repeat: int) -> None:
    """Time the scheduled module and eager on ``x`` and print both."""
    from ios_ray.runtime import measure_latency

    median, p10, p90 = measure_latency(scheduled, x, warmup=3, repeat=repeat, device=x.device)
    eager, _, _ = measure_latency(module, x, warmup=3, repeat=repeat, device=x.device)
    console.print(f"latency at batch {x.shape[0]}: {median:.3f} ms (p10 {p10:.3f}, p90 {p90:.3f}); eager {eager:.3f} "
                  "ms")


def _schedule_for(scheduled: "ScheduledModule", x: "torch.Tensor", missing: str, any_device: bool
                  ) -> tuple["Schedule", list[warnings.WarningMessage]]:
    """The schedule a ScheduledModule runs for ``x``, and the warnings choosing it gave; UserError (``missing``, and
    how to go on) where none fits."""
    with warnings.catch_warnings(record=True) as caught:  # said in a line of its own, or in the error
        warnings.simplefilter("always")
        chosen = scheduled.schedule_for(x)
    if chosen is None:
        hint = "" if any_device else (", or pass --any-device to check that a schedule made for another device "
                                      "computes the model")
        raise UserError(f"{missing}; run `ios-ray search` for it first{hint}.")
    return chosen, list(caught)


def _print_error(module: "torch.nn.Module", x: "torch.Tensor", expected: "torch.Tensor", error: float) -> float:
    """Print the scheduled output's error against eager with its tolerance (:func:`~ios_ray.app.cli.bench.model_tolerance`)
    and return the tolerance."""
    import torch

    from ios_ray.runtime.accuracy import TF32_TOLERANCE, model_tolerance, output_tolerance

    floor = output_tolerance(x.device, x.dtype)
    tf32 = x.dtype == torch.float32 and floor == TF32_TOLERANCE
    tolerance = model_tolerance(module, x, expected, floor, " with TF32 on" if tf32 else "")
    verdict = "ok" if error <= tolerance.limit else "MISMATCH"
    console.print(f"output vs eager: max relative error {error:.2e} ({verdict}, tolerance {tolerance.limit:.1e}: "
                  f"{tolerance.rule()})")
    return tolerance.limit


@app.command()
@user_errors
def bench(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    device: str = typer.Option("cpu", "--device", help="the schedules' device label (cpu, cuda, h100...)"),
    batches: str = typer.Option("1", "--batches", "-b", help="comma-separated batch sizes"),
    schedules: Path = typer.Option(DEFAULT_OUT, "--schedules", help="the --out folder of ios-ray search"),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    rounds: int = typer.Option(10, "--rounds", help="timed rounds (each runs every variant once)"),
    compile_: bool = typer.Option(True, "--compile/--no-compile", help="include torch.compile"),
    compile_mode: Optional[str] = typer.Option(None, "--compile-mode", help="only this torch.compile mode: default, "
                                               "or on a GPU reduce-overhead (default: each mode)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON (rows and notes) instead of tables"),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", help=INPUT_SHAPE_HELP),
    dtype: str = typer.Option(DEFAULT_DTYPE, "--dtype", help=DTYPE_HELP + " (the schedules of that dtype are used)"),
    memory_format: str = typer.Option(DEFAULT_MEMORY_FORMAT, "--memory-format", help=MEMORY_FORMAT_HELP + " (the schedules "
                                      "of that format are used)"),
) -> None:
    """Eager, the sequential, greedy and IOS schedules and torch.compile, measured side by side (on a GPU also
    with CUDA graphs)."""

    at_least_one(rounds=rounds)
    _searched(schedules, model, device, batches, input_shape, dtype, memory_format)

    from ios_ray.app.cli.bench import bench_model, compile_modes_for
    from ios_ray.dtypes import memory_format_name, to_memory_format, torch_dtype
    from ios_ray.frontend import load_model

    target, precision, layout = _bench_target(device), torch_dtype(dtype), memory_format_name(memory_format)
    modes = compile_modes_for(target.type, compile_mode) if compile_ else ()
    loaded = load_model(model, parse_input_shape(input_shape))
    module = to_memory_format(loaded.module.eval().to(target, precision), layout)
    report: dict[str, list[Any]] = {"rows": [], "notes": []}
    for result in bench_model(module, loaded.name, loaded.input_shape, device, target, parse_batches(batches), schedules,
                              store_lookup(store), rounds, modes):
        if not as_json:
            _print_bench_table(result)
            continue
        check = result.schedule.end_to_end
        context = {"model": result.model, "device": result.device, "schedule_batch": result.schedule.batch,
                   "search_kept": check.kept if check is not None else None,
                   "search_decision": check.decision if check is not None else None, "baseline": result.baseline,
                   "kernels": result.schedule.kernels}
        report["rows"] += [{**context, **dataclasses.asdict(row)} for row in result.rows]
        report["notes"] += list(result.notes)
    if as_json:
        print(json.dumps(report, indent=1))


def _print_bench_table(result: "BenchResult") -> None:
    confidence = f"{percent(result.rows[0].confidence)} interval"
    table = Table("variant", "median ms", "p10 ms", "p90 ms", f"vs eager ({confidence})",
                  f"vs {result.baseline} ({confidence})", "predicted ms", "max rel err", title=result.title)
    for row in result.rows:
        predicted = f"{row.predicted_ms:.3f}" if row.predicted_ms is not None else "-"
        versus = _speedup_cell(row.speedup_vs_sequential, row.vs_sequential_low, row.vs_sequential_high)
        table.add_row(row.name, f"{row.median_ms:.3f}", f"{row.p10_ms:.3f}", f"{row.p90_ms:.3f}",
                      _speedup_cell(row.speedup, row.speedup_low, row.speedup_high), versus, predicted,
                      f"{row.error:.1e}")
    console.print(table)
    for note in result.notes:
        console.print(note)


def _speedup_cell(speedup: float | None, low: float | None, high: float | None) -> str:
    """A speedup with its interval: ``1.04x (1.01-1.06)``; ``-`` where there is none."""
    if speedup is None:
        return "-"
    return f"{speedup:.2f}x ({low:.2f}-{high:.2f})" if low is not None and high is not None else f"{speedup:.2f}x (-)"


def _searched(schedules: Path, model: str, devices: str, batches: str, input_shape: str | None = None,
              dtype: str = DEFAULT_DTYPE, memory_format: str = DEFAULT_MEMORY_FORMAT) -> None:
    """UserError where ``schedules`` does not exist, giving the search that writes the schedules there."""
    if schedules.exists():
        return
    a_file = schedules.suffix == ".json"
    search = search_command(model, devices, batches, dtype, memory_format, input_shape,
                            None if a_file or schedules == Path(DEFAULT_OUT) else schedules)
    if a_file:
        raise UserError(f"no schedule file at {schedules}: pass one a search wrote ({search} writes them under "
                        f"{DEFAULT_OUT}), or the --out folder of a search.")
    raise UserError(f"no schedules at {schedules}: search first ({search} writes them there), or pass --schedules "
                    "with a schedule file or the --out folder of a search.")


def print_trade_offs(schedules: "list[Schedule]", graph: "Graph", lookup: "Lookup") -> None:
    """Per setting, the fastest schedule at each memory budget over the stored latencies: latency beside peak."""
    from ios_ray.app.search.budgets import trade_off_text
    from ios_ray.app.search.solver import stored_trade_off
    from ios_ray.stage import StageKeys

    keys = StageKeys(graph)
    for schedule in sorted(schedules, key=lambda s: (s.device, s.batch)):
        found = stored_trade_off(schedule, graph, keys, lookup)
        how = "simulated" if schedule.source == "simulated" else "predicted"
        print(f"{graph.name} on {schedule.device} bs{schedule.batch}: fastest schedule per memory budget (x: the "
              f"sequential schedule's peak), over the stages in the store")
        if found is None:
            print("  the store lacks a stage of the sequential schedule here")
            continue
        print("\n".join(trade_off_text(found[0], found[1], how)))


@app.command()
@user_errors
def evaluate(
    schedules: Path = typer.Option(DEFAULT_OUT, "--schedules", help="the --out folder of ios-ray search"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="only this model's schedules"),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    rounds: int = typer.Option(10, "--rounds", help="timed runs per measured cell"),
) -> None:
    """Cross-evaluate schedules (the paper's Table 3): the schedule made for X run on Y, for every X and Y."""
    at_least_one(rounds=rounds)
    from ios_ray.app.cli.evaluation import cross_evaluate, local_measures, settings_of, winners_hold
    from ios_ray.vocabulary import numerics_named
    from ios_ray.frontend import import_model
    from ios_ray.runtime import read_schedules

    _searched(schedules, model or "MODEL", "DEVICE", "BATCHES")
    found = list(read_schedules(schedules).values())
    # One table per model, input shape, dtype and memory format: the graph depends on all but the dtype (and, for a
    # few models, that too), the latencies on all four.
    models = sorted({(s.model, s.input_shape, s.dtype, s.memory_format) for s in found if model in (None, s.model)},
                    key=str)
    if not models:
        raise UserError(f"no schedules of model {model!r} under {schedules}.")
    lookup = store_lookup(store) or (lambda keys, fingerprint, batch, dtype: {})
    for name, shape, dtype, layout in models:
        graph = import_model(name, shape, dtype, layout).graph
        mine = [s for s in found if s.model == name and s.graph_fingerprint == graph.fingerprint and s.dtype == dtype]
        cells = cross_evaluate(mine, graph, lookup, local_measures(name, rounds, shape, dtype, layout))
        settings = settings_of(mine)
        in_dtype = "".join(f", {name}" for name in numerics_named(dtype, layout))
        table = Table("made for \\ run on", *(f"{d} bs{b}" for d, b in settings),
                      title=f"{name}{in_dtype}: latency in ms of the schedule made for X, run on Y")
        wins = winners_hold(cells)
        for made_for in settings:
            row = []
            for setting in settings:
                cell = next(c for c in cells if c.made_for == made_for and c.run_on == setting)
                text = "-" if cell.latency_ms is None else f"{cell.latency_ms:.3f}"
                row.append(f"[bold]{text}[/bold]" if cell.own else text)
            table.add_row(f"{made_for[0]} bs{made_for[1]}", *row)
        console.print(table)
        hows = sorted({c.how for c in cells})
        console.print(f"cells are {', '.join(hows)}; own-setting schedule fastest on: "
                      + ", ".join(f"{d} bs{b} {_verdict(wins[(d, b)])}" for d, b in settings))
        if all(c.latency_ms is None for c in cells):
            console.print(f"- : {store} lacks a stage of every schedule here; pass the store their search wrote "
                          "(--store)")
        elif any(c.latency_ms is None for c in cells):
            console.print("- : the store lacks a stage of that schedule on that setting (a lazy search measures only "
                          "what can change its own schedule; search with --measure all to fill every cell)")
        print_trade_offs(mine, graph, lookup)


def _verdict(holds: bool | None) -> str:
    """A setting's own schedule fastest there: yes, NO, or - where its own cell is missing."""
    return "-" if holds is None else "yes" if holds else "NO"


def _torch_device(label: str) -> "torch.device":
    """A torch device from --device, with a clear error where this machine lacks it."""
    import torch

    try:
        device = torch.device(label)
    except RuntimeError:
        raise UserError(f"--device must be cpu or cuda[:i], not {label!r}.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {label!r} needs a CUDA GPU, and torch sees none on this machine.")
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda[:i], not {label!r}.")
    return device


def _bench_target(label: str) -> "torch.device":
    """The torch device that runs the schedules of a device label: the CPU for ``cpu``, else a CUDA GPU."""
    import torch

    if is_simulated(label):
        raise UserError(f"{label!r} is simulated and bench measures on this machine; compare simulated schedules "
                        "by prediction with `ios-ray evaluate --schedules DIR`.")
    if label == "cpu" or label.startswith("cuda"):
        return _torch_device(label)
    if not torch.cuda.is_available():
        raise UserError(f"schedules for {label!r} run on a CUDA GPU, and torch sees none on this machine.")
    return torch.device("cuda")
