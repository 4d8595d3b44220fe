"""Memory budgets as the user gives them, and the peak memory a search reports beside latency.

A budget is bytes (``2000000000``) or relative to the sequential schedule's peak (``1.1x``). A GPU with no budget
given (``sim:v100``, ``v100``, ``t4``, ``cuda:0``...) keeps within its memory (what its actor reports, else the
label's sheet, :data:`~ios_ray.gpu_sheets.MEMORY_GB`) less the model's weights and a margin of
:data:`~ios_ray.vocabulary.DEFAULT_MEMORY_MARGIN` of the device's memory (the CUDA context, cuDNN's workspaces and
the caching allocator's fragmentation live there too). A request's budget is parsed once, when it is checked
(:class:`BudgetRule`), into one :class:`DeviceBudget` per device, resolved once per device when its memory is known
(:meth:`DeviceBudget.resolve`). The budget is applied by :func:`~ios_ray.scheduler.budget.fit`: exact, and a budget
the DP's own schedule meets changes nothing.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ios_ray.devices import DeviceSpec, parse_device
from ios_ray.errors import UserError
from ios_ray.gpu_sheets import MEMORY_GB
from ios_ray.ir import Graph
from ios_ray.schedule import PeakMemory, Schedule, megabytes
from ios_ray.scheduler import GraphResult, LatencyModel, SearchParams, sequential_stages
from ios_ray.scheduler.budget import OverBudget, fit, smallest_peak
from ios_ray.scheduler.memory import GraphMemory, to_bytes
from ios_ray.stage import Stage
from ios_ray.vocabulary import DEFAULT_MEMORY_MARGIN, DTYPE_BYTES

if TYPE_CHECKING:
    from torch import nn

#: Looks up stage latencies: (stage keys, device fingerprint, batch, dtype) -> {key: ms}.
Lookup = Callable[[Sequence[str], str, int, str], Mapping[str, float]]
#: The budgets of the trade-off table: relative to the sequential schedule's peak, and none.
TRADE_OFF = ("1.0x", "1.1x", "1.25x", "1.5x", None)


@dataclass(frozen=True)
class MemoryBudget:
    """A budget as given: ``bytes``, or ``factor`` times the sequential schedule's peak."""

    bytes: int | None = None
    factor: float | None = None

    def resolve(self, sequential_peak: int) -> int:
        """The budget in bytes, for a sequential peak of ``sequential_peak`` bytes."""
        return self.bytes if self.bytes is not None else math.floor(self.factor * sequential_peak)  # type: ignore

    def __str__(self) -> str:
        return f"{self.factor:g}x" if self.factor is not None else megabytes(self.bytes or 0)


def parse_memory_budget(value: str | int | None) -> MemoryBudget | None:
    """A budget from ``--memory-budget`` or ``memory_budget=``: whole bytes, ``<factor>x``, or None / ``none``."""
    if value is None or says_no_budget(value):
        return None
    text = str(value).strip().lower()
    try:
        if text.endswith("x"):
            factor = float(text[:-1])
            if math.isfinite(factor) and factor > 0:
                return MemoryBudget(factor=factor)
        elif not isinstance(value, bool) and int(text) > 0:
            return MemoryBudget(bytes=int(text))
    except ValueError:
        pass
    raise UserError(f"memory budget must be a positive whole number of bytes or a factor of the sequential "
                    f"schedule's peak such as 1.1x, not {value!r}.")


def default_budget(device: str, weight_bytes: int, memory_bytes: int | None = None) -> int | None:
    """A GPU's default budget in bytes: its memory (``memory_bytes``, as the device reports it, else its label's
    sheet) less the weights and :data:`~ios_ray.vocabulary.DEFAULT_MEMORY_MARGIN` of it (None: no default: the CPU,
    and a ``cuda[:i]`` that did not report its memory)."""
    if parse_device(device).kind == "cpu":
        return None
    size = memory_bytes if memory_bytes is not None else device_memory(device, local=False)
    if size is None:
        return None
    return max(0, math.floor(size * (1 - DEFAULT_MEMORY_MARGIN)) - weight_bytes)


def says_no_budget(value: str | int | None) -> bool:
    """Whether a budget as given is ``none``: no budget, not even a GPU's default (None: the default)."""
    return isinstance(value, str) and value.strip().lower() == "none"


