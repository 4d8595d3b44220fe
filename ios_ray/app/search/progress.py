"""Where a search reports progress (:class:`SearchProgress`), and the rich progress bars of ``ios-ray search``: one
bar per device (stages measured of those asked for, cached, rate, ETA).

A search says first which Ray it runs on (its nodes and the devices they offer), then, per (device, batch), one
line of which schedule it kept and why, and last where its time went, by phase (``searched in 10.7 s: start-up 5.5,
import 1.8, ...``: :mod:`~ios_ray.app.search.phases`). A device's bar counts what the whole search measured on it (a
lazy search's rounds add up), and ``cached`` what it found stored before it measured anything: the sums of the table's
``measured`` and ``cached`` over the device's batches.

Before the bars, a spinner says what the search is doing (importing the model and planning its stages, with the
lazy search's states, transitions and stage relations; then starting the devices): seconds on small models, a
minute or two on the largest (PNASNet-5 Large: 120,000 stages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TaskID, TimeRemainingColumn)

from ios_ray.frontend import opaque_report
from ios_ray.ir import Graph
from ios_ray.scheduler import Plan
from ios_ray.vocabulary import KERNEL_NAMES

if TYPE_CHECKING:
    from ios_ray.app.search.outcome import SearchOutcome
    from ios_ray.app.search.phases import SearchTimes


class SearchProgress(Protocol):
    """Where the search reports progress (the CLI draws rich progress bars; subclass :class:`SilentProgress` to hear
    only some of it)."""

    def cluster(self, summary: str) -> None:
        """The search runs on this Ray (a line: where, its nodes, the devices they offer)."""

    def planned(self, graph: Graph, plan: Plan) -> None:
        """The model is imported and its candidate stages are known."""

    def device_started(self, device: str, total: int, cached: int) -> None:
        """A device has ``total`` stages to measure (in this round, for a lazy search: once per round); ``cached``
        more were found in the store."""

    def advanced(self, device: str, done: int, total: int) -> None:
        """``done`` of ``total`` stages of a device are measured."""

    def choosing_kernels(self, device: str, batch: int) -> None:
        """The sequential schedule of (device, batch) is being timed with each kernels, to choose them."""

    def checking(self, device: str, batch: int) -> None:
        """The candidates of (device, batch) are being timed end to end."""

    def kept(self, outcome: SearchOutcome) -> None:
        """A (device, batch) is decided: its outcome says which schedule it kept and why."""

    def finished(self, times: SearchTimes) -> None:
        """The search is done: where its time went, by phase (:mod:`~ios_ray.app.search.phases`)."""


class RichSearchProgress:
    """Draws the search's progress on a console; use as a context manager around the search."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bars = Progress(
            TextColumn("[bold]{task.fields[device]:<12}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[cached]} cached"), TextColumn("[cyan]{task.fields[rate]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
        )
        self.tasks: dict[str, TaskID] = {}
        self.before: dict[str, int] = {}  # per device, the stages measured in the rounds before this one
        self.status = console.status("starting the devices, importing the model and planning its candidate stages "
                                     "(states, transitions and stage relations per block)")

    def __enter__(self) -> "RichSearchProgress":
        self.status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.status.stop()
        if self.tasks:
            self.bars.stop()

    def cluster(self, summary: str) -> None:
        """Say which Ray the search runs on."""
        self.console.print(summary, highlight=False, soft_wrap=True)

    def planned(self, graph: Graph, plan: Plan) -> None:
        """Report the model's size and its distinct candidate stages; warn in one line where many units are opaque."""
        self.console.print(
            f"{graph.name}: {len(graph.units)} units in {len(graph.blocks)} block{'s' * (len(graph.blocks) != 1)}, "
            f"{len(plan.stages)} distinct candidate stages (r={plan.params.r}, s={plan.params.s})"
        )
        opaque = opaque_report(graph)
        if opaque.warrants_warning:
            self.console.print(f"warning: {opaque.summary()}; they run their original code one op at a time (see "
                               "ios-ray inspect)", highlight=False, soft_wrap=True)
        self.status.update("looking up the store")

    def device_started(self, device: str, total: int, cached: int) -> None:
        """Add a bar for a device (the bars show from the first one on), or extend it by a lazy search's round."""
        if not self.tasks:
            self.status.stop()
            self.bars.start()
        if device not in self.tasks:
            self.tasks[device] = self.bars.add_task(device, total=0, device=device, cached=cached, rate="")
        task = self.tasks[device]
        self.before[device] = int(self.bars.tasks[task].completed)
        self.bars.update(task, total=self.before[device] + max(total, 0), cached=cached)

    def advanced(self, device: str, done: int, total: int) -> None:
        """Move a device's bar."""
        task = self.tasks[device]
        self.bars.update(task, completed=self.before[device] + done, total=self.before[device] + total)
        speed = self.bars.tasks[task].speed
        self.bars.update(task, rate=f"{speed:.1f} stages/s" if speed else "")

    def choosing_kernels(self, device: str, batch: int) -> None:
        """Say that the kernels are being chosen."""
        turns = ", then ".join(KERNEL_NAMES[1:])
        self.console.print(f"{device} batch {batch}: timing the sequential schedule with each kernels in turns "
                           f"({turns})")
        self.status.update(f"{device} batch {batch}: timing the kernels")

    def checking(self, device: str, batch: int) -> None:
        """Say which schedules are being timed end to end."""
        self.console.print(f"{device} batch {batch}: timing the candidates end to end (IOS, its alternatives, greedy, "
                           "sequential)")

    def kept(self, outcome: SearchOutcome) -> None:
        """Say which schedule a (device, batch) keeps and why, and warn where it is slower than the model as is."""
        self.console.print(outcome.summary(), highlight=False, soft_wrap=True)
        if outcome.slower_than_as_is is not None:
            self.console.print(outcome.slower_than_as_is, highlight=False, soft_wrap=True)

    def finished(self, times: SearchTimes) -> None:
        """Say where the search's time went."""
        self.console.print(f"searched in {times.summary()}", highlight=False, soft_wrap=True)


class SilentProgress:
    """Reports nothing (``ios_ray.search(..., progress=False)``); a base for progress objects that report only some
    events."""

    def cluster(self, summary: str) -> None:
        """Say nothing."""

    def planned(self, graph: Graph, plan: Plan) -> None:
        """Say nothing."""

    def device_started(self, device: str, total: int, cached: int) -> None:
        """Say nothing."""

    def advanced(self, device: str, done: int, total: int) -> None:
        """Say nothing."""

    def choosing_kernels(self, device: str, batch: int) -> None:
        """Say nothing."""

    def checking(self, device: str, batch: int) -> None:
        """Say nothing."""

    def kept(self, outcome: SearchOutcome) -> None:
        """Say nothing."""

    def finished(self, times: SearchTimes) -> None:
        """Say nothing."""


def make_console() -> Console:
    """A rich console; 240 columns wide where output goes to a file or pipe, so tables keep their columns."""
    console = Console()
    return console if console.is_terminal else Console(width=240)
