"""The ``sim:<gpu>`` device model: an analytical stage latency from datasheet figures, for planning and tests.

The datasheet figures of each GPU are in :mod:`ios_ray.gpu_sheets`.

The model, per stage, deterministic and a pure function of (graph units, stage, batch, gpu):

* Each unit is one kernel (a separable conv two launches; a flatten or a channel slice none, being views), plus
  one kernel to materialise an input that is a concat or sum of several outputs (a concat or add unit does that
  itself); a unit's epilogue of elementwise steps runs fused into its kernel. A kernel has FLOPs
  (``Unit.flops`` x batch; a multiply-add counts 2), memory traffic (``Unit.bytes``, the activations read and
  written, x batch, plus ``Unit.weight_bytes`` once; where an importer left ``bytes`` at 0 the shapes give the
  activations, float32) and parallel work: its output elements x batch.
* Under-utilisation: a kernel fills the fraction ``min(1, outputs / (SMs * cores/SM * OUTPUTS_PER_CORE))`` of
  the device's compute (memory saturates with ``MEMORY_PARALLELISM`` times less parallel work), so alone it
  runs in ``max(flops / (peak * u_c), bytes / (bandwidth * u_m))`` after a fixed ``min kernel`` latency.
* Contention: groups of a concurrent stage share the device as a fluid: running kernels progress at their own
  rate while the rates sum to at most the whole device, else proportionally slower and, for the
  oversubscription, ``CONTENTION`` less efficient (cache and bandwidth conflicts). So a stage is never faster
  than its total work at full-device throughput, nor than its slowest group alone.
* Launches: the host issues the stage's kernels one after another, group by group with the longest group first (by
  its kernels' own time alone), each costing ``launch``; a kernel starts when issued and when its group's previous
  kernel is done. The order is a function of the groups' kernels, not of how a stage lists its groups, so every
  stage with one stage key has one price (the store keeps one latency per key); and dropping a group has made no
  candidate stage of Inception V3, NASNet-A or RandWire slower, on either sim GPU at batch 1 or 32 (the lazy
  search's bounds rely on it; ``tests/test_profiler_sim.py`` checks Inception V3's).
* Synchronisation: each stage pays ``STAGE_SYNC_LAUNCHES`` launches for its barrier and ``STREAM_JOIN_LAUNCHES``
  per extra group (stream fork and join events).
* Merge: one conv with the largest kernel over the summed output channels: padded-kernel FLOPs and weights
  (each conv's scaled by largest kernel area / its kernel area), but the input read once, one launch, and more
  parallel work.
"""

from __future__ import annotations

import math
from dataclasses import asdict, astuple, dataclass
from typing import Any, Sequence

from ios_ray.errors import UserError
from ios_ray.gpu_sheets import SHEETS, GpuSheet
from ios_ray.ir import Graph, Shape, Unit, Value
from ios_ray.stage import Stage, can_merge
from ios_ray.vocabulary import DEFAULT_DTYPE

SIM_MODEL = "ios-ray-sim"
SIM_VERSION = 2

#: Output elements per FP32 core a kernel needs in flight to keep the whole device busy.
OUTPUTS_PER_CORE = 48
#: Memory bandwidth saturates with this many times less parallel work than compute.
MEMORY_PARALLELISM = 4
#: Throughput lost per unit of oversubscription when concurrent kernels want more than the whole device.
CONTENTION = 0.05
#: Barrier cost of a stage, in launches.
STAGE_SYNC_LAUNCHES = 1.0
#: Stream fork/join cost per group beyond the first, in launches.
STREAM_JOIN_LAUNCHES = 0.5
#: Bytes per element of float32, the one dtype the model covers.
BYTES_PER_ELEMENT = 4


@dataclass(frozen=True)
class Kernel:
    """One device kernel: FLOPs, bytes moved, parallel work (output elements) and host launches."""

    flops: float
    bytes: float
    outputs: float
    launches: int = 1


@dataclass(frozen=True)
class KernelCost:
    """A kernel on one GPU: fixed latency and full-device work (s), the device fraction it fills, launch time (s)."""

    latency: float
    work: float
    rate: float
    launch: float


