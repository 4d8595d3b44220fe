"""`ios-ray store ...`: inspect, export and import the latency store."""

from __future__ import annotations

import datetime as dt
import io
import json
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import JustifyMethod
from rich.table import Table

from ios_ray.app.cli.util import user_errors
from ios_ray.app.search.progress import make_console
from ios_ray.store import DEFAULT_STORE_PATH

if TYPE_CHECKING:
    import pyarrow as pa

    from ios_ray.store.latency_store import LatencyStore

store_app = typer.Typer(
    help="Inspect, export and import the latency store.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

StorePath = Annotated[Path, typer.Option("--store", help="Latency store file.")]
_TABLE_COLUMNS = (
    "stage_key",
    "batch",
    "dtype",
    "strategy",
    "source",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "samples",
    "model",
)
_NUMERIC_COLUMNS = ("batch", "median_ms", "p10_ms", "p90_ms", "samples")
_SHORT_KEY = 12  # the table shows key prefixes; --format json/csv give whole keys


class OutputFormat(str, Enum):
    """How `store query` prints its rows."""

    table = "table"
    json = "json"
    csv = "csv"


@store_app.command()
@user_errors
def stats(store: StorePath = DEFAULT_STORE_PATH) -> None:
    """Rows per device, batch, dtype and source, and the file size."""
    latency_store = _open(store, create=False)
    counts = latency_store.stats().to_pylist()
    table = Table(title=f"latency store {store}")
    for column in ("device", "batch", "dtype", "source", "rows"):
        table.add_column(column, justify="right" if column in ("batch", "rows") else "left")
    for row in counts:
        table.add_row(row["device"], str(row["batch"]), row["dtype"], row["source"], f"{row['rows']:,}")
    table.caption = f"{sum(row['rows'] for row in counts):,} rows, {_size(latency_store.file_bytes)}"
    make_console().print(table)


@store_app.command()
@user_errors
def query(
    device: Annotated[str, typer.Option("--device", help="Device label, e.g. v100, cpu, sim:v100.")],
    batch: Annotated[int | None, typer.Option("--batch", help="Batch size.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model the stage was first measured for.")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = OutputFormat.table,
    store: StorePath = DEFAULT_STORE_PATH,
) -> None:
    """Print the measurements of one device (optionally one batch size and model)."""
    rows = _open(store, create=False).query(device=device, batch=batch, model=model)
    if output is OutputFormat.json:
        typer.echo(json.dumps(rows.to_pylist(), default=_json_value, indent=1))
    elif output is OutputFormat.csv:
        import pyarrow.csv

        buffer = io.BytesIO()
        pyarrow.csv.write_csv(rows, buffer)
        typer.echo(buffer.getvalue().decode(), nl=False)
    else:
        make_console().print(_rich_rows(rows, title=f"{rows.num_rows:,} measurements for device {device}"))


@store_app.command("export")
@user_errors
def export_store(
    directory: Annotated[Path, typer.Argument(help="New or empty folder for the Parquet files.")],
    store: StorePath = DEFAULT_STORE_PATH,
) -> None:
    """Write every row as hive-partitioned Parquet (DIR/device=<label>/batch=<n>/)."""
    written = _open(store, create=False).export(directory)
    typer.echo(f"exported {written:,} rows to {directory}")


@store_app.command("import")
@user_errors
def import_store(
    directory: Annotated[Path, typer.Argument(help="A folder written by `ios-ray store export`.")],
    store: StorePath = DEFAULT_STORE_PATH,
) -> None:
    """Merge an exported folder into the store (newer measurements win); print the rows added."""
    added = _open(store, create=True).import_(directory)
    typer.echo(f"imported {added:,} new rows into {store}")


def _open(store: Path, create: bool) -> LatencyStore:
    from ios_ray.store.latency_store import LatencyStore  # loads duckdb only when a store command runs

    return LatencyStore(store, create=create)


def _rich_rows(rows: pa.Table, title: str) -> Table:
    table = Table(title=title)
    for column in _TABLE_COLUMNS:
        justify: JustifyMethod = "right" if column in _NUMERIC_COLUMNS else "left"
        table.add_column(column, justify=justify, overflow="fold")
    for row in rows.select(list(_TABLE_COLUMNS)).to_pylist():
        row["stage_key"] = row["stage_key"][:_SHORT_KEY]
        table.add_row(*(_cell_text(row[column]) for column in _TABLE_COLUMNS))
    return table


def _cell_text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "" if value is None else str(value)


def _json_value(value: object) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _size(size: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