@dataclass(frozen=True)
class BudgetRule:
    """A memory budget as a request gives it, parsed once (:func:`parse_memory_budget`): ``given`` (bytes or a
    factor), none (``none`` given), or (``default``, where nothing was given) each GPU's default."""

    given: MemoryBudget | None = None
    default: bool = True

    @classmethod
    def parse(cls, value: str | int | None) -> BudgetRule:
        """The rule of ``--memory-budget`` or ``memory_budget=``; UserError where it is neither bytes, a factor nor
        ``none``."""
        given = parse_memory_budget(value)
        return cls(given, given is None and not says_no_budget(value))

    def on(self, device: DeviceSpec) -> DeviceBudget:
        """The rule on one device, as far as its label tells (a CPU has no default)."""
        return DeviceBudget(device.label, self.given, self.default and device.kind != "cpu")


@dataclass(frozen=True)
class DeviceBudget:
    """One device's memory budget as a checked request knows it: ``given`` (None: none), or, where ``default``, the
    GPU's memory less the model's weights and a margin, which :meth:`resolve` finds once the device has reported
    its memory."""

    device: str
    given: MemoryBudget | None = None
    default: bool = False

    def resolve(self, module: nn.Module, memory_bytes: int | None) -> MemoryBudget | None:
        """The budget the device keeps to, called once per device: the one given, else its default (weights from
        ``module``; the memory its actor reported, ``memory_bytes``, else its label's sheet), else none."""
        if not self.default:
            return self.given
        weights = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
        found = default_budget(self.device, weights, memory_bytes)
        return None if found is None else MemoryBudget(bytes=found)


def device_memory(device: str, local: bool) -> int | None:
    """The memory of the device behind a label, in bytes: a GPU model's from its sheet, the cpu's where it is this
    machine (``local``); None where the label does not say."""
    spec = parse_device(device)
    if spec.kind == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if local else None
        except (ValueError, OSError, AttributeError):
            return None
    size = MEMORY_GB.get(spec.gpu or "")
    return None if size is None else math.floor(size * 1e9)


def refuse_what_cannot_fit(graph: Graph, batches: Sequence[int], dtype: str, devices: Sequence[str], local: bool
                           ) -> None:
    """Fail in one sentence where, on one of ``devices``, even the unit that needs most cannot hold its inputs and
    output at once (a lower bound on every schedule's peak, :meth:`GraphMemory.least_peak`) within the device's
    memory (:func:`device_memory`); devices of unknown memory pass."""
    least = GraphMemory(graph).least_peak()
    for device in devices:
        capacity = device_memory(device, local)
        for batch in batches:
            needed = to_bytes(least, batch, dtype)
            if capacity is not None and needed > capacity:
                raise UserError(f"{graph.name} at batch {batch} needs at least {megabytes(needed)} of activations in "
                                f"{dtype}, more than the {megabytes(capacity)} of memory {device} has; search a "
                                f"smaller batch.")


