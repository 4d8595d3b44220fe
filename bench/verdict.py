"""What a bench of several parts prints around its tables: the machine's load before and after, and one verdict; and
whether a ratio interval meets a target beyond noise."""

from __future__ import annotations

import os
import sys
from typing import Callable, Mapping

from rich.console import Console
from rich.table import Table

from ios_ray.paired import RatioInterval

#: One part of a bench: prints what it must on the console and returns its table and whether its targets are met.
Part = Callable[[Console], "tuple[Table, bool]"]


def run_parts(parts: Mapping[str, Part], only: str | None, width: int) -> int:
    """Run every part (or only the one named ``only``), printing each table; the exit status, 0 when every target
    of what ran is met."""
    console = Console() if sys.stdout.isatty() else Console(width=width)
    console.print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start")
    passed = True
    for name, part in parts.items():
        if only in (None, name):
            table, ok = part(console)
            console.print(table)
            passed &= ok
    console.print(f"load {os.getloadavg()[0]:.1f} at end; overall: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


def clears(interval: RatioInterval, least: float | None = None, most: float | None = None) -> bool:
    """Whether the whole interval lies at or above ``least`` and at or below ``most`` (a target met beyond noise)."""
    above = least is None or (interval.low is not None and interval.low >= least)
    below = most is None or (interval.high is not None and interval.high <= most)
    return above and below


def inverted(interval: RatioInterval) -> RatioInterval:
    """The interval of the reciprocal ratios (b / a for a / b): a speedup from a time ratio."""
    return RatioInterval(1 / interval.median, None if interval.high is None else 1 / interval.high,
                         None if interval.low is None else 1 / interval.low, interval.confidence, interval.rounds)
