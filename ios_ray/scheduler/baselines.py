"""The two schedules IOS is compared against.

* ``sequential``: one unit per stage, in topological order (what a framework does without streams).
* ``greedy``: each stage runs every unit whose inputs are ready, each unit its own group (the paper's greedy).

:func:`baseline_schedule` is either as a whole :class:`~ios_ray.schedule.Schedule`, the one place one is built.
"""

from __future__ import annotations

from typing import Any

from ios_ray.ir import Block, Graph
from ios_ray.schedule import BlockSchedule, Schedule
from ios_ray.scheduler.dag import BlockDag
from ios_ray.scheduler.latency import LatencyModel
from ios_ray.stage import Stage


def sequential_stages(graph: Graph, block: Block) -> tuple[Stage, ...]:
    """One single-unit concurrent stage per unit of ``block``, in topological order."""
    return tuple(Stage("concurrent", ((unit_id,),)) for unit_id in block.units)


def greedy_stages(graph: Graph, block: Block) -> tuple[Stage, ...]:
    """Stages of all units ready to run (their inputs in the block already done), each unit its own group."""
    dag = BlockDag.of(graph, block)
    stages = []
    done = 0
    while done != dag.full:
        ready = sum(1 << i for i in range(dag.size) if not done >> i & 1 and dag.preds[i] & ~done == 0)
        stages.append(Stage("concurrent", tuple((unit_id,) for unit_id in dag.ids(ready))))
        done |= ready
    return tuple(stages)


def sequential(graph: Graph, block: Block, latency: LatencyModel) -> BlockSchedule:
    """The sequential schedule of ``block``, with its stage latencies."""
    return priced(block, sequential_stages(graph, block), latency)


def greedy(graph: Graph, block: Block, latency: LatencyModel) -> BlockSchedule:
    """The greedy schedule of ``block``, with its stage latencies."""
    return priced(block, greedy_stages(graph, block), latency)


def priced(block: Block, stages: tuple[Stage, ...], latency: LatencyModel) -> BlockSchedule:
    """A block schedule of these stages, each with its latency from ``latency``."""
    return BlockSchedule(block.index, stages, tuple(latency.latency(stage) for stage in stages))


def baseline_schedule(graph: Graph, name: str = "sequential", like: Schedule | None = None, **labels: Any
                      ) -> Schedule:
    """The sequential or greedy (``name``) schedule of ``graph``, its stages without latencies and its params
    naming the baseline, for the setting ``like`` is for (its model, device and the device's identity, batch,
    dtype and kernels; its correction kept in the params), or ``labels`` say (:class:`Schedule` fields: ``device``
    and ``batch`` at least; the model is the graph's name unless given)."""
    make = {"sequential": sequential_stages, "greedy": greedy_stages}[name]
    blocks = tuple(BlockSchedule(block.index, make(graph, block)) for block in graph.blocks)
    params: dict[str, Any] = {"baseline": name}
    if like is not None:
        params |= {"correction": like.params["correction"]} if "correction" in like.params else {}
        labels = {"model": like.model, "device": like.device, "batch": like.batch, "dtype": like.dtype,
                  "device_fingerprint": like.device_fingerprint, "device_info": like.device_info,
                  "source": like.source, "kernels": like.kernels, **labels}
    return Schedule(**{"model": graph.name, **labels}, graph_fingerprint=graph.fingerprint, blocks=blocks,
                    params=params, input_shape=graph.input_shape, memory_format=graph.memory_format)
