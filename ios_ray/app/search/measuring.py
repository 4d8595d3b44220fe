"""How a search chooses what to measure, behind one interface: per setting (device, batch) it is asked what to
measure next (:meth:`Measuring.ask`), told what was sent (:meth:`Measuring.record`), and asked for the schedule
(:meth:`Measuring.solve`).

:class:`Exhaustive` (``measure="all"``) measures every planned stage the store lacks. :class:`Lazy` (the default)
measures in rounds: the scheduler's pure :func:`~ios_ray.scheduler.next_round` reads a setting's stored latencies
and names the stages that can still change its schedule, until none can (each schedule is then the exhaustive DP's,
as far as the lower bounds hold, within the setting's memory budget too) or the budget of stages is spent. Both
solve the DP over measured stages the same way (:meth:`~ios_ray.scheduler.SearchSpace.optimize`), kept within the
setting's memory budget (:func:`~ios_ray.app.search.budgets.budgeted`: the budgeted DP runs only where that schedule peaks
over it). On a measured device both also measure again a stored unit alone whose latency is an outlier
(:mod:`~ios_ray.scheduler.outliers`), once per search.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from ios_ray.app.search.budgets import MemoryBudget, budgeted
from ios_ray.app.search.kernel_choice import KernelChoice
from ios_ray.errors import UserError
from ios_ray.profiler import DeviceIdentity
from ios_ray.schedule import BlockSchedule, PeakMemory
from ios_ray.scheduler import (GraphResult, LazyParams, LazyRound, LazySpace, PlannedStage, SearchParams,
                               SearchSpace, TableLatency, greedy_stages, inflated, lower_bounds, next_round,
                               unit_parts)
from ios_ray.scheduler.correction import IDENTITY, Correction, corrected_table
from ios_ray.scheduler.lazy import TOLERANCE
from ios_ray.stage import StageKeys

#: On a measured device, lower bounds sit this fraction below what they come from (timing noise); 0 on ``sim:``.
#: Fixed, not derived from the rows' spread, because a bound compares medians measured seconds to minutes apart:
#: what it must absorb is the machine's drift between two measurements (5-25% here) and a device's real departures
#: from the structural bounds (a stage a little faster than its largest sub-stage alone), and neither shows in a
#: row's p10-p90, which spans 10 calls in a few milliseconds. Its effect is measured, not assumed:
#: ``bench/lazy_search.py`` counts the measured stages that fell below the bound the other rows give them, with the
#: margin and without (bench/RESULTS.md, lazy_search), and checks the lazy schedule end to end against exhaustive
#: searches; the search's end-to-end check guards whatever slips through.
LAZY_MARGIN = 0.1

#: A price added to every stage and to every group beside a stage's first, in ms (the DP's alternatives).
StagePrice = tuple[float, float]
NO_PRICE: StagePrice = (0.0, 0.0)


@dataclass
class Setting:
    """One (device, batch) of a search and what the search knows of it: its memory budget (None: none), the kernels
    its stages run with (:meth:`run_with`; until then eager), the correction of stage costs fitted from schedules
    run whole there before (:mod:`~ios_ray.scheduler.correction`; the identity where none ran), the latencies the
    store held when last read, how many stages the search sent to measure, the units alone it measured again as
    outliers, and the lazy search's last round. ``identity`` is the device's, running the setting's kernels."""

    identity: DeviceIdentity
    batch: int
    memory_budget: MemoryBudget | None = None
    kernels: KernelChoice | None = None
    correction: Correction = IDENTITY
    table: dict[str, float] = dataclasses.field(default_factory=dict)
    measured: int = 0
    remeasured: set[str] = dataclasses.field(default_factory=set)
    round: LazyRound | None = None

    def run_with(self, choice: KernelChoice) -> None:
        """Run the setting's stages with the chosen kernels (before anything is looked up or measured)."""
        self.kernels = choice
        self.identity = self.identity.running(choice.kernels)

    @property
    def device(self) -> str:
        """The device label."""
        return self.identity.label

    @property
    def simulated(self) -> bool:
        """Whether the setting's latencies come from the sim model, not a device."""
        return self.identity.source == "simulated"


