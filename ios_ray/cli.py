"""The ``ios-ray`` command line (typer). Each command is a thin shell over the library."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ios_ray.cli_util import parse_batches, parse_list, user_errors

app = typer.Typer(
    help="ios-ray: find and deploy the fastest inter-operator schedule of a CNN per device and batch size.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
if not console.is_terminal:
    console = Console(width=160)

MODEL_HELP = "zoo name (see `ios-ray models`) or package.module:factory"
STORE_HELP = "latency store file (DuckDB)"
DEFAULT_STORE = Path("ios_store/latency.duckdb")
DEFAULT_OUT = Path("schedules")


class StrategyChoice(str, Enum):
    """Which stage strategies the search may use."""

    both = "both"
    concurrent = "concurrent"
    merge = "merge"

    @property
    def strategies(self) -> tuple[str, ...]:
        """The strategy names for SearchParams."""
        return ("concurrent", "merge") if self is StrategyChoice.both else (self.value,)


@app.command()
@user_errors
def models() -> None:
    """List the model zoo."""
    from ios_ray.zoo import ZOO

    table = Table("model", "input", "description")
    for entry in ZOO.values():
        table.add_row(entry.name, "x".join(map(str, entry.input_shape)), entry.description)
    console.print(table)


@app.command()
@user_errors
def inspect(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    r: int = typer.Option(3, "-r", help="pruning: max units per group"),
    s: int = typer.Option(8, "-s", help="pruning: max groups per stage"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """Per block: units n, width d, and the size of the search with and without pruning."""
    from ios_ray.frontend import import_model
    from ios_ray.inspection import inspect_graph

    report = inspect_graph(import_model(model).graph, r=r, s=s)
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


@app.command()
@user_errors
def search(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    devices: str = typer.Option("cpu", "--devices", "-d", help="comma-separated device labels, e.g. v100,k80 or sim:v100"),
    batches: str = typer.Option("1", "--batches", "-b", help="comma-separated batch sizes, e.g. 1,32,128"),
    store: Path = typer.Option(DEFAULT_STORE, "--store", help=STORE_HELP),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="folder for OUT/<model>/<device>/bs<batch>.json"),
    r: int = typer.Option(3, "-r", help="pruning: max units per group"),
    s: int = typer.Option(8, "-s", help="pruning: max groups per stage"),
    strategy: StrategyChoice = typer.Option(StrategyChoice.both, "--strategy", help="stage strategies to consider"),
    address: Optional[str] = typer.Option(None, "--address", help="join a Ray cluster (auto or ray://...); "
                                          "default: start Ray locally in-process"),
    sim_actors: int = typer.Option(2, "--sim-actors", help="actors per sim: device where no node offers its GPU"),
) -> None:
    """Find the fastest schedule of a model for every device and batch size, measuring only what is new."""
    from ios_ray.cli_progress import RichSearchProgress
    from ios_ray.search import SearchParams
    from ios_ray.search_job import SearchRequest, run_search

    request = SearchRequest(
        model=model, devices=tuple(dict.fromkeys(parse_list(devices, "--devices"))),
        batches=tuple(dict.fromkeys(parse_batches(batches))), store=store, out=out,
        params=SearchParams(r=r, s=s, strategies=strategy.strategies), address=address, sim_actors=sim_actors,
    )
    with RichSearchProgress(console) as progress:
        outcomes = run_search(request, progress)
    table = Table("device", "batch", "IOS ms", "seq ms", "speedup", "measured", "cached", "wall s", "source",
                  title=f"ios-ray search: {model}")
    for o in outcomes:
        table.add_row(o.device, str(o.batch), f"{o.predicted_ms:.3f}", f"{o.sequential_ms:.3f}", f"{o.speedup:.2f}x",
                      str(o.measured), str(o.cached), f"{o.wall_s:.1f}", o.source)
    console.print(table)
    console.print(f"schedules written under {out}/")


@app.command()
@user_errors
def show(
    schedule: Path = typer.Argument(..., help="a schedule file written by `ios-ray search`"),
    svg: Optional[Path] = typer.Option(None, "--svg", help="also draw the stages and groups into this SVG file"),
) -> None:
    """Print a schedule's stages and groups, and optionally draw them as a picture."""
    from ios_ray.frontend import import_model
    from ios_ray.schedule import check_schedule, read_schedule
    from ios_ray.show import schedule_svg, schedule_text

    plan = read_schedule(schedule)
    graph = import_model(plan.model).graph
    check_schedule(plan, graph, where=str(schedule))
    print(schedule_text(plan, graph))
    if svg is not None:
        svg.write_text(schedule_svg(plan, graph))
        console.print(f"picture written to {svg}")


def _mount_subcommands() -> None:
    """Attach the command groups that live in the subpackages."""
    from ios_ray.store.cli import store_app

    app.add_typer(store_app, name="store", help="Read, export and import the latency store.")


_mount_subcommands()
