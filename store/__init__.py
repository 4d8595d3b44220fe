"""The DuckDB/Parquet latency store: every stage measurement, keyed by device fingerprint, batch and dtype."""

from ios_ray.store.latency_store import DEFAULT_STORE_PATH, LatencyStore, open_store
from ios_ray.store.schema import FORMAT_VERSION, KEY_COLUMNS, STORE_SCHEMA, rows_to_table

__all__ = ["DEFAULT_STORE_PATH", "FORMAT_VERSION", "KEY_COLUMNS", "STORE_SCHEMA", "LatencyStore", "open_store", "rows_to_table"]
