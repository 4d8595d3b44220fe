"""Peak memory: the computed peak against the measured one on the CPU, and the latency-memory trade-off on sim GPUs.

(a) CPU, computed against measured. Inception V3, NASNet-A, RandWire and SqueezeNet at batches 1 and 32, the
sequential schedule and the DP's (the DP under the synthetic cost, which needs no measurement: what is compared
is memory, not speed). Each runs through :class:`~ios_ray.runtime.ScheduleRunner` on the CPU. Measured: a counting
CPU allocator (:mod:`bench.allocator_counter`) wraps torch's own, so it sees every CPU tensor of every thread (the
PyTorch profiler's memory events see only the thread that started it); after one warm-up pass it records a pass:
the peak of activations only (the pass's output included; what a top-level ATen op allocates and frees itself,
such as oneDNN's reorders, is scratch and left out). Computed: :meth:`GraphMemory.schedule_peak` in bytes, less the
input batch (held before the pass).

The groups of a concurrent stage run at once on worker threads, so a pass's peak depends on how they interleave,
and the computed peak is the worst interleaving's: every group at its highest point at the same moment (the bound
a budget needs). The bench measures that worst case part by part (``worst case``: each group of a concurrent stage
run alone, its rise above what was live when it started measured, the rises summed on what was live at the stage's
start; every other stage as deployed) and one pass as deployed (``one pass``, concurrent groups on their threads),
with the peak with scratch beside. Target: computed within 5% of the worst case in every case, and no pass as
deployed above the computed peak.

(b) Sim GPUs, latency against memory. Inception V3, NASNet-A and RandWire on ``sim:v100`` at batches 32 and 128,
priced in this process by the sim model (simulated latencies, no store): the fastest schedule at budgets of 1.0x,
1.1x, 1.25x and 1.5x the sequential schedule's peak, and none; its latency, peak, and the share of the
unbudgeted speedup over sequential that it keeps. Then per model the smallest peak any schedule reaches
(:func:`~ios_ray.scheduler.budget.smallest_peak`) against the sequential order's, in elements per sample.

Run: python bench/memory.py [--only cpu|sim] [--models ...]   (exit code 1 when a target is missed)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import allocator_counter  # noqa: E402
from bench.synthetic import SyntheticCost  # noqa: E402
from ios_ray.app.search.budgets import TRADE_OFF, budgeted, parse_memory_budget, sequential_peak  # noqa: E402
from ios_ray.frontend import import_model  # noqa: E402
from ios_ray.ir import GRAPH_INPUT, Graph  # noqa: E402
from ios_ray.lifetimes import release_plan  # noqa: E402
from ios_ray.profiler.sim_model import stage_latency_ms  # noqa: E402
from ios_ray.runtime import Program, ScheduleRunner  # noqa: E402
from ios_ray.runtime.stages import ParallelStage  # noqa: E402
from ios_ray.schedule import Schedule  # noqa: E402
from ios_ray.scheduler import (SearchParams, optimize_graph, sequential,  # noqa: E402
                               sequential_stages)
from ios_ray.scheduler.budget import smallest_peak  # noqa: E402
from ios_ray.scheduler.memory import GraphMemory, to_bytes  # noqa: E402
from ios_ray.stage import Stage  # noqa: E402

TOLERANCE = 0.05
CPU_MODELS = ("inception_v3", "nasnet_a", "randwire", "squeezenet")
SIM_MODELS = ("inception_v3", "randwire", "nasnet_a")


class SimLatency:
    """The sim model's stage latencies for one GPU and batch, cached (simulated, not measured)."""

    def __init__(self, graph: Graph, gpu: str, batch: int) -> None:
        self.graph, self.gpu, self.batch = graph, gpu, batch
        self.cache: dict[Stage, float] = {}

    def latency(self, stage: Stage) -> float:
        """The simulated latency of ``stage`` in ms."""
        found = self.cache.get(stage)
        if found is None:
            found = self.cache[stage] = stage_latency_ms(self.graph, stage, self.batch, self.gpu)
        return found


def measured_peak(runner: ScheduleRunner, x: torch.Tensor) -> tuple[int, int]:
    """The highest bytes allocated at once during one pass as deployed (after a warm-up pass), above what was live
    before it: activations only, and everything (oneDNN's scratch included)."""
    runner(x)
    allocator_counter.start()
    out = runner(x)
    del out
    return allocator_counter.stop()


def worst_case_peak(runner: ScheduleRunner, x: torch.Tensor) -> int:
    """The activation peak of one pass (after a warm-up pass) if the groups of every concurrent stage reached their
    highest points at the same moment, the worst of their interleavings: each group runs alone on this thread, its
    rise above what was live when it started is measured, and the rises are summed on what was live at the stage's
    start. Every other stage, and putting the output together, runs as deployed."""
    program = runner.program
    runner(x)
    marks: list[int] = []
    concurrent: list[list[int]] = []  # per concurrent stage, the parts of the record its groups ran in
    with torch.no_grad():
        allocator_counter.start()
        env = {GRAPH_INPUT: x}
        for stage, release in zip(runner.stages, release_plan(program.graph, runner.schedule.stages)):
            if isinstance(stage, ParallelStage):
                outputs: dict[str, torch.Tensor] = {}
                concurrent.append([])
                for group in stage.groups:
                    concurrent[-1].append(len(marks))
                    marks.append(allocator_counter.mark())
                    outputs.update(group(env))
                env.update(outputs)
                del outputs
            else:
                marks.append(allocator_counter.mark())
                env.update(stage(env))
            for source in release:
                del env[source]
        marks.append(allocator_counter.mark())
        out = program.value(program.graph.output, env)
        del out, env
    parts = allocator_counter.stop_in_parts(marks)
    grouped = {i for indices in concurrent for i in indices}
    worst = max((top for i, (_, top) in enumerate(parts) if i not in grouped), default=0)
    for indices in concurrent:
        base = parts[indices[0]][0]
        worst = max(worst, base + sum(parts[i][1] - parts[i][0] for i in indices))
    return worst


