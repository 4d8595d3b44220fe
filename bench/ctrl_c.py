"""Ctrl-C at random moments of a search: how the interrupted command ends, counted over many runs.

Each run starts ``ios-ray search`` (Inception V3 on ``sim:k80``, every stage measured, one sim actor, a fresh store)
as a terminal's foreground job, waits until its store exists (Ray may still be starting) and a random 0 to 4 s more,
and sends SIGINT to its process group, as a terminal's Ctrl-C does. The right end is exit 130 with one line,
"interrupted: ... stored"; a negative exit is a crash (-11: a segfault), and exit 0 a Ctrl-C that was lost (the search
ran on to the end).

Run: python bench/ctrl_c.py [--runs 40] [--seed 23]   (exit code 1 when any run ended otherwise than 130 and one line)
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
INTERRUPTED = 130
STORE_WAIT_S = 120.0
EXIT_WAIT_S = 90.0


def one_run(folder: Path, chance: random.Random) -> tuple[int | str, str]:
    """One interrupted search in ``folder``: its exit status ("hang" where it did not end) and its stderr."""
    store = folder / "store.duckdb"
    command = [sys.executable, "-m", "ios_ray", "search", "--model", "inception_v3", "--devices", "sim:k80",
               "--batches", "1", "--measure", "all", "--sim-actors", "1", "--store", str(store), "--out",
               str(folder / "out")]
    child = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    started = time.monotonic()
    while not store.exists() and child.poll() is None and time.monotonic() - started < STORE_WAIT_S:
        time.sleep(0.2)
    time.sleep(chance.uniform(0.0, 4.0))
    os.killpg(child.pid, signal.SIGINT)
    try:
        _, err = child.communicate(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        _, err = child.communicate()
        return "hang", err
    return child.returncode, err


def main() -> int:
    """Run the searches, print the table of how they ended; 1 where any ended badly."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args()
    chance = random.Random(args.seed)
    ends: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(args.runs):
            folder = Path(scratch) / f"run{number}"
            folder.mkdir()
            status, err = one_run(folder, chance)
            clean = status == INTERRUPTED and len(err.strip().splitlines()) == 1 and "interrupted" in err
            ends["130, one line" if clean else f"{status}, {len(err.strip().splitlines())} stderr line(s)"] += 1
            print(f"run {number}: exit {status}", flush=True)
    table = Table("how the run ended", "runs", title=f"Ctrl-C at random moments of {args.runs} searches")
    for end, count in sorted(ends.items()):
        table.add_row(end, str(count))
    Console(width=160).print(table)
    bad = args.runs - ends["130, one line"]
    print(f"target: every run ends with exit 130 and one line: {'PASS' if not bad else f'FAIL ({bad} did not)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
