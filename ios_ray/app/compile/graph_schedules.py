"""Where the torch.compile backend finds the schedule of a graph for one setting: :class:`GraphSchedules`.

A setting is a device, a batch size and a dtype (the memory format is the graph's own: it is part of its
fingerprint). The schedule is, in this order:

1. for a graph whose every block is one unit, its only schedule (one stage per unit, in order);
2. one of the given schedules (a list, or the files of a folder such as ``ios-ray search --out``, read once) made
   for the graph's fingerprint, the batch size and the dtype, on a label that fits the device (the rules of
   :func:`~ios_ray.runtime.device_rank`: ``cpu`` on a CPU; a GPU label or ``cuda`` on a GPU);
3. else the DP's schedule over the latencies the store holds for the graph's stages on this machine's device (its
   fingerprint, :func:`~ios_ray.profiler.fingerprint.device_fingerprint`, running each kernels), kept within the
   memory budget a search would keep to there, where the store holds every stage the lazy search would ask for: the
   search's own lazy measuring (:class:`~ios_ray.app.search.measuring.Lazy`) asks for nothing more, and the search's own
   solver (:class:`~ios_ray.app.search.solver.Solver`) solves it, budget and peak included. Stage keys are name-free, so a search of the whole model, or of another model with the same
   stages, serves a graph of it; where the store serves both kernels, the one whose schedule it predicts faster;
4. else none (a miss, which the backend handles as ``on_miss`` says).

Looking up measures nothing, starts no Ray and creates no store.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

from ios_ray.app.search.budgets import BudgetRule
from ios_ray.app.search.measuring import Lazy, Setting
from ios_ray.app.search.solver import Solver
from ios_ray.devices import parse_device
from ios_ray.dtypes import dtype_name
from ios_ray.ir import Graph
from ios_ray.profiler.jobs import DeviceIdentity, local_identity
from ios_ray.runtime import device_rank, read_schedules
from ios_ray.schedule import Schedule
from ios_ray.scheduler import SearchParams, baseline_schedule
from ios_ray.stage import StageKeys
from ios_ray.vocabulary import KERNEL_NAMES

if TYPE_CHECKING:
    from ios_ray.store import LatencyStore


@dataclass(frozen=True)
class Found:
    """A schedule for one setting of a graph, and where it came from (a file, ``given``, or ``store``)."""

    schedule: Schedule
    origin: str


class GraphSchedules:
    """The schedules the backend can run: given ones (a folder or a list) and what the store's latencies give,
    within ``memory_budget`` (as ``ios_ray.search`` takes it, parsed here once; None: a GPU's default, as a
    search's). UserError on a budget that is none of those."""

    def __init__(self, schedules: str | Path | Sequence[Schedule] | None, store: str | Path | None,
                 params: SearchParams, memory_budget: str | int | None = None) -> None:
        self.folder = Path(schedules) if isinstance(schedules, (str, Path)) else None
        self.store = Path(store) if store is not None else None
        self.params = params
        self.memory_budget = BudgetRule.parse(memory_budget)
        self._given: dict[str, Schedule] | None = None if isinstance(schedules, (str, Path)) else {
            f"given schedule {i}": s for i, s in enumerate(schedules or ())}
        self._measuring: dict[tuple[str, str], Lazy] = {}

    def find(self, graph: Graph, name: str, device: torch.device, batch: int, dtype: torch.dtype, module: nn.Module
             ) -> Found | None:
        """The schedule of ``graph`` (imported from ``module``) for a batch of ``dtype`` on ``device`` (a given one
        first, else the store's DP), or None."""
        wanted = dtype_name(dtype)
        if all(len(block.units) == 1 for block in graph.blocks):
            return Found(baseline_schedule(graph, model=name, device=device_label(device), batch=batch, dtype=wanted),
                         "its one schedule")
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        fitting = [(rank, where, s) for where, s in self.given().items()
                   if s.graph_fingerprint == graph.fingerprint and s.batch == batch and s.dtype == wanted
                   and (rank := device_rank(s.device, device.type, gpu)) is not None]
        if fitting:
            _, where, schedule = min(fitting, key=lambda found: found[0])
            return Found(schedule, where)
        stored = self._from_store(graph, name, device_label(device), batch, wanted, module)
        return Found(stored, f"the DP over {self.store}") if stored is not None else None

    def describe(self) -> str:
        """Where schedules are looked for, in words."""
        given = f"{self.folder}/" if self.folder is not None else "the schedules given"
        return given if self.store is None else f"{given} nor the store {self.store}"

    def add(self, schedule: Schedule, where: str) -> None:
        """Take a schedule made since (by a search) as one of the given ones."""
        self.given()[where] = schedule

    def given(self) -> dict[str, Schedule]:
        """The given schedules by where they are (a folder is read on first use; a missing one holds none)."""
        if self._given is None:
            folder = self.folder
            self._given = read_schedules(folder) if folder is not None and folder.exists() else {}
        return self._given

    def _from_store(self, graph: Graph, name: str, label: str, batch: int, dtype: str, module: nn.Module
                    ) -> Schedule | None:
        """The DP's schedule over the store's latencies for this machine's device, within the memory budget a search
        of ``module`` would keep to there, where the store holds every stage the lazy search would ask for; else
        None."""
        if self.store is None or not self.store.is_file():
            return None
        from ios_ray.store import LatencyStore

        measuring = self._measuring.get((graph.fingerprint, dtype))
        if measuring is None:
            measuring = self._measuring[graph.fingerprint, dtype] = Lazy(StageKeys(graph), self.params, None, dtype)
        solver = Solver(measuring, name, dtype, mode="store")
        device = local_device(label)
        budget = self.memory_budget.on(parse_device(label)).resolve(module, device.info.get("memory_bytes"))
        store = LatencyStore(self.store, create=False)
        found = [schedule for kernels in KERNEL_NAMES
                 if (schedule := _stored(store, solver, Setting(device.running(kernels), batch, budget))) is not None]
        return min(found, key=lambda schedule: schedule.predicted_latency or math.inf, default=None)


def _stored(store: LatencyStore, solver: Solver, setting: Setting) -> Schedule | None:
    """The schedule the search's lazy measuring and solver give ``setting`` over the store's latencies, where it
    would ask for no more stages; else None."""
    measuring = solver.measuring
    setting.table = store.lookup(measuring.keys, setting.identity.fingerprint, setting.batch, solver.dtype)
    if not setting.table or measuring.wanted(setting, round_size=1):  # how many it asks for: any is a miss
        return None
    if setting.round is None or not math.isfinite(setting.round.upper):
        return None
    return solver.solve(setting)


def device_label(device: torch.device) -> str:
    """The label of a torch device of this machine: ``cpu`` or ``cuda:<i>``."""
    if device.type == "cpu":
        return "cpu"
    return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"


@functools.lru_cache(maxsize=None)
def local_device(label: str) -> DeviceIdentity:
    """A device of this machine, as its profiler actor would report it."""
    from ios_ray.profiler.fingerprint import device_fingerprint

    return local_identity(label, *device_fingerprint(label), "measured")
