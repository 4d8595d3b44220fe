"""The schedule file: which stages run each block of a graph, for one device and batch size.

A schedule is versioned JSON. It carries the graph fingerprint it was made for and the graph's per-sample input
shape, the device label and fingerprint, batch size, dtype, memory format and the kernels its stages were measured
with (:mod:`~ios_ray.runtime.kernels`; ``eager`` for files before kernels), the search parameters, and per block
its stages (strategy and groups of unit ids) with their predicted latencies, and for a measured device the end-to-end
check that chose it (:class:`EndToEnd`), and, where the search computed it, its peak activation memory
(:class:`PeakMemory`). :func:`read_schedule` checks every field of a file (hand-edited ones
too) before anything reads it: :func:`schedule_defects` names each field of the wrong type or out of range, and the
file is refused in one sentence listing them. :func:`load_schedule` also checks a file against a graph and rejects a
mismatch with one clear sentence.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.paired import FASTER, SLOWER, WITHIN_NOISE, RatioInterval, percent, valid_confidence
from ios_ray.stage import Stage
from ios_ray.vocabulary import (DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, DTYPE_NAMES, EAGER_KERNELS, KERNEL_NAMES,
                                MAX_BATCH_SIZE, SOURCES, STRATEGIES, settings_named)

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


#: The schedules an end-to-end check may run, by their names in files, and as a reader reads them: the DP's, its
#: alternatives that run fewer stages or fewer groups at once, greedy, and sequential (the baseline).
CANDIDATES = {"dp": "IOS", "dp-fewer-stages": "IOS fewer stages", "dp-fewer-groups": "IOS fewer groups",
              "greedy": "greedy", "sequential": "sequential"}


@dataclass(frozen=True)
class CandidateRun:
    """One schedule as the end-to-end check ran it: its median ms over the rounds it ran, its prediction (the sum of
    its stage latencies) and corrected prediction (:mod:`~ios_ray.scheduler.correction`; None: no correction), and
    its ratio over sequential with its interval (None for sequential itself)."""

    name: str
    ms: float
    rounds: int
    predicted_ms: float | None = None
    corrected_ms: float | None = None
    ratio: RatioInterval | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        found: dict[str, Any] = {"name": self.name, "ms": self.ms, "rounds": self.rounds,
                                 "predicted_ms": self.predicted_ms, "corrected_ms": self.corrected_ms}
        if self.ratio is not None:
            found |= {"ratio": self.ratio.median, "ratio_low": self.ratio.low, "ratio_high": self.ratio.high}
        return found


@dataclass(frozen=True)
class EndToEnd:
    """The search's end-to-end check: the DP's schedule, its alternatives, greedy and the sequential schedule timed
    whole in rounds on the device (:mod:`ios_ray.paired`), with the DP's and sequential's median times beside their
    predictions (sums of stage latencies) and the ratio DP / sequential with its interval, and each candidate that ran
    (``candidates``). The file keeps the candidate of the lowest median among those faster than sequential beyond
    noise (``kept_name``), else sequential. Files written before candidates ran only the DP's and the sequential
    schedule and keep the DP's where its interval lies wholly below 1; ``ratio`` is None in files written before
    checks were paired, which kept the lower median."""

    rounds: int
    dp_ms: float
    sequential_ms: float
    dp_predicted_ms: float | None = None
    sequential_predicted_ms: float | None = None
    ratio: RatioInterval | None = None
    candidates: tuple[CandidateRun, ...] = ()
    kept_name: str | None = None

    @property
    def kept(self) -> str:
        """The name of the schedule kept (:data:`CANDIDATES`: ``dp``, ``greedy``, ``sequential``...)."""
        if self.kept_name is not None:
            return self.kept_name
        if self.ratio is None:
            return "sequential" if self.sequential_ms < self.dp_ms else "dp"
        return "dp" if self.ratio.verdict == FASTER else "sequential"

    @property
    def deciding(self) -> RatioInterval | None:
        """The interval the decision rests on: the kept candidate's over sequential, or where sequential was kept
        that of the candidate that ran beside it to the end (the DP's in files before candidates)."""
        timed = [c for c in self.candidates if c.ratio is not None]
        if not timed:
            return self.ratio
        kept = next((c for c in timed if c.name == self.kept), None)
        return (kept or max(timed, key=lambda c: c.rounds)).ratio

    @property
    def reason(self) -> str:
        """Why the kept schedule was kept: ``faster beyond noise``, ``within noise``, ``IOS slower beyond noise``."""
        ratio = self.deciding
        if ratio is None:
            return "lower median, unpaired check"
        return {FASTER: "faster beyond noise", SLOWER: "IOS slower beyond noise",
                WITHIN_NOISE: "within noise"}[ratio.verdict]

    @property
    def decision(self) -> str:
        """The decision in words: ``kept sequential: within noise, 0.98-1.03``, ``kept greedy: faster beyond noise,
        0.80-0.85``."""
        ratio = self.deciding
        return f"kept {CANDIDATES[self.kept]}: {self.reason}" + ("" if ratio is None else f", {ratio.span}")

    @property
    def kept_over_predicted(self) -> float | None:
        """What the kept schedule measured over what was predicted of it (its corrected prediction where the search
        had a correction), or None without a prediction."""
        kept = next((c for c in self.candidates if c.name == self.kept), None)
        if kept is not None:
            predicted = kept.corrected_ms if kept.corrected_ms is not None else kept.predicted_ms
            return kept.ms / predicted if predicted else None
        ms, predicted = ((self.dp_ms, self.dp_predicted_ms) if self.kept == "dp" else
                         (self.sequential_ms, self.sequential_predicted_ms))
        return ms / predicted if predicted else None

    def times(self) -> str:
        """Each schedule's median time in words: ``IOS 1.011, greedy 0.908, sequential 1.108 ms``."""
        ran = self.candidates or (CandidateRun("dp", self.dp_ms, self.rounds),
                                  CandidateRun("sequential", self.sequential_ms, self.rounds))
        return ", ".join(f"{CANDIDATES[c.name]} {c.ms:.3f}" for c in ran) + " ms"

    def summary(self) -> str:
        """One line: both end-to-end times, the ratio with its interval and rounds, the other candidates, and the
        decision."""
        times = f"DP schedule {self.dp_ms:.3f} ms, sequential {self.sequential_ms:.3f} ms"
        others = "".join(f"; {CANDIDATES[c.name]} {c.ms:.3f} ms" for c in self.candidates
                         if c.name not in ("dp", "sequential"))
        if self.ratio is None:
            return f"{times}{others} ({self.rounds} rounds); {self.decision}"
        return (f"{times}{others}; DP / sequential {self.ratio.median:.3f} ({percent(self.ratio.confidence)} "
                f"interval {self.ratio.span}, {self.rounds} rounds); {self.decision}")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (``candidates`` only where the check ran them)."""
        found: dict[str, Any] = {"rounds": self.rounds, "dp_ms": self.dp_ms, "sequential_ms": self.sequential_ms,
                 "dp_predicted_ms": self.dp_predicted_ms, "sequential_predicted_ms": self.sequential_predicted_ms}
        if self.ratio is not None:
            found |= {"ratio": self.ratio.median, "ratio_low": self.ratio.low, "ratio_high": self.ratio.high,
                      "confidence": self.ratio.confidence}
        if self.candidates:
            found["candidates"] = [c.to_json() for c in self.candidates]
        return found | {"kept": self.kept, "decision": self.decision}


@dataclass(frozen=True)
class PeakMemory:
    """A schedule's peak activation memory in bytes (:mod:`ios_ray.scheduler.memory`: the graph input and output
    included, the weights not), the sequential schedule's beside it, and the budget it was searched under (None:
    none)."""

    peak_bytes: int
    sequential_peak_bytes: int
    budget_bytes: int | None = None

    def summary(self) -> str:
        """One line: the peak, the sequential schedule's, and the budget."""
        budget = "no budget" if self.budget_bytes is None else f"budget {megabytes(self.budget_bytes)}"
        return f"peak {megabytes(self.peak_bytes)} (sequential {megabytes(self.sequential_peak_bytes)}; {budget})"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {"peak_bytes": self.peak_bytes, "sequential_peak_bytes": self.sequential_peak_bytes,
                "budget_bytes": self.budget_bytes}