def budgeted(graph: Graph, found: GraphResult, latency: LatencyModel, params: SearchParams, batch: int,
             dtype: str, given: MemoryBudget | None) -> tuple[GraphResult, PeakMemory]:
    """The DP's result kept within the budget ``given`` (None: none) and its peak beside the sequential
    schedule's; a budget no schedule meets is a :class:`UserError` naming the smallest peak any schedule reaches."""
    memory = GraphMemory(graph)
    plain = sequential_peak(graph, memory, batch, dtype)
    budget = None if given is None else given.resolve(plain)
    per_element = batch * DTYPE_BYTES[dtype]
    try:
        result = fit(graph, found, latency, None if budget is None else budget // per_element, params, memory)
    except OverBudget as error:
        raise UserError(over_budget(graph, memory, error.smallest, budget or 0, batch, dtype)) from None
    return result, PeakMemory(peak_bytes(memory, result.schedules, batch, dtype), plain, budget)


def refuse_unreachable_budgets(graph: Graph, params: SearchParams, dtype: str,
                               budgets: Sequence[tuple[int, MemoryBudget | None]]) -> None:
    """Fail in one sentence, before anything is measured, where a (batch, budget) is one no schedule meets: below the
    sequential schedule's peak and below the smallest peak any schedule reaches (the walk for that runs only where a
    budget is below the sequential peak, once)."""
    memory = GraphMemory(graph)
    smallest: int | None = None
    for batch, given in budgets:
        if given is None:
            continue
        plain = sequential_peak(graph, memory, batch, dtype)
        budget = given.resolve(plain)
        if budget >= plain:
            continue
        smallest = smallest_peak(graph, params, memory) if smallest is None else smallest
        if to_bytes(smallest, batch, dtype) > budget:
            raise UserError(over_budget(graph, memory, smallest, budget, batch, dtype))


def over_budget(graph: Graph, memory: GraphMemory, smallest: int, budget: int, batch: int, dtype: str) -> str:
    """The sentence for a budget no schedule meets: the smallest peak, and whether it is below sequential order's."""
    least = to_bytes(smallest, batch, dtype)
    plain = sequential_peak(graph, memory, batch, dtype)
    below = f", below the sequential order's {megabytes(plain)}" if least < plain else ""
    return (f"no schedule of {graph.name} at batch {batch} peaks within {megabytes(budget)}: the smallest peak any "
            f"schedule reaches is {megabytes(least)}{below}.")


def peak_bytes(memory: GraphMemory, blocks: Sequence[object], batch: int, dtype: str) -> int:
    """The peak in bytes of a schedule's blocks (each with ``stages``)."""
    stages: list[Stage] = [s for b in blocks for s in b.stages]  # type: ignore[attr-defined]
    return to_bytes(memory.schedule_peak(stages).elements, batch, dtype)


def sequential_peak(graph: Graph, memory: GraphMemory, batch: int, dtype: str) -> int:
    """The sequential schedule's peak in bytes."""
    stages = [s for block in graph.blocks for s in sequential_stages(graph, block)]
    return to_bytes(memory.schedule_peak(stages).elements, batch, dtype)


def schedule_memory(schedule: Schedule, graph: Graph) -> PeakMemory:
    """A schedule's peak beside the sequential one's, computed from the graph (for files written before peaks)."""
    memory = GraphMemory(graph)
    return PeakMemory(peak_bytes(memory, schedule.blocks, schedule.batch, schedule.dtype),
                      sequential_peak(graph, memory, schedule.batch, schedule.dtype))


def peaks_cell(memory: PeakMemory | None) -> str:
    """The search table's cell: the kept schedule's peak and the sequential one's, in MB."""
    return "-" if memory is None else f"{memory.peak_bytes / 1e6:,.1f} / {memory.sequential_peak_bytes / 1e6:,.1f}"


@dataclass(frozen=True)
class TradeOffRow:
    """The fastest schedule at one budget: its latency in ms and peak in bytes (None for both: none fits)."""

    budget: str
    latency_ms: float | None
    peak_bytes: int | None


def trade_off(graph: Graph, found: GraphResult, latency: LatencyModel, params: SearchParams, batch: int,
              dtype: str) -> list[TradeOffRow]:
    """The fastest schedule at each budget of :data:`TRADE_OFF`, from the unbudgeted DP's result ``found``."""
    rows = []
    for label in TRADE_OFF:
        try:
            result, peak = budgeted(graph, found, latency, params, batch, dtype, parse_memory_budget(label))
        except UserError:
            rows.append(TradeOffRow(label or "none", None, None))
            continue
        rows.append(TradeOffRow(label or "none", result.cost, peak.peak_bytes))
    return rows


def trade_off_text(rows: Sequence[TradeOffRow], sequential_ms: float, how: str) -> list[str]:
    """The trade-off table as text lines: per budget the latency (``how`` says where it comes from), the peak, and
    the share of the unbudgeted speedup over sequential kept."""
    best = rows[-1].latency_ms
    lines = [f"  {'budget':<8} {'latency ms (' + how + ')':>24} {'peak':>12} {'speedup kept':>13}"]
    for row in rows:
        if row.latency_ms is None or row.peak_bytes is None or best is None:
            lines.append(f"  {row.budget:<8} {'no schedule fits':>24}")
            continue
        gain = sequential_ms - best
        kept = f"{(sequential_ms - row.latency_ms) / gain:.0%}" if gain > 0 else "-"
        lines.append(f"  {row.budget:<8} {row.latency_ms:>24.3f} {megabytes(row.peak_bytes):>12} {kept:>13}")
    return lines
