"""The ``ios-ray`` app and the commands that plan: ``models``, ``inspect``, ``search``, ``show`` (the commands that
run schedules on this machine are in :mod:`~ios_ray.app.cli.deploy`). Each command is a thin shell over the library."""

from __future__ import annotations

import json
from inspect import signature as signature_of
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from ios_ray.app.cli.util import CommandLine, debug_option, parse_batches, parse_list, store_lookup, user_errors
from ios_ray.app.search.options import cli_parameters, from_cli, parse_input_shape
from ios_ray.app.search.progress import make_console
from ios_ray.store import DEFAULT_STORE_PATH
from ios_ray.vocabulary import DEFAULT_R, DEFAULT_S, spelt_shape

app = CommandLine(
    help="ios-ray: find and deploy the fastest inter-operator schedule of a CNN per device and batch size.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = make_console()
app.callback()(debug_option)

MODEL_HELP = ("zoo name (see `ios-ray models`), torchvision:NAME, timm:NAME, smp:ARCH or smp:ARCH/ENCODER, ultralytics:NAME or "
              "package.module:factory")
INPUT_SHAPE_HELP = "per-sample input shape CxHxW, e.g. 3x299x299 (default: the model's own)"
DTYPE_HELP = "float32, float16 or bfloat16: the precision the model runs in"
MEMORY_FORMAT_HELP = "contiguous (NCHW) or channels_last (NHWC): the layout of the model's 4-D weights and activations"
STORE_HELP = "latency store file (DuckDB)"


@app.command()
@user_errors
def models() -> None:
    """List the model zoo."""
    from ios_ray.zoo import ZOO

    table = Table("model", "input", "description")
    for entry in ZOO.values():
        table.add_row(entry.name, spelt_shape(entry.input_shape), entry.description)
    console.print(table)


@app.command()
@user_errors
def inspect(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    r: int = typer.Option(DEFAULT_R, "-r", help="pruning: max units per group"),
    s: int = typer.Option(DEFAULT_S, "-s", help="pruning: max groups per stage"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", help=INPUT_SHAPE_HELP),
) -> None:
    """Per block: units n, width d, and the size of the search with and without pruning; the opaque units."""
    from ios_ray.frontend import import_model
    from ios_ray.app.cli.inspection import inspect_graph

    report = inspect_graph(import_model(model, input_shape=parse_input_shape(input_shape)).graph, r=r, s=s)
    if as_json:
        print(json.dumps(report, indent=1))
        return
    columns = list(report["blocks"][0])
    table = Table(*columns, title=f"{report['model']}: {report['units']} units in {len(report['blocks'])} blocks")
    for row in report["blocks"]:
        table.add_row(*(str(row[c]) for c in columns))
    console.print(table)
    for key, value in report["totals"].items():
        console.print(f"{key}: {value}")
    console.print(report["opaque"]["summary"])


def search(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    devices: str = typer.Option("cpu", "--devices", "-d",
                                help="comma-separated device labels, e.g. v100,k80 or sim:v100"),
    batches: str = typer.Option("1", "--batches", "-b", help="comma-separated batch sizes, e.g. 1,32,128"),
    torch_compile: bool = typer.Option(False, "--torch-compile", help="search each graph torch.compile(model, "
                                       "backend='ios_ray') hands the backend, so that the compile only looks up"),
    **options: Any,
) -> None:
    """Find the fastest schedule of a model for every device and batch size, measuring only what is new."""
    from ios_ray.app.search.api import search as run
    from ios_ray.app.search.budgets import peaks_cell
    from ios_ray.app.search.progress import RichSearchProgress
    from ios_ray.schedule import CANDIDATES
    from ios_ray.vocabulary import numerics_named

    with RichSearchProgress(console) as progress:
        result = run(model, parse_list(devices, "--devices"), parse_batches(batches), progress=progress,
                     torch_compile=torch_compile, **from_cli(options))
    numerics = numerics_named(result.schedules[0].dtype, result.schedules[0].memory_format)
    in_dtype = f" in {' '.join(numerics)}" if numerics else ""
    corrected = any(o.correction.runs for o in result)
    table = Table(*(["graph"] if torch_compile else []), "device", "batch", "kernels", "IOS ms", "seq ms", "speedup",
                  "measured / planned", "cached", "wall s", "source", "end to end IOS / seq ms", "kept",
                  "kept / predicted", "peak IOS / seq MB",
                  title=f"ios-ray search: {model}{in_dtype} (predicted: sums of stages"
                        f"{', corrected from schedules run whole before' if corrected else ''})")
    for o in result:
        check = o.end_to_end
        over = None if check is None else check.kept_over_predicted
        table.add_row(*([o.schedule.model] if torch_compile else []), o.device, str(o.batch), o.schedule.kernels,
                      f"{o.predicted_ms:.3f}", f"{o.sequential_ms:.3f}", f"{o.speedup:.2f}x",
                      f"{o.measured} / {o.planned}",
                      str(o.cached), f"{o.wall_s:.1f}", o.source,
                      "-" if check is None else f"{check.dp_ms:.3f} / {check.sequential_ms:.3f}",
                      "IOS" if check is None else f"{CANDIDATES[check.kept]}: {check.reason}",
                      "-" if over is None else f"{over:.3f}", peaks_cell(o.schedule.memory))
    console.print(table)
    for why in getattr(result, "skipped", ()):
        console.print(f"not scheduled (runs as Dynamo hands it over): {why}")
    console.print(f"schedules written under {options['out']}/")
    again = sum(o.schedule.params.get("measure", {}).get("remeasured", 0) for o in result)
    if again:
        console.print(f"measured again: {again} stored stage(s) of a unit alone, far slower than a stage containing "
                      "it (an outlier from a burst of load)")
    if any(o.end_to_end is not None and o.end_to_end.kept == "sequential" for o in result):
        console.print("kept sequential: the IOS schedule was not faster end to end beyond noise there (the interval "
                      "of IOS / sequential did not lie wholly below 1)")


search.__signature__ = signature_of(search).replace(parameters=[  # type: ignore[attr-defined]
    *list(signature_of(search).parameters.values())[:4], *cli_parameters()])
app.command()(user_errors(search, stopped="everything measured so far is stored; rerun to resume."))


@app.command()
@user_errors
def show(
    schedule: Path = typer.Argument(..., help="a schedule file written by `ios-ray search`"),
    plot: Optional[list[Path]] = typer.Option(None, "--plot", help="also draw its timeline per stream or thread "
                                              "beside the sequential schedule's into this .png, .svg or .pdf file "
                                              "(repeat for several; needs matplotlib)"),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP + ": the latencies of units and groups "
                               "alone that the picture draws"),
) -> None:
    """Print a schedule's stages and groups, and optionally draw its timeline."""
    from ios_ray.frontend import import_model
    from ios_ray.app.search.budgets import schedule_memory
    from ios_ray.schedule import check_schedule, read_schedule
    from ios_ray.app.cli.show import schedule_text

    paths = list(plot or [])
    if paths:
        from ios_ray.app.cli.plot import check_plot_paths

        check_plot_paths(paths)
    plan = read_schedule(schedule)
    graph = import_model(plan.model, plan.input_shape, plan.dtype, plan.memory_format).graph
    check_schedule(plan, graph, where=str(schedule))
    print(schedule_text(plan, graph))
    if plan.memory is None:
        print(f"memory: {schedule_memory(plan, graph).summary()} (computed now: the file predates peak memory)")
    if paths:
        from ios_ray.app.cli.plot import plot_schedule
        from ios_ray.app.cli.timeline import timelines

        timeline, sequential = timelines(plan, graph, store_lookup(store))
        plot_schedule(plan, timeline, sequential, paths, str(store))
        console.print(f"picture written to {', '.join(map(str, paths))}")
