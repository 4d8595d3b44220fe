"""The ``ios-ray`` command line (typer). Each command is a thin shell over the library."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from ios_ray.cli_util import user_errors

app = typer.Typer(
    help="ios-ray: find and deploy the fastest inter-operator schedule of a CNN per device and batch size.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()

MODEL_HELP = "zoo name (see `ios-ray models`) or package.module:factory"


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


def _mount_subcommands() -> None:
    """Attach the command groups that live in the subpackages."""
    from ios_ray.store.cli import store_app

    app.add_typer(store_app, name="store", help="Read, export and import the latency store.")


_mount_subcommands()
