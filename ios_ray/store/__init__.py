"""The DuckDB/Parquet latency store: every stage measurement, keyed by device fingerprint, batch and dtype.

Names load on first use, so `import ios_ray.store` (and the CLI that mounts `store_app`) does not load duckdb.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

DEFAULT_STORE_PATH = Path("ios_store") / "latency.duckdb"

_HOMES = {
    "LatencyStore": "latency_store",
    "FORMAT_VERSION": "schema",
    "KEY_COLUMNS": "schema",
    "STORE_SCHEMA": "schema",
    "rows_to_table": "schema",
}

if TYPE_CHECKING:
    from ios_ray.store.latency_store import LatencyStore
    from ios_ray.store.schema import FORMAT_VERSION, KEY_COLUMNS, STORE_SCHEMA, rows_to_table


def __getattr__(name: str) -> Any:
    """Import the module that defines `name` when it is first asked for."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


#: Written out (not derived from ``_HOMES``) so that linters and type checkers see the re-exports.
__all__ = ["DEFAULT_STORE_PATH", "LatencyStore", "FORMAT_VERSION", "KEY_COLUMNS", "STORE_SCHEMA", "rows_to_table"]
