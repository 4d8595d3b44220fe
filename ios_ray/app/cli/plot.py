"""The picture of a schedule (``ios-ray show --plot FILE``): its timeline per stream or thread beside the
sequential schedule's, on one time axis, drawn with matplotlib into PNG, SVG or PDF files.

The upper panel is the schedule of the file: a lane per stream (GPU) or thread (CPU), each unit a bar as long as
its share of the stage's latency (:mod:`ios_ray.app.cli.timeline`), coloured by kind, merged convs hatched, dotted lines
at the barriers between stages, and the critical path (the group each stage waits for) outlined in red. The lower
panel is the sequential schedule of the same graph from the store's latencies of every unit alone. A unit's name is
written in its bar where it fits whole (never cut); ``ios-ray show`` lists every stage in text.

matplotlib is imported here only, through its object-oriented API (no pyplot, no global backend), so a notebook's
own plotting is left alone; it is the ``plot`` extra (``pip install 'ios-ray[plot]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ios_ray.app.cli.timeline import Bar, Timeline
from ios_ray.errors import UserError
from ios_ray.schedule import Schedule

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: The formats a picture is written in, by file suffix.
FORMATS = (".png", ".svg", ".pdf")
#: Each unit kind's colour (others grey); merge stages are hatched over their units' colours.
KIND_COLOURS = {"conv": "#6baed6", "sepconv": "#74c476", "deconv": "#9ecae1", "pool": "#fd8d3c", "concat": "#9e9ac8",
                "add": "#bcbddc", "linear": "#f768a1", "elementwise": "#fdd0a2", "opaque": "#bdbdbd"}
OTHER_COLOUR = "#d9d9d9"
CRITICAL = "#d62728"
_LANE_IN, _WIDTH_IN, _FONT_PT = 0.34, 15.0, 6.5


def check_plot_paths(paths: Sequence[Path]) -> None:
    """UserError for a path whose suffix names no format the picture is written in."""
    for path in paths:
        if path.suffix.lower() not in FORMATS:
            raise UserError(f"--plot takes a file ending in {', '.join(FORMATS)}, not {str(path)!r}; give one per "
                            "format wanted (--plot s.png --plot s.svg).")


def plot_schedule(schedule: Schedule, timeline: Timeline, sequential: Timeline | None, paths: Sequence[Path],
                  store: str) -> None:
    """Draw the schedule's timeline above the sequential one's and write it to every path (by its suffix)."""
    try:
        from matplotlib import rc_context
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise UserError("the picture needs matplotlib, which is not installed here; install it with pip install "
                        "'ios-ray[plot]' (or pip install matplotlib).") from None
    lanes = timeline.lanes + (1 if sequential is not None else 0)
    figure = Figure(figsize=(_WIDTH_IN, 1.9 + _LANE_IN * lanes + (0.5 if sequential is not None else 0)),
                    layout="constrained")
    rows = [timeline.lanes] + ([1] if sequential is not None else [])
    axes = figure.subplots(len(rows), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": rows})[:, 0]
    end = max(timeline.total_ms, sequential.total_ms if sequential is not None else 0.0)
    lane_word = "thread" if schedule.device == "cpu" else "stream"
    kept = _kept(schedule)
    _panel(axes[0], timeline, end, [f"{lane_word} {i}" for i in range(timeline.lanes)],
           f"{kept}; {len(schedule.stages)} stages, {timeline.total_ms:.3f} ms")
    if sequential is not None:
        speedup = sequential.total_ms / timeline.total_ms if timeline.total_ms > 0 else float("nan")
        _panel(axes[1], sequential, end, ["one at a time"],
               f"sequential: {len(sequential.stages)} units, {sequential.total_ms:.3f} ms "
               f"({speedup:.2f}x the time of the schedule above)")
    axes[-1].set_xlabel(f"time (ms), {_how(schedule)}", fontsize=8)
    figure.suptitle(f"{schedule.model} on {schedule.device}, batch {schedule.batch}, {', '.join(schedule.numerics)}",
                    fontsize=11, fontweight="bold")
    kinds = sorted({bar.kind for bar in timeline.bars})
    handles = [Patch(facecolor=KIND_COLOURS.get(kind, OTHER_COLOUR), edgecolor="#333333", label=kind) for kind in kinds]
    handles += [Patch(facecolor="white", edgecolor="#333333", hatch="////", label="merged into one conv"),
                Patch(facecolor="white", edgecolor=CRITICAL, linewidth=1.6, label="critical path")]
    if any(not bar.known for bar in timeline.bars):
        handles.append(Patch(facecolor="white", edgecolor="#333333", alpha=0.35, label="group time not in the store"))
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=7, frameon=False)
    if sequential is None:
        figure.text(0.01, 0.01, f"sequential schedule not drawn: {store} lacks units alone at this setting",
                    fontsize=7, color="#555555")
    for path in paths:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with rc_context({"svg.fonttype": "none"}):  # an SVG's names stay text: found, copied, read aloud
                figure.savefig(path, dpi=150)
        except OSError as exc:
            raise UserError(f"cannot write the picture {path} ({exc.strerror or exc}); pass another --plot.") from None


def _panel(axes: Axes, timeline: Timeline, end: float, lanes: Sequence[str], title: str) -> None:
    """One schedule's lanes: its bars, its stage barriers and its critical path."""
    axes.set_title(title, loc="left", fontsize=9)
    axes.set_xlim(0, end * 1.005 if end > 0 else 1)
    axes.set_ylim(len(lanes) - 0.5, -0.5)
    axes.set_yticks(range(len(lanes)), lanes, fontsize=7)
    axes.tick_params(axis="x", labelsize=7)
    for start, _ in timeline.stages[1:]:
        axes.axvline(start, color="#999999", linewidth=0.4, linestyle=":", zorder=0)
    points_per_ms = _points_per_ms(axes, end)
    for bar in timeline.bars:
        _bar(axes, bar, points_per_ms)
    path = [(bar.start_ms + bar.ms / 2, bar.lane) for bar in timeline.bars if bar.critical]
    if len(path) > 1 and len(lanes) > 1:
        xs, ys = zip(*path)
        axes.plot(xs, ys, color=CRITICAL, linewidth=0.6, alpha=0.5, zorder=3)