def cpu_table(models: list[str], console: Console) -> bool:
    """Part (a): computed against measured peaks; True where every case is within the tolerance of the worst
    interleaving measured and no pass as deployed peaks above the computed peak."""
    table = Table("model", "batch", "schedule", "stages", "computed MB", "worst case MB", "ratio",
                  "one pass MB", "with scratch MB",
                  title="computed vs measured activation peak, CPU (counting allocator)")
    fine = True
    for name in models:
        imported = import_model(name)
        graph = imported.graph
        program = Program.from_imported(imported)
        memory, cost = GraphMemory(graph), SyntheticCost(graph)
        variants = {"sequential": tuple(sequential(graph, b, cost) for b in graph.blocks),
                    "DP": optimize_graph(graph, cost).schedules}
        for batch in (1, 32):
            x = torch.randn(batch, *graph.input_shape)
            held = to_bytes(math.prod(graph.input_shape), batch, "float32")
            for label, blocks in variants.items():
                schedule = Schedule(graph.name, graph.fingerprint, "cpu", batch, blocks)
                runner = ScheduleRunner(program, schedule, "cpu")
                worst = worst_case_peak(runner, x)
                measured, everything = measured_peak(runner, x)
                computed = to_bytes(memory.schedule_peak(schedule.stages).elements, batch, "float32") - held
                ratio = computed / worst
                fine &= abs(ratio - 1) <= TOLERANCE and measured <= computed
                table.add_row(name, str(batch), label, str(len(schedule.stages)), f"{computed / 1e6:,.2f}",
                              f"{worst / 1e6:,.2f}", f"{ratio:.4f}", f"{measured / 1e6:,.2f}",
                              f"{everything / 1e6:,.2f}")
                del runner
    console.print(table)
    return fine


def sim_table(models: list[str], console: Console, gpu: str = "v100") -> None:
    """Part (b): the latency-memory trade-off on a sim GPU (simulated latencies)."""
    table = Table("model", "batch", "budget", "budget MB", "latency ms (simulated)", "peak MB", "sequential ms",
                  "speedup kept", "DP s", title=f"latency and peak at each budget, sim:{gpu} (simulated)")
    smallest = Table("model", "smallest peak", "sequential peak", "ratio", "walk s",
                     title="smallest peak any schedule reaches, elements per sample")
    for name in models:
        graph = import_model(name).graph
        row = smallest_row(name, graph)
        smallest.add_row(*row)
        print("smallest:", *row, flush=True)
        for batch in (32, 128):
            latency = SimLatency(graph, gpu, batch)
            found = optimize_graph(graph, latency)
            plain_ms = sum(b.latency or 0.0 for b in (sequential(graph, blk, latency) for blk in graph.blocks))
            plain_peak = sequential_peak(graph, GraphMemory(graph), batch, "float32")
            for label in TRADE_OFF:
                given = parse_memory_budget(label)
                started = time.perf_counter()
                result, peak = budgeted(graph, found, latency, SearchParams(), batch, "float32", given)
                seconds = time.perf_counter() - started
                gain = plain_ms - found.cost
                kept = (plain_ms - result.cost) / gain if gain > 0 else math.nan
                row = (name, str(batch), label or "none",
                       "-" if given is None else f"{given.resolve(plain_peak) / 1e6:,.1f}",
                       f"{result.cost:.3f}", f"{peak.peak_bytes / 1e6:,.1f}", f"{plain_ms:.3f}",
                       f"{kept:.0%}", f"{seconds:.1f}")
                table.add_row(*row)
                print("row:", *row, flush=True)
    console.print(table)
    console.print(smallest)


def smallest_row(name: str, graph: Graph) -> tuple[str, ...]:
    """The smallest peak any schedule of ``graph`` reaches, against the sequential order's (elements per sample),
    and the seconds of the walk that finds it."""
    memory = GraphMemory(graph)
    plain = memory.schedule_peak([s for b in graph.blocks for s in sequential_stages(graph, b)]).elements
    started = time.perf_counter()
    least = smallest_peak(graph, SearchParams(), memory)
    return name, f"{least:,}", f"{plain:,}", f"{least / plain:.3f}x", f"{time.perf_counter() - started:.1f}"


def main() -> int:
    """Run the parts asked for and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("cpu", "sim"))
    parser.add_argument("--models", nargs="*")
    args = parser.parse_args()
    console = Console(width=160)
    fine = True
    if args.only in (None, "cpu"):
        allocator_counter.install()
        fine = cpu_table(args.models or list(CPU_MODELS), console)
        console.print(f"target: computed within {TOLERANCE:.0%} of the worst case measured, and no pass as deployed "
                      f"above it, in every case: {'met' if fine else 'MISSED'}")
    if args.only in (None, "sim"):
        sim_table(args.models or list(SIM_MODELS), console)
    return 0 if fine else 1


if __name__ == "__main__":
    sys.exit(main())
