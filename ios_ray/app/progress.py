"""Where a search reports progress (:class:`SearchProgress`), and the rich progress bars of ``ios-ray search``: one
bar per device (stages measured of total, cached, rate, ETA).

Before the bars, a spinner says what the search is doing (importing the model and planning its stages, with the
lazy search's states, transitions and stage relations; then starting the devices): seconds on small models, a
minute or two on the largest (PNASNet-5 Large: 120,000 stages).
"""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from ios_ray.frontend import opaque_report
from ios_ray.ir import Graph
from ios_ray.scheduler import Plan


class SearchProgress(Protocol):
    """Where the search reports progress (the CLI draws rich progress bars)."""

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
        """The DP and sequential schedules of (device, batch) are being timed end to end."""


class RichSearchProgress:
    """Draws the search's progress on a console; use as a context manager around the search."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bars = Progress(
            TextColumn("[bold]{task.fields[device]:<12}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[cached]} cached"), TextColumn("[cyan]{task.fields[rate]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
        )
        self.tasks: dict[str, int] = {}
        self.status = console.status("importing the model and planning its candidate stages (states, transitions "
                                     "and stage relations per block)")

    def __enter__(self) -> "RichSearchProgress":
        self.status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.status.stop()
        if self.tasks:
            self.bars.stop()

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
        self.status.update("starting the devices and looking up the store")

    def device_started(self, device: str, total: int, cached: int) -> None:
        """Add a bar for a device (the bars show from the first one on), or restart it for a lazy search's round."""
        if not self.tasks:
            self.status.stop()
            self.bars.start()
        if device in self.tasks:
            self.bars.reset(self.tasks[device], total=max(total, 0), device=device, cached=cached, rate="")
            return
        self.tasks[device] = self.bars.add_task(device, total=max(total, 0), device=device, cached=cached, rate="")

    def advanced(self, device: str, done: int, total: int) -> None:
        """Move a device's bar."""
        task = self.tasks[device]
        self.bars.update(task, completed=done, total=total)
        speed = self.bars.tasks[task].speed
        self.bars.update(task, rate=f"{speed:.1f} stages/s" if speed else "")

    def choosing_kernels(self, device: str, batch: int) -> None:
        """Say that the kernels are being chosen."""
        self.console.print(f"{device} batch {batch}: timing the sequential schedule with fused and eager kernels")

    def checking(self, device: str, batch: int) -> None:
        """Say which schedules are being timed end to end."""
        self.console.print(f"{device} batch {batch}: timing the IOS and sequential schedules end to end")


class SilentProgress:
    """Reports nothing (``ios_ray.search(..., progress=False)``)."""

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
