"""The schedule file: which stages run each block of a graph, for one device and batch size.

A schedule is versioned JSON. It carries the graph fingerprint it was made for and the graph's per-sample input
shape, the device label and fingerprint, batch size, dtype and memory format, the search parameters, and per block
its stages (strategy and groups of unit ids) with their predicted latencies, and for a measured device the end-to-end
check that chose it (:class:`EndToEnd`). :func:`load_schedule` checks a file against a graph and rejects a
mismatch with one clear sentence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ios_ray.errors import UserError
from ios_ray.ir import DEFAULT_MEMORY_FORMAT, Graph
from ios_ray.paired import FASTER, SLOWER, WITHIN_NOISE, RatioInterval, percent
from ios_ray.stage import Stage

#: The largest batch size a schedule (and a stored measurement) can be made for: the store keeps it in 32 bits.
MAX_BATCH = 2**31 - 1

#: How torch names each memory format, for messages that tell what to convert a model with.
MEMORY_FORMAT_TORCH_NAMES = {"contiguous": "contiguous_format", "channels_last": "channels_last"}

SCHEDULE_FORMAT = "ios-ray-schedule"
SCHEDULE_VERSION = 1


@dataclass(frozen=True)
class BlockSchedule:
    """The stages of one block, in order, with each stage's latency in ms (None where unknown)."""

    block: int
    stages: tuple[Stage, ...]
    latencies: tuple[float | None, ...] = ()

    @property
    def latency(self) -> float | None:
        """The block's predicted latency in ms: the sum of its stage latencies."""
        if not self.latencies or any(x is None for x in self.latencies):
            return None
        return float(sum(self.latencies))  # type: ignore[arg-type]


@dataclass(frozen=True)
class EndToEnd:
    """The search's end-to-end check: the DP's schedule and the sequential one timed whole in paired rounds on the
    device (:mod:`ios_ray.paired`), their median times beside their predictions (sums of stage latencies), and the
    ratio DP / sequential with its interval. The file keeps the DP's schedule only where that interval lies wholly
    below 1. ``ratio`` is None in files written before checks were paired; theirs kept the lower median."""

    rounds: int
    dp_ms: float
    sequential_ms: float
    dp_predicted_ms: float | None = None
    sequential_predicted_ms: float | None = None
    ratio: RatioInterval | None = None

    @property
    def kept(self) -> str:
        """``"dp"`` or ``"sequential"``."""
        if self.ratio is None:
            return "sequential" if self.sequential_ms < self.dp_ms else "dp"
        return "dp" if self.ratio.verdict == FASTER else "sequential"

    @property
    def reason(self) -> str:
        """Why the kept schedule was kept: ``faster beyond noise``, ``within noise``, ``IOS slower beyond noise``."""
        if self.ratio is None:
            return "lower median, unpaired check"
        return {FASTER: "faster beyond noise", SLOWER: "IOS slower beyond noise",
                WITHIN_NOISE: "within noise"}[self.ratio.verdict]

    @property
    def decision(self) -> str:
        """The decision in words: ``kept sequential: within noise, 0.98-1.03``."""
        kept = "kept IOS" if self.kept == "dp" else "kept sequential"
        return f"{kept}: {self.reason}" + ("" if self.ratio is None else f", {self.ratio.span}")

    def summary(self) -> str:
        """One line: both end-to-end times, the ratio with its interval and rounds, and the decision."""
        times = f"DP schedule {self.dp_ms:.3f} ms, sequential {self.sequential_ms:.3f} ms"
        if self.ratio is None:
            return f"{times} ({self.rounds} rounds); {self.decision}"
        return (f"{times}; DP / sequential {self.ratio.median:.3f} ({percent(self.ratio.confidence)} interval "
                f"{self.ratio.span}, {self.rounds} rounds); {self.decision}")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        found = {"rounds": self.rounds, "dp_ms": self.dp_ms, "sequential_ms": self.sequential_ms,
                 "dp_predicted_ms": self.dp_predicted_ms, "sequential_predicted_ms": self.sequential_predicted_ms}
        if self.ratio is not None:
            found |= {"ratio": self.ratio.median, "ratio_low": self.ratio.low, "ratio_high": self.ratio.high,
                      "confidence": self.ratio.confidence}
        return found | {"kept": self.kept, "decision": self.decision}


