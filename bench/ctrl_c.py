"""Ctrl-C at random moments of a search: how the interrupted command ends, and how soon, counted over many runs.

Each run starts ``ios-ray search`` (Inception V3 on ``sim:k80``, every stage measured, one sim actor, a fresh store)
as a terminal's foreground job, waits until its store exists (Ray may still be starting) and a random 0 to 4 s more,
and sends SIGINT to its process group, as a terminal's Ctrl-C does (``--signal TERM``: SIGTERM to the group, as
``timeout`` and systemd send it). The right end is exit 130 (143 for SIGTERM) with one line, "interrupted: ...
stored" ("terminated: ..."); a negative exit is a crash (-11: a segfault), and exit 0 a signal that was lost (the
search ran on to the end). The table also says how many seconds each run took from the signal to its end.

Run: python bench/ctrl_c.py [--runs 40] [--seed 23] [--signal INT]   (exit code 1 when any run ended otherwise than
with its exit status and one line)
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
#: Per signal sent: the exit status and the first word of the one line a search stopped by it ends with.
ENDS = {"INT": (130, "interrupted"), "TERM": (143, "terminated")}
STORE_WAIT_S = 120.0
EXIT_WAIT_S = 90.0


def one_run(folder: Path, chance: random.Random, sent: signal.Signals) -> tuple[int | str, str, float]:
    """One search in ``folder`` stopped by ``sent``: its exit status ("hang" where it did not end), its stderr and
    the seconds from the signal to its end."""
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
    os.killpg(child.pid, sent)
    signalled = time.monotonic()
    try:
        _, err = child.communicate(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        _, err = child.communicate()
        return "hang", err, time.monotonic() - signalled
    return child.returncode, err, time.monotonic() - signalled


def main() -> int:
    """Run the searches, print the table of how they ended; 1 where any ended badly."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--signal", choices=sorted(ENDS), default="INT", help="sent to the search's process group")
    args = parser.parse_args()
    chance = random.Random(args.seed)
    sent = signal.Signals[f"SIG{args.signal}"]
    status_wanted, word = ENDS[args.signal]
    right = f"{status_wanted}, one line"
    ends: dict[str, list[float]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(args.runs):
            folder = Path(scratch) / f"run{number}"
            folder.mkdir()
            status, err, seconds = one_run(folder, chance, sent)
            clean = status == status_wanted and len(err.strip().splitlines()) == 1 and word in err
            ends[right if clean else f"{status}, {len(err.strip().splitlines())} stderr line(s)"].append(seconds)
            print(f"run {number}: exit {status} {seconds:.1f} s after the signal", flush=True)
    table = Table("how the run ended", "runs", "s from the signal to the end: median (min-max)",
                  title=f"SIG{args.signal} to the process group at random moments of {args.runs} searches")
    for end, seconds in sorted(ends.items()):
        spread = f"{statistics.median(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f})"
        table.add_row(end, str(len(seconds)), spread)
    Console(width=160).print(table)
    bad = args.runs - len(ends[right])
    print(f"target: every run ends with exit {status_wanted} and one line: "
          f"{'PASS' if not bad else f'FAIL ({bad} did not)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