def megabytes(size: int) -> str:
    """Bytes as a reader reads them: ``12.3 MB`` (10^6 bytes)."""
    return f"{size / 1e6:,.1f} MB"


@dataclass(frozen=True)
class Schedule:
    """A whole-graph schedule specialised for one (device, batch, dtype); its graph's memory format comes along."""

    model: str
    graph_fingerprint: str
    device: str
    batch: int
    blocks: tuple[BlockSchedule, ...]
    dtype: str = DEFAULT_DTYPE
    device_fingerprint: str = ""
    device_info: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    source: str = "measured"
    end_to_end: EndToEnd | None = None
    input_shape: tuple[int, ...] | None = None
    memory_format: str = DEFAULT_MEMORY_FORMAT
    memory: PeakMemory | None = None
    kernels: str = EAGER_KERNELS

    @property
    def settings(self) -> tuple[str, ...]:
        """Its dtype, and its memory format where that is not contiguous: what listings and titles name."""
        return (self.dtype,) if self.memory_format == DEFAULT_MEMORY_FORMAT else (self.dtype, self.memory_format)

    @property
    def stages(self) -> tuple[Stage, ...]:
        """All stages of the graph in execution order."""
        return tuple(s for b in self.blocks for s in b.stages)

    @property
    def shape(self) -> tuple[int, int]:
        """Its stages, and its groups beyond the first of each concurrent stage (what a correction of stage costs
        prices besides their sum: :mod:`~ios_ray.scheduler.correction`)."""
        stages = self.stages
        return len(stages), sum(len(s.groups) - 1 for s in stages if s.strategy == "concurrent")

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
            "kernels": self.kernels,
            "source": self.source,
            "params": dict(self.params),
            "predicted_latency_ms": self.predicted_latency,
            "end_to_end": self.end_to_end.to_json() if self.end_to_end is not None else None,
            **({"memory": self.memory.to_json()} if self.memory is not None else {}),
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