def sim_parameters(gpu: str) -> dict[str, Any]:
    """Everything the model's predictions depend on for one GPU (it enters the device fingerprint)."""
    return {
        "model": SIM_MODEL,
        "version": SIM_VERSION,
        "sheet": asdict(_sheet(gpu)),
        "constants": {
            "outputs_per_core": OUTPUTS_PER_CORE,
            "memory_parallelism": MEMORY_PARALLELISM,
            "contention": CONTENTION,
            "stage_sync_launches": STAGE_SYNC_LAUNCHES,
            "stream_join_launches": STREAM_JOIN_LAUNCHES,
        },
    }


def stage_latency_ms(graph: Graph, stage: Stage, batch: int, gpu: str, dtype: str = DEFAULT_DTYPE) -> float:
    """The predicted latency (ms) of one stage at a batch size on a simulated GPU."""
    sheet = _sheet(gpu)
    if dtype != DEFAULT_DTYPE:
        raise UserError(f"the sim model covers float32 only, not {dtype!r}; sim devices take float32.")
    groups = _longest_first([[_cost(k, sheet) for k in group] for group in stage_kernels(graph, stage, batch)])
    sync = sheet.launch_us * 1e-6 * (STAGE_SYNC_LAUNCHES + STREAM_JOIN_LAUNCHES * (len(groups) - 1))
    return (_run_concurrently(groups) + sync) * 1e3


def stage_kernels(graph: Graph, stage: Stage, batch: int) -> list[list[Kernel]]:
    """The kernels each group of a stage launches, in order (a merge stage is one group of one wide conv)."""
    if stage.strategy == "merge":
        if any(len(g) != 1 for g in stage.groups) or not can_merge(graph, stage.units):
            raise ValueError(f"stage {stage.groups} cannot run as a merged conv")
        units = [graph.unit(u) for u in stage.units]
        return [[*_materialise(graph, units[0].inputs[0], batch), _merged_conv(graph, units, batch)]]
    return [[k for u in group for k in unit_kernels(graph, graph.unit(u), batch)] for group in stage.groups]


def unit_kernels(graph: Graph, unit: Unit, batch: int) -> list[Kernel]:
    """The kernels of one unit: materialising concat/sum inputs it reads (not itself a concat/add), then its own."""
    if unit.kind in ("flatten", "slice") and "epilogue" not in unit.attrs:
        return []  # views
    prep = [] if unit.kind in ("concat", "add") else [k for v in unit.inputs for k in _materialise(graph, v, batch)]
    elements = sum(_read_elements(graph, v) for v in unit.inputs) + _numel(unit.shape)
    activations = unit.bytes or BYTES_PER_ELEMENT * elements
    launches = 2 if unit.kind == "sepconv" else 1
    kernel = Kernel(unit.flops * batch, activations * batch + unit.weight_bytes, _numel(unit.shape) * batch, launches)
    return [*prep, kernel]


def _saturating_outputs(sheet: GpuSheet) -> float:
    """Parallel work (output elements) that fills every SM of a GPU."""
    return sheet.sms * sheet.cores_per_sm * OUTPUTS_PER_CORE


def _sheet(gpu: str) -> GpuSheet:
    """The datasheet of a sim GPU; an unknown one is a user error."""
    if gpu not in SHEETS:
        raise UserError(f"the sim model knows {', '.join(SHEETS)}, not {gpu!r}; use one of sim:{'/'.join(SHEETS)}.")
    return SHEETS[gpu]


def _materialise(graph: Graph, value: Value, batch: int) -> list[Kernel]:
    """The kernel that builds a concat/sum input, or nothing for a plain unit output."""
    if value.is_plain:
        return []
    adds = sum((len(part) - 1) * _numel(graph.shape_of(part[0])) for part in value.parts)
    elements = _numel(graph.value_shape(value))
    moved = BYTES_PER_ELEMENT * (_read_elements(graph, value) + elements)
    return [Kernel(adds * batch, moved * batch, elements * batch)]


def _merged_conv(graph: Graph, units: Sequence[Unit], batch: int) -> Kernel:
    """The one wide conv of a merge stage: padded-kernel FLOPs and weights, input read once, one launch."""
    kernel = (max(u.attrs["kernel"][0] for u in units), max(u.attrs["kernel"][1] for u in units))
    padding = [math.prod(kernel) / math.prod(u.attrs["kernel"]) for u in units]
    flops = sum(u.flops * pad for u, pad in zip(units, padding))
    weights = sum(u.weight_bytes * pad for u, pad in zip(units, padding))
    outputs = sum(_numel(u.shape) for u in units)
    moved = BYTES_PER_ELEMENT * (_numel(graph.value_shape(units[0].inputs[0])) + outputs)
    return Kernel(flops * batch, moved * batch + weights, outputs * batch)