class Measuring:
    """What the two ways of measuring share: the search space, the stage keys, and the outliers."""

    mode = ""

    def __init__(self, space: SearchSpace, keys: StageKeys) -> None:
        self.space = space
        self.stage_keys = keys

    @property
    def keys(self) -> list[str]:
        """Every stage key this search may look up or measure."""
        return self.space.keys

    @functools.cached_property
    def measurable(self) -> Mapping[str, PlannedStage]:
        """Every stage the search may measure, by key (the planned ones and those the lazy estimates relate)."""
        return {**{p.key: p for p in self.space.planned}, **self.space.plan.stages}

    @functools.cached_property
    def unit_parts(self) -> Mapping[str, tuple[str, ...]]:
        """For every stage of several units the search may measure, the keys of its units alone."""
        return unit_parts(self.measurable, self.stage_keys)

    @functools.cached_property
    def greedy_keys(self) -> tuple[str, ...]:
        """The keys of the greedy schedule's stages, which the end-to-end check runs beside the DP's."""
        graph = self.space.graph
        return tuple(dict.fromkeys(self.stage_keys.key(stage) for block in graph.blocks
                                   for stage in greedy_stages(graph, block)))

    def ask(self, setting: Setting, round_size: int) -> list[str]:
        """The stage keys to measure next for a setting (from its ``table``), outliers measured again included; on a
        measured device also the greedy schedule's stages, which its end-to-end check runs."""
        asked = self.wanted(setting, round_size)
        if not setting.simulated:
            asked += self._outliers(setting)
            asked += [key for key in self.greedy_keys if key not in setting.table and key not in asked]
        return asked

    def record(self, setting: Setting, keys: Sequence[str]) -> None:
        """Count the stages sent to measure for a setting (outliers measured again count apart)."""
        setting.measured += sum(key not in setting.remeasured for key in keys)

    @functools.cached_property
    def groups(self) -> Mapping[str, int]:
        """Every stage's groups that run at once, by key: a concurrent stage's groups, 1 for a merged conv."""
        return {key: len(p.stage.groups) if p.stage.strategy == "concurrent" else 1
                for key, p in self.measurable.items()}

    def costs(self, setting: Setting, price: StagePrice = NO_PRICE) -> dict[str, float]:
        """The setting's measured stages priced as its correction prices them, plus ``price``: what its DP runs on."""
        return corrected_table(setting.table, self.groups, setting.correction, *price)

    def dp(self, setting: Setting, price: StagePrice = NO_PRICE) -> tuple[GraphResult, TableLatency]:
        """The DP's schedule through the search space over the setting's measured stages, priced by its correction
        (and ``price``), with no memory budget; and those prices as a latency model (a stage not measured: inf)."""
        return self.over(self.costs(setting, price))

    def over(self, table: Mapping[str, float]) -> tuple[GraphResult, TableLatency]:
        """The DP's schedule through the search space over the stages ``table`` prices (by key), with no memory
        budget; and those prices as a latency model (a stage not in ``table``: inf)."""
        return self.space.optimize(table), TableLatency(self.stage_keys, table, missing=math.inf)

    def solve(self, setting: Setting, dtype: str, price: StagePrice = NO_PRICE
              ) -> tuple[tuple[BlockSchedule, ...], dict[str, object], PeakMemory]:
        """The DP's schedule (:meth:`dp`) kept within the setting's memory budget, each stage with its latency as
        measured; what its file records of the measuring; and its peak beside the sequential schedule's (in
        ``dtype``). UserError where no schedule meets the budget."""
        record = {"mode": self.mode, "stages": len(setting.table), "planned": len(self.space.plan.stages),
                  **self._record(setting), "remeasured": len(setting.remeasured)}
        found, latency = self.dp(setting, price)
        result, memory = budgeted(self.space.graph, found, latency, self.space.params, setting.batch, dtype,
                                  setting.memory_budget)
        measured = TableLatency(self.stage_keys, setting.table)
        blocks = tuple(dataclasses.replace(block, latencies=tuple(map(measured.latency, block.stages)))
                       for block in result.schedules)
        return blocks, record, memory

    def _outliers(self, setting: Setting) -> list[str]:
        """Units alone whose stored latency is an outlier and that this search has not measured again yet; they
        are marked as measured again."""
        again = [key for key in inflated(setting.table, self.unit_parts) if key not in setting.remeasured]
        setting.remeasured.update(again)
        return again

    def wanted(self, setting: Setting, round_size: int) -> list[str]:
        """The stage keys that can still change the setting's schedule within its memory budget, about
        ``round_size`` of them (none: its ``table`` settles the schedule, which :meth:`solve` then finds)."""
        raise NotImplementedError

    def _record(self, setting: Setting) -> dict[str, object]:
        raise NotImplementedError


