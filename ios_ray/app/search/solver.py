"""The one solver: the latencies a store holds for a setting (device, batch) -> its :class:`~ios_ray.schedule.Schedule`.

The search job (its candidates, :mod:`~ios_ray.app.search.candidates`), the torch.compile backend's store lookup
(:mod:`~ios_ray.app.compile.graph_schedules`) and ``ios-ray evaluate``'s trade-off all solve a setting the same way: the DP
through the search space over the setting's measured stages, priced by its correction
(:meth:`~ios_ray.app.search.measuring.Measuring.dp`), kept within its memory budget, with its peak beside the sequential
schedule's (:meth:`~ios_ray.app.search.measuring.Measuring.solve`), each stage with its latency as measured. :class:`Solver`
turns that into a schedule, carrying what its file records (the DP's bounds, the measuring record, the kernels'
choice, the correction): the one place a solved :class:`Schedule` is built, beside its sequential twin.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence, cast

from ios_ray.app.search.budgets import Lookup, TradeOffRow, peak_bytes, trade_off
from ios_ray.app.search.measuring import NO_PRICE, Exhaustive, Measuring, Setting, StagePrice
from ios_ray.ir import Graph
from ios_ray.profiler import DeviceIdentity
from ios_ray.profiler.jobs import Source
from ios_ray.schedule import BlockSchedule, PeakMemory, Schedule
from ios_ray.scheduler import SearchParams, TableLatency, sequential
from ios_ray.scheduler.memory import GraphMemory
from ios_ray.stage import StageKeys


@dataclass(frozen=True)
class Solver:
    """Solves the settings of one graph over ``measuring``'s search space, for the model named ``model`` in files,
    in ``dtype``. ``mode`` is the measuring mode its files record (None: ``measuring``'s own; the backend's
    ``store``: it solves what the store holds, measuring nothing)."""

    measuring: Measuring
    model: str
    dtype: str
    mode: str | None = None

    @property
    def graph(self) -> Graph:
        """The graph solved."""
        return self.measuring.space.graph

    def solve(self, setting: Setting, price: StagePrice = NO_PRICE) -> Schedule:
        """The DP's schedule of ``setting`` over its measured stages (each stage costing ``price`` more), within its
        memory budget, with its peak; UserError where no schedule meets the budget."""
        blocks, record, memory = self.measuring.solve(setting, self.dtype, price)
        if self.mode is not None:
            record = {**record, "mode": self.mode}
        identity, graph = setting.identity, self.graph
        params = {**self.measuring.space.params.to_json(), "measure": record,
                  **({"kernels": setting.kernels.to_json()} if setting.kernels is not None else {}),
                  **({"correction": setting.correction.to_json()} if setting.correction.runs else {})}
        return Schedule(
            model=self.model, graph_fingerprint=graph.fingerprint, device=identity.label, batch=setting.batch,
            blocks=blocks, dtype=self.dtype, device_fingerprint=identity.fingerprint, device_info=dict(identity.info),
            params=params, source=identity.source, input_shape=graph.input_shape, memory_format=graph.memory_format,
            memory=memory, kernels=identity.kernels)

    def sequential(self, solved: Schedule, setting: Setting) -> Schedule:
        """The sequential twin of a schedule :meth:`solve` gave for ``setting``: one unit per stage, each with its
        latency as measured (inf where the store lacks it), at the sequential peak."""
        assert solved.memory is not None, "a solved schedule knows its peak"
        return self.alternative(solved, sequential_blocks(self.graph, self.measuring.stage_keys, setting.table),
                                solved.memory.sequential_peak_bytes)

    def alternative(self, solved: Schedule, blocks: Sequence[BlockSchedule], peak: int | None = None) -> Schedule:
        """A schedule :meth:`solve` gave, running other ``blocks`` for the same setting, of their peak (None:
        computed from the graph)."""
        assert solved.memory is not None, "a solved schedule knows its peak"
        if peak is None:
            peak = peak_bytes(GraphMemory(self.graph), blocks, solved.batch, solved.dtype)
        memory: PeakMemory = dataclasses.replace(solved.memory, peak_bytes=peak)
        return dataclasses.replace(solved, blocks=tuple(blocks), memory=memory)

    def trade_off(self, setting: Setting) -> list[TradeOffRow]:
        """The fastest schedule of ``setting`` at each budget of :data:`~ios_ray.app.search.budgets.TRADE_OFF` (in place
        of its own), from one unbudgeted DP."""
        found, latency = self.measuring.dp(setting)
        return trade_off(self.graph, found, latency, self.measuring.space.params, setting.batch, self.dtype)


def sequential_blocks(graph: Graph, keys: StageKeys, table: dict[str, float]) -> tuple[BlockSchedule, ...]:
    """The sequential schedule's blocks, each stage with its latency in ``table`` (inf where it lacks one)."""
    measured = TableLatency(keys, table, missing=math.inf)
    return tuple(sequential(graph, block, measured) for block in graph.blocks)


def stored_trade_off(schedule: Schedule, graph: Graph, keys: StageKeys, lookup: Lookup
                     ) -> tuple[list[TradeOffRow], float] | None:
    """The trade-off (:meth:`Solver.trade_off`) at ``schedule``'s setting over the stage latencies the store holds
    for it (a stage it lacks is not used: after a lazy search, the fastest among the stages measured), and the
    sequential schedule's ms; None where the store lacks a stage of the sequential schedule."""
    measuring = Exhaustive(keys, SearchParams.from_json(schedule.params))
    identity = DeviceIdentity(schedule.device, schedule.device_fingerprint, schedule.device_info, "",
                              cast(Source, schedule.source))  # a file's source: "measured" or "simulated"
    setting = Setting(identity, schedule.batch)
    setting.table = dict(lookup(measuring.keys, identity.fingerprint, schedule.batch, schedule.dtype))
    plain = sum(ms or 0.0 for block in sequential_blocks(graph, keys, setting.table) for ms in block.latencies)
    if math.isinf(plain):
        return None
    return Solver(measuring, schedule.model, schedule.dtype).trade_off(setting), plain