def _read_elements(graph: Graph, value: Value) -> int:
    """Elements read to build a value: every source of every part."""
    return sum(_numel(graph.shape_of(s)) for part in value.parts for s in part)


def _numel(shape: Shape) -> int:
    """Number of elements of a per-sample shape."""
    return math.prod(shape)


def _cost(kernel: Kernel, sheet: GpuSheet) -> KernelCost:
    """A kernel's latency, full-device work, device fraction and launch time on one GPU."""
    peak = sheet.peak_tflops * 1e12
    bandwidth = sheet.bandwidth_gbs * 1e9
    floor = 1 / sheet.sms
    u_compute = min(1.0, max(floor, kernel.outputs / _saturating_outputs(sheet)))
    u_memory = min(1.0, max(floor, kernel.outputs * MEMORY_PARALLELISM / _saturating_outputs(sheet)))
    work = max(kernel.flops / peak, kernel.bytes / bandwidth)
    alone = max(kernel.flops / (peak * u_compute), kernel.bytes / (bandwidth * u_memory))
    rate = work / alone if alone > 0 else 1.0
    latency = kernel.launches * sheet.min_kernel_us * 1e-6
    return KernelCost(latency, work, rate, kernel.launches * sheet.launch_us * 1e-6)


def _longest_first(groups: list[list[KernelCost]]) -> list[list[KernelCost]]:
    """Groups in launch order: longest first by their kernels' fixed latency plus work at their own rate (launches
    aside), ties broken by the kernels themselves, so the order is canonical."""
    def alone(group: list[KernelCost]) -> float:
        return sum(k.latency + (k.work / k.rate if k.rate > 0 else 0.0) for k in group)

    return sorted(groups, key=lambda group: (-alone(group), [astuple(k) for k in group]))


def _run_concurrently(groups: list[list[KernelCost]]) -> float:
    """Seconds until every group's kernels are done, sharing the device as a fluid (see module docstring)."""
    issued, host = _issue_times(groups)
    position = [0] * len(groups)
    ready = [issued[g][0] + groups[g][0].latency if groups[g] else math.inf for g in range(len(groups))]
    left = [groups[g][0].work if groups[g] else 0.0 for g in range(len(groups))]
    now = 0.0
    while any(r < math.inf for r in ready):
        running = [g for g in range(len(groups)) if ready[g] <= now]
        speeds = _speeds([groups[g][position[g]].rate for g in running])
        finish = [now + left[g] / s for g, s in zip(running, speeds)]
        step_to = min(finish + [ready[g] for g in range(len(groups)) if now < ready[g] < math.inf])
        step, now = step_to - now, step_to
        for g, speed, done_at in zip(running, speeds, finish):
            left[g] -= speed * step
            if done_at <= now:
                position[g] += 1
                ready[g], left[g] = _next_kernel(groups[g], position[g], issued[g], now)
    return max(now, host)


def _next_kernel(group: list[KernelCost], position: int, issued: list[float], now: float) -> tuple[float, float]:
    """(ready time, work) of a group's kernel at ``position`` once the previous one ends at ``now``."""
    if position >= len(group):
        return math.inf, 0.0
    kernel = group[position]
    return max(issued[position], now) + kernel.latency, kernel.work


def _issue_times(groups: list[list[KernelCost]]) -> tuple[list[list[float]], float]:
    """When the host has issued each kernel (group by group, one launch after another), and when it is done."""
    clock = 0.0
    issued = []
    for group in groups:
        times = []
        for kernel in group:
            clock += kernel.launch
            times.append(clock)
        issued.append(times)
    return issued, clock


def _speeds(rates: list[float]) -> list[float]:
    """Progress rates (full-device seconds per second) of concurrently running kernels."""
    total = sum(rates)
    if total <= 1.0:
        return rates
    share = 1.0 / (total * (1.0 + CONTENTION * (total - 1.0)))
    return [r * share for r in rates]