def _bar(axes: Axes, bar: Bar, points_per_ms: float) -> None:
    """One unit's bar, its name inside where the name fits whole."""
    axes.barh(bar.lane, bar.ms, left=bar.start_ms, height=0.72, color=KIND_COLOURS.get(bar.kind, OTHER_COLOUR),
              edgecolor=CRITICAL if bar.critical else "#333333", linewidth=1.2 if bar.critical else 0.4,
              hatch="////" if bar.merged else None, alpha=1.0 if bar.known else 0.35, zorder=2)
    if len(bar.unit) * _FONT_PT * 0.6 + 4 <= bar.ms * points_per_ms:
        axes.text(bar.start_ms + bar.ms / 2, bar.lane, bar.unit, ha="center", va="center", fontsize=_FONT_PT,
                  zorder=4)


def _points_per_ms(axes: Axes, end: float) -> float:
    """How many typographic points one millisecond spans on the axes (for fitting names into bars)."""
    figure: Any = axes.figure
    width_in = float(figure.get_figwidth()) * 0.86  # the axes' share of the width, less the lane names on the left
    return width_in * 72 / (end if end > 0 else 1)


def _kept(schedule: Schedule) -> str:
    """The panel's name for the file's schedule: which one the search kept, and why."""
    check = schedule.end_to_end
    if check is None:
        return "IOS schedule"
    return f"{'IOS' if check.kept == 'dp' else 'sequential'} schedule, kept: {check.decision.split(': ', 1)[1]}"


def _how(schedule: Schedule) -> str:
    """Where the times come from."""
    if schedule.source == "simulated":
        return f"simulated by the sim model for {schedule.device}, stage by stage"
    return f"each stage's latency as measured alone on {schedule.device}, one after another"