#: A field's check: None where the value is fine, else what it should be.
Check = Callable[[Any], "str | None"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ms(value: Any) -> str | None:
    fine = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return None if fine else "a number of milliseconds"


def _ratio_or_null(value: Any) -> str | None:
    fine = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                             and value > 0)
    return None if fine else "a positive number or null"


def _confidence(value: Any) -> str | None:
    fine = isinstance(value, (int, float)) and not isinstance(value, bool) and valid_confidence(value)
    return None if fine else "a number from 0.5 to below 1"


def _ms_or_null(value: Any) -> str | None:
    return None if value is None or _ms(value) is None else "a number of milliseconds or null"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _mapping(value: Any) -> str | None:
    return None if isinstance(value, dict) else "an object"


def _batch(value: Any) -> str | None:
    return None if _is_int(value) and 0 < value <= MAX_BATCH_SIZE else f"a whole number from 1 to {MAX_BATCH_SIZE:,}"


def _shape(value: Any) -> str | None:
    fine = value is None or (isinstance(value, list) and value and all(_is_int(n) and n > 0 for n in value))
    return None if fine else "a list of positive whole numbers or null"


def _bytes(value: Any) -> str | None:
    return None if _is_int(value) and value >= 0 else "a whole number of bytes"


def _one_of(names: Sequence[str]) -> Check:
    return lambda value: None if isinstance(value, str) and value in names else f"one of {', '.join(names)}"


def _groups(value: Any) -> str | None:
    fine = isinstance(value, list) and value and all(
        isinstance(g, list) and g and all(isinstance(u, str) for u in g) for g in value)
    return None if fine else "a non-empty list of non-empty lists of unit ids"


