"""A schedule as text for people (``ios-ray show``): its setting, the check that kept it, its memory, and per block its
stages with strategy, latency and groups. The picture is :mod:`ios_ray.app.cli.plot`'s.
"""

from __future__ import annotations

from ios_ray.ir import Graph
from ios_ray.schedule import Schedule


def schedule_text(schedule: Schedule, graph: Graph | None = None) -> str:
    """A plain-text listing: header, then per block its stages with strategy, latency and groups."""
    latency = schedule.predicted_latency
    predicted = f", predicted {latency:.3f} ms" if latency is not None else ""
    lines = [f"{schedule.model} on {schedule.device} (batch {schedule.batch}, {', '.join(schedule.numerics)}, "
             f"{schedule.kernels} kernels, {schedule.source}): {len(schedule.stages)} stages{predicted}"]
    check = schedule.end_to_end
    if check is not None:
        lines.append(f"end-to-end check: {check.summary()}")
    if schedule.memory is not None:
        lines.append(f"memory: {schedule.memory.summary()}")
    for block in schedule.blocks:
        lines.append(f"block {block.block}: {len(block.stages)} stages" +
                     (f", {block.latency:.3f} ms" if block.latency is not None else ""))
        latencies = block.latencies or (None,) * len(block.stages)
        for i, (stage, ms) in enumerate(zip(block.stages, latencies)):
            shown = f"{ms:8.3f} ms" if ms is not None else "       ? ms"
            groups = "  |  ".join(" -> ".join(_label(u, graph) for u in g) for g in stage.groups)
            lines.append(f"  stage {i:<3} {stage.strategy:<10} {shown}  {groups}")
    return "\n".join(lines)


def _label(unit_id: str, graph: Graph | None) -> str:
    if graph is None:
        return unit_id
    unit = graph.unit(unit_id)
    kernel = unit.attrs.get("kernel") or unit.attrs.get("kernel_size")
    detail = f" {kernel[0]}x{kernel[1]}" if kernel else ""
    return f"{unit_id} [{unit.kind}{detail}]"