class Exhaustive(Measuring):
    """Measure every planned stage the store lacks, all at once."""

    mode = "all"

    def __init__(self, keys: StageKeys, params: SearchParams) -> None:
        super().__init__(SearchSpace.build(keys.graph, params, keys), keys)

    @property
    def keys(self) -> list[str]:
        """The planned stages' keys."""
        return list(self.space.plan.stages)

    def wanted(self, setting: Setting, round_size: int) -> list[str]:
        """Every planned stage the setting's ``table`` lacks."""
        return [key for key in self.keys if key not in setting.table]

    def _record(self, setting: Setting) -> dict[str, object]:
        missing = len(self.keys) - len(setting.table)
        if missing:
            raise UserError(f"the store lacks {missing} stage latencies for {setting.device} at batch "
                            f"{setting.batch}; rerun the search to measure them.")
        return {}


class Lazy(Measuring):
    """Measure in rounds only the stages that can still change a setting's schedule, up to ``budget`` per setting.

    Under a memory budget the rounds go on once the unbudgeted schedule is certified: the budgeted DP
    (:func:`~ios_ray.app.search.budgets.budgeted`) runs on the lower bounds, and the unmeasured stages of its schedule are
    measured, until the budgeted DP over measured stages costs no more than it: every other schedule within the
    budget is bounded below by that cost, so the schedule of measured stages is the fastest within the budget as far
    as the bounds hold, which :meth:`solve` finds. Where the unbudgeted schedule fits, this adds nothing (not even the
    stages of another schedule of the same cost on the bounds)."""

    mode = "lazy"
    space: LazySpace

    def __init__(self, keys: StageKeys, params: SearchParams, budget: int | None, dtype: str) -> None:
        super().__init__(LazySpace.build(keys.graph, params, keys), keys)
        self.budget = budget
        self.dtype = dtype

    def wanted(self, setting: Setting, round_size: int) -> list[str]:
        """The next round's stages (:func:`~ios_ray.scheduler.next_round`), then those of the budgeted DP's
        schedule under the lower bounds; the round is kept as the setting's ``round``."""
        margin = 0.0 if setting.simulated else LAZY_MARGIN
        costs = self.costs(setting)
        found = next_round(self.space, costs, LazyParams(margin, round_size, self.budget))
        if found.certified and setting.memory_budget is not None:
            found = self._within_budget(setting, found, margin, costs)
        setting.round = found
        return list(found.measure)

    def _within_budget(self, setting: Setting, certified: LazyRound, margin: float, costs: dict[str, float]
                       ) -> LazyRound:
        """The certified round, or one asking for the unmeasured stages of the budgeted DP's schedule under the
        lower bounds; none once the budgeted DP over measured stages (priced by ``costs``) costs no more than that
        one (within :data:`~ios_ray.scheduler.lazy.TOLERANCE`: no schedule within the budget can be cheaper, as far
        as the bounds hold; so where the unbudgeted schedule fits, at once), or the budget of stages is spent."""
        if self.budget is not None and len(setting.table) >= self.budget:
            return certified
        bounds = lower_bounds(self.space, costs, margin)
        result = self._budgeted(setting, bounds)
        keys = [self.stage_keys.key(stage) for block in result.schedules for stage in block.stages]
        missing = tuple(dict.fromkeys(key for key in keys if key not in setting.table))
        if not missing or result.cost >= self._measured_within(setting, costs) * (1 - TOLERANCE):
            return certified
        return dataclasses.replace(certified, measure=missing, bounds=tuple(bounds[key] for key in missing),
                                   certified=False)

    def _measured_within(self, setting: Setting, costs: dict[str, float]) -> float:
        """The cost of the fastest schedule of measured stages (priced by ``costs``) within the setting's memory
        budget (inf: none)."""
        try:
            return self._budgeted(setting, costs).cost
        except UserError:  # no schedule of measured stages keeps within the budget yet
            return math.inf

    def _budgeted(self, setting: Setting, table: Mapping[str, float]) -> GraphResult:
        """The DP's schedule over the stages ``table`` prices, kept within the setting's memory budget (UserError
        where no schedule of them is)."""
        return budgeted(self.space.graph, *self.over(table), self.space.params, setting.batch, self.dtype,
                        setting.memory_budget)[0]

    def _record(self, setting: Setting) -> dict[str, object]:
        found = setting.round
        assert found is not None, "a lazy setting is solved after it was asked"
        if not math.isfinite(found.upper):
            raise UserError(f"a budget of {self.budget} stages ends before {setting.device} at batch "
                            f"{setting.batch} has a schedule of measured stages (every unit alone and every one- and "
                            "two-group stage come first); raise the budget.")
        return {"certified": found.certified, "lower_ms": found.lower, "upper_ms": found.upper,
                "calibration": found.calibration, "audited": found.audited,
                "audit_population": found.audit_population, "margin": 0.0 if setting.simulated else LAZY_MARGIN}