#: The fields of a schedule file, of its end-to-end check, its blocks and their stages: (check, required).
_FIELDS: dict[str, tuple[Check, bool]] = {
    "model": (_text, True), "graph_fingerprint": (_text, True), "input_shape": (_shape, False),
    "device": (_text, True), "device_fingerprint": (_text, False), "device_info": (_mapping, False),
    "batch": (_batch, True), "dtype": (_one_of(DTYPE_NAMES), False),
    "memory_format": (_one_of(tuple(MEMORY_FORMAT_TORCH_NAMES)), False), "kernels": (_one_of(KERNEL_NAMES), False),
    "source": (_one_of(SOURCES), False),
    "params": (_mapping, False), "predicted_latency_ms": (_ms_or_null, False),
}
_END_TO_END_FIELDS: dict[str, tuple[Check, bool]] = {
    "rounds": (lambda v: None if _is_int(v) and v > 0 else "a whole number above 0", True),
    "dp_ms": (_ms, True), "sequential_ms": (_ms, True), "dp_predicted_ms": (_ms_or_null, False),
    "sequential_predicted_ms": (_ms_or_null, False), "kept": (_one_of(tuple(CANDIDATES)), False),
    "ratio": (_ratio_or_null, False), "ratio_low": (_ratio_or_null, False), "ratio_high": (_ratio_or_null, False),
    "confidence": (_confidence, False), "decision": (_text, False),
}
_CANDIDATE_FIELDS: dict[str, tuple[Check, bool]] = {
    "name": (_one_of(tuple(CANDIDATES)), True), "ms": (_ms, True),
    "rounds": (lambda v: None if _is_int(v) and v > 0 else "a whole number above 0", True),
    "predicted_ms": (_ms_or_null, False), "corrected_ms": (_ms_or_null, False), "ratio": (_ratio_or_null, False),
    "ratio_low": (_ratio_or_null, False), "ratio_high": (_ratio_or_null, False),
}
_MEMORY_FIELDS: dict[str, tuple[Check, bool]] = {
    "peak_bytes": (_bytes, True), "sequential_peak_bytes": (_bytes, True),
    "budget_bytes": (lambda v: None if v is None or _bytes(v) is None else "a whole number of bytes or null", False),
}
_BLOCK_FIELDS: dict[str, tuple[Check, bool]] = {
    "block": (lambda v: None if _is_int(v) and v >= 0 else "a whole number from 0", True),
    "latency_ms": (_ms_or_null, False),
    "stages": (lambda v: None if isinstance(v, list) else "a list", True),
}
_STAGE_FIELDS: dict[str, tuple[Check, bool]] = {
    "strategy": (_one_of(STRATEGIES), True), "groups": (_groups, True), "latency_ms": (_ms_or_null, False),
}


def schedule_defects(data: Any) -> list[str]:
    """Every field of a schedule's JSON form that is missing, of the wrong type or out of range, one phrase each
    (``batch is '1', not a whole number from 1 to ...``); empty where the form is sound."""
    if not isinstance(data, dict) or data.get("format") != SCHEDULE_FORMAT:
        shown = _shown(data.get("format")) if isinstance(data, dict) else "missing"
        return [f"format is {shown}, not \"{SCHEDULE_FORMAT}\": it is not an ios-ray schedule"]
    if data.get("version") != SCHEDULE_VERSION:
        return [f"it is of schedule format version {data.get('version')}, and this ios-ray reads {SCHEDULE_VERSION}"]
    defects = _field_defects(data, _FIELDS, "")
    memory = data.get("memory")
    if memory is not None:
        defects += ["memory is not an object or null"] if not isinstance(memory, dict) else \
            _field_defects(memory, _MEMORY_FIELDS, "memory.")
    check = data.get("end_to_end")
    if check is not None:
        defects += ["end_to_end is not an object or null"] if not isinstance(check, dict) else \
            _field_defects(check, _END_TO_END_FIELDS, "end_to_end.") + _interval_defects(check) + \
            _candidate_defects(check.get("candidates", []))
    blocks = data.get("blocks")
    if not isinstance(blocks, list):
        return defects + [f"blocks is {_shown(blocks)}, not a list"]
    for b, block in enumerate(blocks):
        if not isinstance(block, dict):
            defects.append(f"blocks[{b}] is {_shown(block)}, not an object")
            continue
        defects += _field_defects(block, _BLOCK_FIELDS, f"blocks[{b}].")
        stages = block.get("stages")
        for i, stage in enumerate(stages if isinstance(stages, list) else ()):
            where = f"blocks[{b}].stages[{i}]"
            defects += _field_defects(stage, _STAGE_FIELDS, f"{where}.") if isinstance(stage, dict) else \
                [f"{where} is {_shown(stage)}, not an object"]
    return defects


