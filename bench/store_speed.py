"""Latency store speed: insert 100,000 rows (100 batches of 1,000, and one put) and look up 10,000 keys.

Run: python bench/store_speed.py   (exit code 1 when a target is missed)
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from ios_ray.store import LatencyStore, rows_to_table

ROWS = 100_000
BATCH_ROWS = 1_000
LOOKUP_KEYS = 10_000
FINGERPRINT = "3f9a1c2b7d4e5f60"
INSERT_TARGET_S = 2.0
LOOKUP_TARGET_S = 0.2
REPEATS = 3


def make_rows(count: int) -> pa.Table:
    """Fake measurements shaped like a search's: a 64-hex stage key and a few hundred bytes of stage JSON."""
    info = {
        "name": "NVIDIA Tesla V100-SXM2-16GB",
        "capability": "7.0",
        "driver": "535.104",
        "torch": "2.3.0",
        "cuda": "12.1",
    }
    now = dt.datetime.now(dt.timezone.utc)
    rows = [
        {
            "stage_key": f"{i:064x}",
            "device": "v100",
            "device_fingerprint": FINGERPRINT,
            "device_info": info,
            "batch": 32,
            "dtype": "float32",
            "strategy": "concurrent" if i % 3 else "merge",
            "source": "measured",
            "median_ms": 0.1 + i % 997 / 100,
            "p10_ms": 0.09 + i % 997 / 100,
            "p90_ms": 0.12 + i % 997 / 100,
            "samples": 20,
            "warmup": 5,
            "repeat": 20,
            "host": "worker-3",
            "measured_at": now,
            "stage": json.dumps({"groups": [[{"kind": "conv", "out": 64 + i % 7, "kernel": [3, 3], "stride": 1}]] * 3}),
            "model": "inception_v3",
        }
        for i in range(count)
    ]
    return rows_to_table(rows)


def timed(action: Callable[[], object]) -> float:
    """Seconds taken by one call of `action`."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def put_batches(store: LatencyStore, table: pa.Table) -> None:
    """Put `table` in batches of BATCH_ROWS, as a search does."""
    for offset in range(0, table.num_rows, BATCH_ROWS):
        store.put(table.slice(offset, BATCH_ROWS))


def measure(folder: Path, table: pa.Table) -> list[tuple[str, list[float], float | None]]:
    """Run every measurement REPEATS times on ROWS rows (REPEATS more are spares): (name, seconds per run, target)."""
    table, spares = table.slice(0, ROWS), table.slice(ROWS)
    keys = table["stage_key"].to_pylist()[:: ROWS // LOOKUP_KEYS]
    fresh = (LatencyStore(folder / f"store-{i}.duckdb") for i in itertools.count())
    spare = itertools.count()
    full = LatencyStore(folder / "full.duckdb")
    full.put(table)
    tiny = LatencyStore(folder / "tiny.duckdb")
    tiny.put(table.slice(0, 1))
    runs = {
        (f"insert {ROWS:,} rows as {ROWS // BATCH_ROWS} puts of {BATCH_ROWS:,}", INSERT_TARGET_S): lambda: put_batches(
            next(fresh), table
        ),
        (f"insert {ROWS:,} rows in one put", INSERT_TARGET_S): lambda: next(fresh).put(table),
        (f"re-put the same {ROWS:,} rows (updates)", INSERT_TARGET_S): lambda: full.put(table),
        (f"lookup {LOOKUP_KEYS:,} keys", LOOKUP_TARGET_S): lambda: full.lookup(keys, FINGERPRINT, 32),
        (f"1-row put, new key, {ROWS:,}-row store", None): lambda: full.put(spares.slice(next(spare), 1)),
        ("1-key lookup, 1-row store (overhead)", None): lambda: tiny.lookup(keys[:1], FINGERPRINT, 32),
    }
    return [(name, [timed(run) for _ in range(REPEATS)], target) for (name, target), run in runs.items()]


def main() -> int:
    """Run the measurements, print the comparison table and return the exit code."""
    table = make_rows(ROWS + REPEATS)
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(Path(tmp), table)
    report = Table(
        title=f"latency store speed, best of {REPEATS} runs ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})"
    )
    for column in ("measurement", "best s", "all runs s", "target s", "result"):
        report.add_column(column, justify="left" if column == "measurement" else "right")
    for name, seconds, target in results:
        verdict = "" if target is None else "PASS" if min(seconds) < target else "[red]FAIL[/red]"
        report.add_row(
            name,
            f"{min(seconds):.4f}",
            " ".join(f"{s:.3f}" for s in seconds),
            "" if target is None else f"< {target}",
            verdict,
        )
    Console().print(report)
    return 0 if all(target is None or min(seconds) < target for _, seconds, target in results) else 1


if __name__ == "__main__":
    sys.exit(main())
