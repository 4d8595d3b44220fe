"""Test helper: fake latency rows, and a writer process that puts them in batches, one line per commit.

Run: python -m tests.store_writer STORE PREFIX BATCHES BATCH_ROWS [--pause SECONDS] [--wait] [--max-file-bytes N]
"""

from __future__ import annotations

import argparse
import resource
import signal
import sys
import time
from collections.abc import Sequence

import pyarrow as pa

from ios_ray.errors import UserError
from ios_ray.store import LatencyStore, rows_to_table

FINGERPRINT = "0123456789abcdef"


def fake_keys(prefix: str, count: int) -> list[str]:
    """Stage keys `<prefix>-000000`, `<prefix>-000001`, ..."""
    return [f"{prefix}-{i:06d}" for i in range(count)]


def fake_rows(
    keys: Sequence[str], median_ms: float = 1.0, fingerprint: str = FINGERPRINT, batch: int = 1, device: str = "cpu"
) -> pa.Table:
    """One fake measurement per key."""
    return rows_to_table(
        [
            {
                "stage_key": key,
                "device": device,
                "device_fingerprint": fingerprint,
                "device_info": {"name": "test cpu", "threads": 2},
                "batch": batch,
                "dtype": "float32",
                "strategy": "concurrent",
                "source": "simulated" if device.startswith("sim:") else "measured",
                "median_ms": median_ms,
                "p10_ms": median_ms * 0.9,
                "p90_ms": median_ms * 1.1,
                "samples": 10,
                "warmup": 2,
                "repeat": 10,
                "host": "test-host",
                "stage": {"units": [key], "groups": [[0]]},
                "model": "toy",
            }
            for key in keys
        ]
    )


def main() -> None:
    """Put BATCHES batches of BATCH_ROWS fake rows, printing `committed <n>` after each (the rows are made first,
    so that the writing loop spends its time in the store); with ``--wait``, it prints `ready` and starts once a
    line arrives on stdin; with
    ``--max-file-bytes``, no file may grow past that size (writes beyond it fail, as on a full disk). A UserError is
    printed as the CLI prints it, and exits 1."""
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("prefix")
    parser.add_argument("batches", type=int)
    parser.add_argument("batch_rows", type=int)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--max-file-bytes", type=int, default=None)
    args = parser.parse_args()
    keys = fake_keys(args.prefix, args.batches * args.batch_rows)
    batches = [fake_rows(keys[start : start + args.batch_rows]) for start in range(0, len(keys), args.batch_rows)]
    if args.max_file_bytes is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.max_file_bytes, resource.RLIM_INFINITY))
    if args.wait:
        print("ready", flush=True)
        sys.stdin.readline()
    try:
        store = LatencyStore(args.store)
        for number, rows in enumerate(batches, start=1):
            store.put(rows)
            print(f"committed {number}", flush=True)
            time.sleep(args.pause)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()


def missing(store: LatencyStore, keys: Sequence[str], fingerprint: str, batch: int) -> list[str]:
    """The keys (first-seen order, no repeats) the store lacks for this fingerprint and batch (float32)."""
    found = store.lookup(keys, fingerprint, batch)
    return [key for key in dict.fromkeys(keys) if key not in found]