def _candidate_defects(candidates: Any) -> list[str]:
    """The defects of an end-to-end check's candidates (a list of objects)."""
    if not isinstance(candidates, list):
        return [f"end_to_end.candidates is {_shown(candidates)}, not a list"]
    defects = []
    for i, candidate in enumerate(candidates):
        where = f"end_to_end.candidates[{i}]"
        defects += _field_defects(candidate, _CANDIDATE_FIELDS, f"{where}.") if isinstance(candidate, dict) else \
            [f"{where} is {_shown(candidate)}, not an object"]
    return defects


def _interval_defects(check: Mapping[str, Any]) -> list[str]:
    """The defects of a paired check's ratio and interval taken together (each field alone is checked apart)."""
    ratio, low, high = (check.get(k) for k in ("ratio", "ratio_low", "ratio_high"))
    if any(_ratio_or_null(v) is not None for v in (ratio, low, high)):
        return []
    if ratio is None:
        return [] if low is None and high is None else ["end_to_end.ratio_low and ratio_high are set without a ratio"]
    if "confidence" not in check:
        return ["end_to_end.confidence is missing (a check with a ratio has one)"]
    if (low is None) != (high is None):
        return ["end_to_end.ratio_low and ratio_high are not both numbers or both null"]
    if low is not None and not low <= ratio <= high:
        return [f"end_to_end's interval {_shown(low)}-{_shown(high)} does not hold its ratio {_shown(ratio)}"]
    return []


def _field_defects(data: Mapping[str, Any], fields: Mapping[str, tuple[Check, bool]], where: str) -> list[str]:
    """The defects of one JSON object's fields, each named by its path."""
    defects = []
    for name, (check, required) in fields.items():
        if name not in data:
            if required:
                defects.append(f"{where}{name} is missing")
            continue
        wanted = check(data[name])
        if wanted is not None:
            defects.append(f"{where}{name} is {_shown(data[name])}, not {wanted}")
    return defects


