"""The latency store's row schema: the Arrow schema, the DuckDB tables derived from it, and row checks.

One row per measurement key (stage_key, device_fingerprint, batch, dtype). `measured_at` is a naive
TIMESTAMP holding UTC. `device_info` and `stage` hold JSON text. Beside the latencies, the `runs` table keeps the
schedules timed whole (:data:`RUN_SCHEMA`), from which a search fits its correction of stage costs; a store made
before it gets it at its first write.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ios_ray.errors import UserError
from ios_ray.vocabulary import SIM_PREFIX, SOURCES, STRATEGIES

FORMAT_NAME = "ios-ray-latency-store"
FORMAT_VERSION = 1
KEY_COLUMNS = ("stage_key", "device_fingerprint", "batch", "dtype")
JSON_COLUMNS = ("device_info", "stage")

STORE_SCHEMA = pa.schema(
    [
        pa.field("stage_key", pa.string(), nullable=False),
        pa.field("device", pa.string(), nullable=False),
        pa.field("device_fingerprint", pa.string(), nullable=False),
        pa.field("device_info", pa.string(), nullable=False),
        pa.field("batch", pa.int32(), nullable=False),
        pa.field("dtype", pa.string(), nullable=False),
        pa.field("strategy", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("median_ms", pa.float64(), nullable=False),
        pa.field("p10_ms", pa.float64(), nullable=False),
        pa.field("p90_ms", pa.float64(), nullable=False),
        pa.field("samples", pa.int32(), nullable=False),
        pa.field("warmup", pa.int32(), nullable=False),
        pa.field("repeat", pa.int32(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("measured_at", pa.timestamp("us"), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=True),
    ]
)

#: The schedules timed whole on a device (each candidate of a search's end-to-end check), one row each: what a
#: correction of stage costs for (device_fingerprint, batch, dtype) is fitted from (ios_ray/scheduler/correction.py).
RUN_SCHEMA = pa.schema(
    [
        pa.field("device", pa.string(), nullable=False),
        pa.field("device_fingerprint", pa.string(), nullable=False),
        pa.field("batch", pa.int32(), nullable=False),
        pa.field("dtype", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("graph_fingerprint", pa.string(), nullable=False),
        pa.field("schedule", pa.string(), nullable=False),
        pa.field("predicted_ms", pa.float64(), nullable=False),
        pa.field("stages", pa.int32(), nullable=False),
        pa.field("extra_groups", pa.int32(), nullable=False),
        pa.field("measured_ms", pa.float64(), nullable=False),
        pa.field("rounds", pa.int32(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("measured_at", pa.timestamp("us"), nullable=False),
    ]
)

_SQL_TYPES = {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.float64(): "DOUBLE", pa.timestamp("us"): "TIMESTAMP"}


def quote(name: str) -> str:
    """Quote an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _columns(schema: pa.Schema) -> list[str]:
    """The SQL column definitions of an Arrow schema."""
    return [f"{quote(f.name)} {_SQL_TYPES[f.type]}{'' if f.nullable else ' NOT NULL'}" for f in schema]


def runs_statement(catalog: str) -> str:
    """SQL that creates the `runs` table in the attached `catalog` where it is missing (stores made before it)."""
    return f"CREATE TABLE IF NOT EXISTS {catalog}.runs ({', '.join(_columns(RUN_SCHEMA))}, CHECK (batch > 0))"


