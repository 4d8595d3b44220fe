"""Rendering a schedule for people: as text, and as an SVG picture of its stages and groups (IOS Figure 10).

In the picture each block is a row; each stage is a dashed box from left to right (the barriers between stages
are the gaps); inside a stage each group is a column of unit boxes run top to bottom, and the groups of one stage
sit side by side because they run at once. Merge stages are drawn in another colour, with the merged convs side
by side.
"""

from __future__ import annotations

from html import escape

from ios_ray.ir import Graph
from ios_ray.schedule import Schedule
from ios_ray.stage import Stage

_BOX_W, _BOX_H, _GAP, _PAD = 150, 22, 8, 10
_COLOURS = {"concurrent": "#e8f0fe", "merge": "#fde7c8"}
_KIND_COLOURS = {"conv": "#c6dbef", "sepconv": "#c7e9c0", "pool": "#fdd0a2", "concat": "#dadaeb", "add": "#dadaeb"}


def schedule_text(schedule: Schedule, graph: Graph | None = None) -> str:
    """A plain-text listing: header, then per block its stages with strategy, latency and groups."""
    latency = schedule.predicted_latency
    predicted = f", predicted {latency:.3f} ms" if latency is not None else ""
    lines = [f"{schedule.model} on {schedule.device} (batch {schedule.batch}, {', '.join(schedule.settings)}, "
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


def schedule_svg(schedule: Schedule, graph: Graph | None = None) -> str:
    """An SVG picture of the schedule: a row per block, a dashed box per stage, a column per group."""
    rows: list[str] = []
    y = _PAD + 24
    width = 0
    for block in schedule.blocks:
        x = _PAD + 70
        height = max(len(g) for s in block.stages for g in s.groups) * (_BOX_H + 4) + 2 * _GAP
        rows.append(_text(_PAD, y + height / 2, f"block {block.block}", anchor="start"))
        for stage in block.stages:
            drawn, stage_w = _stage(stage, x, y, height, graph)
            rows.append(drawn)
            x += stage_w + _GAP
        width = max(width, x)
        y += height + _GAP
    title = _text(_PAD, _PAD + 10, f"{schedule.model} on {schedule.device}, batch {schedule.batch}", anchor="start")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + _PAD}" height="{y + _PAD}" '
            f'font-family="sans-serif" font-size="11">\n{title}\n' + "\n".join(rows) + "\n</svg>\n")


def _stage(stage: Stage, x: float, y: float, height: float, graph: Graph | None) -> tuple[str, float]:
    """One stage's dashed box with its groups inside; returns the SVG and the box width."""
    stage_w = len(stage.groups) * (_BOX_W + _GAP) + _GAP
    parts = [f'<rect x="{x}" y="{y}" width="{stage_w}" height="{height}" rx="6" fill="{_COLOURS[stage.strategy]}" '
             f'stroke="#555" stroke-dasharray="4 3"><title>{stage.strategy}</title></rect>']
    for g, group in enumerate(stage.groups):
        gx = x + _GAP + g * (_BOX_W + _GAP)
        for i, unit in enumerate(group):
            gy = y + _GAP + i * (_BOX_H + 4)
            kind = graph.unit(unit).kind if graph is not None else ""
            parts.append(f'<rect x="{gx}" y="{gy}" width="{_BOX_W}" height="{_BOX_H}" rx="3" '
                         f'fill="{_KIND_COLOURS.get(kind, "#eeeeee")}" stroke="#333"><title>{escape(unit)}</title></rect>')
            parts.append(_text(gx + _BOX_W / 2, gy + _BOX_H / 2 + 4, _short(_label(unit, graph))))
    return "\n".join(parts), stage_w


def _label(unit_id: str, graph: Graph | None) -> str:
    if graph is None:
        return unit_id
    unit = graph.unit(unit_id)
    kernel = unit.attrs.get("kernel") or unit.attrs.get("kernel_size")
    detail = f" {kernel[0]}x{kernel[1]}" if kernel else ""
    return f"{unit_id} [{unit.kind}{detail}]"


def _short(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def _text(x: float, y: float, text: str, anchor: str = "middle") -> str:
    return f'<text x="{x}" y="{y}" text-anchor="{anchor}">{escape(text)}</text>'