@dataclass(frozen=True)
class Schedule:
    """A whole-graph schedule specialised for one (device, batch, dtype); its graph's memory format comes along."""

    model: str
    graph_fingerprint: str
    device: str
    batch: int
    blocks: tuple[BlockSchedule, ...]
    dtype: str = "float32"
    device_fingerprint: str = ""
    device_info: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    source: str = "measured"
    end_to_end: EndToEnd | None = None
    input_shape: tuple[int, ...] | None = None
    memory_format: str = DEFAULT_MEMORY_FORMAT

    @property
    def settings(self) -> tuple[str, ...]:
        """Its dtype, and its memory format where that is not contiguous: what listings and titles name."""
        return (self.dtype,) if self.memory_format == DEFAULT_MEMORY_FORMAT else (self.dtype, self.memory_format)

    @property
    def stages(self) -> tuple[Stage, ...]:
        """All stages of the graph in execution order."""
        return tuple(s for b in self.blocks for s in b.stages)

    @property
    def predicted_latency(self) -> float | None:
        """Predicted end-to-end latency in ms: the sum of all stage latencies (None where any is unknown)."""
        latencies = [b.latency for b in self.blocks]
        return None if any(x is None for x in latencies) else float(sum(latencies))  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (see :func:`schedule_from_json`)."""
        return {
            "format": SCHEDULE_FORMAT,
            "version": SCHEDULE_VERSION,
            "model": self.model,
            "graph_fingerprint": self.graph_fingerprint,
            "input_shape": list(self.input_shape) if self.input_shape is not None else None,
            "device": self.device,
            "device_fingerprint": self.device_fingerprint,
            "device_info": dict(self.device_info),
            "batch": self.batch,
            "dtype": self.dtype,
            "memory_format": self.memory_format,
            "source": self.source,
            "params": dict(self.params),
            "predicted_latency_ms": self.predicted_latency,
            "end_to_end": self.end_to_end.to_json() if self.end_to_end is not None else None,
            "blocks": [
                {
                    "block": b.block,
                    "latency_ms": b.latency,
                    "stages": [
                        {**s.to_json(), "latency_ms": lat}
                        for s, lat in zip(b.stages, b.latencies or [None] * len(b.stages))
                    ],
                }
                for b in self.blocks
            ],
        }


def schedule_from_json(data: Mapping[str, Any]) -> Schedule:
    """Parse the JSON form; raises ValueError on anything malformed."""
    if data.get("format") != SCHEDULE_FORMAT:
        raise ValueError("not an ios-ray schedule")
    if data.get("version") != SCHEDULE_VERSION:
        raise ValueError(f"schedule format version {data.get('version')} (this ios-ray reads {SCHEDULE_VERSION})")
    blocks = tuple(
        BlockSchedule(
            block=int(b["block"]),
            stages=tuple(Stage.from_json(s) for s in b["stages"]),
            latencies=tuple(s.get("latency_ms") for s in b["stages"]),
        )
        for b in data["blocks"]
    )
    batch = int(data["batch"])
    if batch <= 0:
        raise ValueError(f"batch size {batch} is not positive")
    return Schedule(
        model=str(data["model"]),
        graph_fingerprint=str(data["graph_fingerprint"]),
        device=str(data["device"]),
        batch=batch,
        blocks=blocks,
        dtype=str(data.get("dtype", "float32")),
        device_fingerprint=str(data.get("device_fingerprint", "")),
        device_info=dict(data.get("device_info", {})),
        params=dict(data.get("params", {})),
        source=str(data.get("source", "measured")),
        end_to_end=_end_to_end(data.get("end_to_end")),
        input_shape=tuple(int(n) for n in data["input_shape"]) if data.get("input_shape") is not None else None,
        memory_format=str(data.get("memory_format", DEFAULT_MEMORY_FORMAT)),
    )


def _end_to_end(data: Mapping[str, Any] | None) -> EndToEnd | None:
    """The end-to-end check of a schedule file, where it has one (its ratio where the check was paired)."""
    if data is None:
        return None
    predicted = [None if data.get(k) is None else float(data[k]) for k in ("dp_predicted_ms", "sequential_predicted_ms")]
    rounds = int(data["rounds"])
    ratio = None
    if data.get("ratio") is not None:
        low, high = (None if data.get(k) is None else float(data[k]) for k in ("ratio_low", "ratio_high"))
        ratio = RatioInterval(float(data["ratio"]), low, high, float(data["confidence"]), rounds)
    return EndToEnd(rounds, float(data["dp_ms"]), float(data["sequential_ms"]), *predicted, ratio)


def save_schedule(schedule: Schedule, path: Path) -> None:
    """Write a schedule as JSON (parent folders are created; the write is atomic)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(schedule.to_json(), indent=1))
        tmp.replace(path)
    except OSError as exc:
        raise UserError(f"cannot write the schedule {path} ({exc.strerror or exc}); pass another out folder.") from None