def _shown(value: Any) -> str:
    """A JSON value as a message shows it (cut short where long)."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def schedule_from_json(data: Mapping[str, Any]) -> Schedule:
    """Parse the JSON form; raises ValueError listing the defects (:func:`schedule_defects`) of a malformed one."""
    defects = schedule_defects(data)
    if defects:
        raise ValueError("; ".join(defects))
    blocks = tuple(
        BlockSchedule(
            block=b["block"],
            stages=tuple(Stage.from_json(s) for s in b["stages"]),
            latencies=tuple(None if s.get("latency_ms") is None else float(s["latency_ms"]) for s in b["stages"]),
        )
        for b in data["blocks"]
    )
    return Schedule(
        model=data["model"],
        graph_fingerprint=data["graph_fingerprint"],
        device=data["device"],
        batch=data["batch"],
        blocks=blocks,
        dtype=data.get("dtype", DEFAULT_DTYPE),
        device_fingerprint=data.get("device_fingerprint", ""),
        device_info=dict(data.get("device_info", {})),
        params=dict(data.get("params", {})),
        source=data.get("source", "measured"),
        end_to_end=_end_to_end(data.get("end_to_end")),
        input_shape=tuple(data["input_shape"]) if data.get("input_shape") is not None else None,
        memory_format=data.get("memory_format", DEFAULT_MEMORY_FORMAT),
        memory=_memory(data.get("memory")),
        kernels=data.get("kernels", EAGER_KERNELS),
    )


def _memory(data: Mapping[str, Any] | None) -> PeakMemory | None:
    """The peak memory recorded in a schedule file, where it has one (files before it have none)."""
    if data is None:
        return None
    return PeakMemory(data["peak_bytes"], data["sequential_peak_bytes"], data.get("budget_bytes"))


def _end_to_end(data: Mapping[str, Any] | None) -> EndToEnd | None:
    """The end-to-end check of a schedule file, where it has one (its ratio where the check was paired)."""
    if data is None:
        return None
    dp_predicted, sequential_predicted = (None if data.get(k) is None else float(data[k])
                                          for k in ("dp_predicted_ms", "sequential_predicted_ms"))
    rounds = int(data["rounds"])
    ratio = _ratio(data, float(data["confidence"]), rounds) if data.get("ratio") is not None else None
    candidates = tuple(CandidateRun(c["name"], float(c["ms"]), int(c["rounds"]), c.get("predicted_ms"),
                                    c.get("corrected_ms"), _ratio(c, float(data["confidence"]), int(c["rounds"]))
                                    if c.get("ratio") is not None else None) for c in data.get("candidates", ()))
    return EndToEnd(rounds, float(data["dp_ms"]), float(data["sequential_ms"]), dp_predicted, sequential_predicted,
                    ratio, candidates, data.get("kept") if candidates else None)


def _ratio(data: Mapping[str, Any], confidence: float, rounds: int) -> RatioInterval:
    """A ratio and its interval as a file holds them (``ratio``, ``ratio_low``, ``ratio_high``)."""
    low, high = (None if data.get(k) is None else float(data[k]) for k in ("ratio_low", "ratio_high"))
    return RatioInterval(float(data["ratio"]), low, high, confidence, rounds)


def schedule_path(
    out: Path, model: str, device: str, batch: int, dtype: str = DEFAULT_DTYPE,
    memory_format: str = DEFAULT_MEMORY_FORMAT,
) -> Path:
    """Where a schedule is written: ``OUT/<model>/<device>/bs<batch>.json``, with ``-<dtype>`` after the batch for a
    dtype other than float32 and ``-channels_last`` for that memory format (``bs8-float16-channels_last.json``); the
    model and device spelt as folder names (:func:`folder_name`: ``sim:v100`` is ``sim-v100``)."""
    suffix = "".join(f"-{setting}" for setting in settings_named(dtype, memory_format))
    return Path(out) / folder_name(model) / folder_name(device) / f"bs{batch}{suffix}.json"


def folder_name(name: str) -> str:
    """A model name or device label as a folder name any file system and shell takes as it is: ``:`` becomes
    ``-`` (``sim:v100`` is ``sim-v100``, ``mynet:build`` is ``mynet-build``), and every other character but letters,
    digits, ``_``, ``.``, ``@`` and ``+`` (``-`` and ``/`` among them, and a leading ``.``) becomes ``%XX`` per byte
    of its UTF-8 (``ultralytics:yolo11n-seg`` is ``ultralytics-yolo11n%2Dseg``). So it reads back: ``-`` to ``:``,
    then each ``%XX`` (``urllib.parse.unquote``). Folders written before this spelling (``sim:v100``) are read as any
    others: readers take every ``*.json`` under a folder, and each file names its model and device itself."""
    escaped = re.sub(r"[^A-Za-z0-9_.:@+]|^\.", lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), name)
    return escaped.replace(":", "-")


def save_schedule(schedule: Schedule, path: Path) -> None:
    """Write a schedule as JSON (parent folders are created; the write is atomic: the file is written whole under a
    name of this write's own beside it, then renamed, so writers of one file at once never share a half-written
    file and a reader sees one whole schedule or the other)."""
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                         delete=False) as file:
            tmp = Path(file.name)
            file.write(json.dumps(schedule.to_json(), indent=1))
        tmp.replace(path)
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write the schedule {path} ({exc.strerror or exc}); pass another out folder.") from None


def read_schedule(path: Path) -> Schedule:
    """Read a schedule file; a missing, unreadable, foreign or malformed one (any field of the wrong type or out of
    range) raises UserError naming every defect."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"no schedule file at {path}.") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is not a valid ios-ray schedule (not readable JSON: {exc}).") from None
    except RecursionError:
        raise UserError(f"{path} is not a valid ios-ray schedule (its JSON is nested too deeply to read).") from None
    defects = schedule_defects(data)
    if defects:
        raise UserError(f"{path} is not a valid ios-ray schedule ({'; '.join(defects)}); correct the file or write it "
                        "again with ios-ray search.")
    return schedule_from_json(data)


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
    for merged in schedule.stages:
        if merged.strategy == "merge" and any(len(group) != 1 for group in merged.groups):
            raise UserError(f"{where} has a merge stage {[list(g) for g in merged.groups]} with more than one unit in "
                            "a group; a merge stage runs one conv per group.")
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