def create_statements(catalog: str) -> list[str]:
    """SQL that creates the `latency`, `runs` and `meta` tables of an empty store in the attached `catalog`."""
    columns = _columns(STORE_SCHEMA)
    checks = [
        f"CHECK (source IN {tuple(SOURCES)})",
        f"CHECK (strategy IN {tuple(STRATEGIES)})",
        "CHECK (batch > 0)",
        f"PRIMARY KEY ({', '.join(KEY_COLUMNS)})",
    ]
    return [
        f"CREATE TABLE {catalog}.latency ({', '.join(columns + checks)})",
        runs_statement(catalog),
        f"CREATE TABLE {catalog}.meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
        f"INSERT INTO {catalog}.meta VALUES ('format', '{FORMAT_NAME}'), ('version', '{FORMAT_VERSION}')",
    ]


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Build a store-schema Arrow table from row dicts.

    `device_info` and `stage` may be dicts (they are written as sorted JSON); `model` defaults to None and
    `measured_at` to now; an aware `measured_at` is converted to UTC and a naive one is taken as UTC.
    """
    unknown = sorted(set().union(*rows) - set(STORE_SCHEMA.names)) if rows else []
    if unknown:
        raise UserError(
            f"latency rows have unknown field(s) {', '.join(unknown)}; allowed: {', '.join(STORE_SCHEMA.names)}."
        )
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    arrays = [_column([_cell(row, i, field.name, now) for i, row in enumerate(rows)], field) for field in STORE_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=STORE_SCHEMA)


def _cell(row: Mapping[str, Any], index: int, name: str, now: dt.datetime) -> Any:
    if name not in row:
        if name == "model":
            return None
        if name == "measured_at":
            return now
        raise UserError(
            f"latency row {index} lacks the field '{name}'; every row needs {', '.join(STORE_SCHEMA.names[:-1])}."
        )
    value = row[name]
    if name in JSON_COLUMNS and not isinstance(value, str):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return value


def _column(values: list[Any], field: pa.Field) -> pa.Array:
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as err:
        raise UserError(f"latency field '{field.name}' must hold {field.type} values ({err}).") from None


def conform(table: pa.Table, origin: str = "latency rows", fix: str = "build them with rows_to_table()") -> pa.Table:
    """Return `table` cast to STORE_SCHEMA, checked, with one row per key (the last one wins).

    `origin` names the rows and `fix` says what to do, in the UserError raised when they do not fit.
    """
    missing = [name for name in STORE_SCHEMA.names if name not in table.column_names]
    extra = [name for name in table.column_names if name not in STORE_SCHEMA.names]
    if missing or extra:
        raise UserError(
            f"{origin} do not have the latency store columns (missing: {', '.join(missing) or 'none'}; "
            f"unknown: {', '.join(extra) or 'none'}); {fix}."
        )
    try:
        table = table.select(STORE_SCHEMA.names).cast(STORE_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise UserError(f"{origin} do not match the latency store types ({err}); {fix}.") from None
    _check_values(table)
    return _last_per_key(table)


def _check_values(table: pa.Table) -> None:
    for field in STORE_SCHEMA:
        if not field.nullable and table[field.name].null_count:
            raise UserError(f"latency column '{field.name}' has empty values; every row needs one.")
    _reject(
        table,
        pc.invert(pc.is_in(table["source"], value_set=pa.array(SOURCES))),
        "source",
        f"must be one of {', '.join(SOURCES)}",
    )
    _reject(
        table,
        pc.invert(pc.is_in(table["strategy"], value_set=pa.array(STRATEGIES))),
        "strategy",
        f"must be one of {', '.join(STRATEGIES)}",
    )
    _reject(table, pc.less_equal(table["batch"], 0), "batch", "must be a positive batch size")
    _reject(table, pc.invert(pc.greater_equal(table["median_ms"], 0.0)), "median_ms", "must be a latency >= 0")
    simulated_device = pc.starts_with(table["device"], SIM_PREFIX)
    simulated_source = pc.equal(table["source"], "simulated")
    _reject(
        table,
        pc.not_equal(simulated_device, simulated_source),
        "device",
        f"needs source 'simulated' exactly when the label starts with '{SIM_PREFIX}'",
    )


def _reject(table: pa.Table, bad: pa.ChunkedArray, column: str, rule: str) -> None:
    if pc.any(bad).as_py():
        value = table[column][pc.index(bad, True).as_py()].as_py()
        raise UserError(f"latency column '{column}' has the value {value!r}, but it {rule}.")


def _last_per_key(table: pa.Table) -> pa.Table:
    numbered = table.select(list(KEY_COLUMNS)).append_column("row", pa.array(np.arange(table.num_rows)))
    last = numbered.group_by(list(KEY_COLUMNS), use_threads=False).aggregate([("row", "max")])
    if last.num_rows == table.num_rows:
        return table
    return table.take(np.sort(last["row_max"].to_numpy()))