def read_schedule(path: Path) -> Schedule:
    """Read a schedule file; a missing, corrupt or foreign file raises UserError."""
    try:
        return schedule_from_json(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise UserError(f"no schedule file at {path}.") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path} is not a valid ios-ray schedule ({exc}).") from None


def check_schedule(schedule: Schedule, graph: Graph, where: str = "the schedule") -> None:
    """Raise UserError unless the schedule was made for this graph and covers each unit exactly once."""
    if schedule.graph_fingerprint != graph.fingerprint and schedule.memory_format != graph.memory_format:
        raise UserError(
            f"{where} was made for the model in {schedule.memory_format} memory format, and this {graph.name!r} is "
            f"{graph.memory_format}; convert the model (model.to(memory_format=torch."
            f"{MEMORY_FORMAT_TORCH_NAMES[schedule.memory_format]})) or search it in {graph.memory_format}."
        )
    if schedule.graph_fingerprint != graph.fingerprint:
        raise UserError(
            f"{where} was made for another graph (model {schedule.model!r}, fingerprint "
            f"{schedule.graph_fingerprint}) than {graph.name!r} (fingerprint {graph.fingerprint})."
        )
    scheduled = [u for s in schedule.stages for u in s.units]
    expected = [u.id for u in graph.units]
    if sorted(scheduled) != sorted(expected):
        raise UserError(f"{where} does not cover the units of {graph.name!r} exactly once.")
    place = _unit_places(schedule)
    for unit in graph.units:
        stage, group, pos = place[unit.id]
        for source in unit.sources:
            if source not in place:
                continue
            s_stage, s_group, s_pos = place[source]
            if s_stage > stage or (s_stage == stage and (s_group != group or s_pos > pos)):
                raise UserError(f"{where} runs unit {unit.id!r} before or beside one of its inputs.")


def _unit_places(schedule: Schedule) -> dict[str, tuple[int, int, int]]:
    """For each unit id: (stage index, group index, position in the group)."""
    return {
        unit: (s, g, p)
        for s, stage in enumerate(schedule.stages)
        for g, group in enumerate(stage.groups)
        for p, unit in enumerate(group)
    }


def load_schedule(path: Path, graph: Graph, device: str | None = None) -> Schedule:
    """Read a schedule and check it against a graph (and a device label, if given)."""
    schedule = read_schedule(path)
    check_schedule(schedule, graph, where=str(path))
    if device is not None and schedule.device != device:
        raise UserError(f"{path} is a schedule for device {schedule.device!r}, not {device!r}.")
    return schedule
