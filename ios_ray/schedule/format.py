"""The schedule file's format: every key of every object in it listed once (:data:`SCHEDULE_FIELDS` and the records
of the objects inside), from which writing (:func:`write_record`), checking (:func:`record_defects`) and reading
(:func:`read_record`) all follow, as torch.export derives its serialized schema from its dataclasses.

A file is JSON with ``format`` ``ios-ray-schedule`` and a ``version`` that changes when its fields do. Version 2
names the fields files gained while version 1 stood (``added=2``: ``input_shape``, ``memory_format``, ``kernels``,
``end_to_end``, ``memory``); a version-1 file is read as version 2 with each of those it lacks filled with what
version 1 meant (:func:`upgraded`). A file of another version is refused in one sentence.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeGuard

from ios_ray.paired import CompiledAhead, RatioInterval, valid_confidence
from ios_ray.schedule.records import (CANDIDATES, MEMORY_FORMAT_TORCH_NAMES, BlockSchedule, CandidateRun, EndToEnd,
                                      ModelAsIs, PeakMemory)
from ios_ray.stage import Stage
from ios_ray.vocabulary import (DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, DTYPE_NAMES, EAGER_KERNELS, KERNEL_NAMES,
                                MAX_BATCH_SIZE, SOURCES, STRATEGIES)

#: A field's check: None where the value is fine, else what it should be.
Check = Callable[[Any], "str | None"]

#: What a field's getter returns for a key the file leaves out (a check without a ratio has no ``ratio_low``).
ABSENT = object()

SCHEDULE_FORMAT = "ios-ray-schedule"
SCHEDULE_VERSION = 2


@dataclass(frozen=True)
class Field:
    """One key of an object in the file: its check; whether a file must hold it, else what it means where absent
    (``default``); the version that added it; how the value is taken from the object written (``get``; default: the
    attribute of its name) and how it is read back (``load``; ``read=False``: written for readers, such as a total,
    and not read); and for an object or list of objects (``many``), their own :class:`Record`."""

    key: str
    check: Check
    required: bool = False
    default: Any = None
    added: int = 1
    get: Callable[[Any], Any] | None = None
    load: Callable[[Any], Any] | None = None
    read: bool = True
    record: Record | None = None
    many: bool = False


@dataclass(frozen=True)
class Record:
    """One kind of object in the file: its fields in the order written; ``build`` makes the object of the values
    read (by key) and the enclosing object's JSON; ``rules`` names the defects of fields taken together."""

    fields: tuple[Field, ...]
    build: Callable[[dict[str, Any], Mapping[str, Any]], Any]
    rules: Callable[[Mapping[str, Any], str], list[str]] = lambda data, where: []


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _ms(value: Any) -> str | None:
    return None if _is_number(value) and value >= 0 else "a number of milliseconds"


def _ms_or_null(value: Any) -> str | None:
    return None if value is None or _ms(value) is None else "a number of milliseconds or null"


def _ratio_or_null(value: Any) -> str | None:
    return None if value is None or (_is_number(value) and value > 0) else "a positive number or null"


def _confidence(value: Any) -> str | None:
    return None if _is_number(value) and valid_confidence(value) else "a number from 0.5 to below 1"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _mapping(value: Any) -> str | None:
    return None if isinstance(value, dict) else "an object"


def _object_or_null(value: Any) -> str | None:
    return None if value is None or isinstance(value, dict) else "an object or null"


def _list(value: Any) -> str | None:
    return None if isinstance(value, list) else "a list"


def _batch(value: Any) -> str | None:
    return None if _is_int(value) and 0 < value <= MAX_BATCH_SIZE else f"a whole number from 1 to {MAX_BATCH_SIZE:,}"


def _rounds(value: Any) -> str | None:
    return None if _is_int(value) and value > 0 else "a whole number above 0"


def _index(value: Any) -> str | None:
    return None if _is_int(value) and value >= 0 else "a whole number from 0"


def _shape(value: Any) -> str | None:
    fine = value is None or (isinstance(value, list) and value and all(_is_int(n) and n > 0 for n in value))
    return None if fine else "a list of positive whole numbers or null"


def _bytes(value: Any) -> str | None:
    return None if _is_int(value) and value >= 0 else "a whole number of bytes"


def _bytes_or_null(value: Any) -> str | None:
    return None if value is None or _bytes(value) is None else "a whole number of bytes or null"


def _one_of(names: Sequence[str]) -> Check:
    return lambda value: None if isinstance(value, str) and value in names else f"one of {', '.join(names)}"


def _groups(value: Any) -> str | None:
    fine = isinstance(value, list) and value and all(
        isinstance(g, list) and g and all(isinstance(u, str) for u in g) for g in value)
    return None if fine else "a non-empty list of non-empty lists of unit ids"


def _candidate_names(value: Any) -> str | None:
    fine = isinstance(value, list) and all(isinstance(name, str) and name in CANDIDATES for name in value)
    return None if fine else f"a list of names from {', '.join(CANDIDATES)}"


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _of_ratio(part: str) -> Callable[[Any], Any]:
    """The getter of one part of an object's ``ratio`` interval, left out where it has none."""
    return lambda found: ABSENT if found.ratio is None else getattr(found.ratio, part)


def _interval_fields(confidence: bool) -> tuple[Field, ...]:
    """The keys a ratio over sequential and its interval are written as (and the check's ``confidence``)."""
    parts = {"ratio": "median", "ratio_low": "low", "ratio_high": "high"}
    found = tuple(Field(key, _ratio_or_null, get=_of_ratio(part), load=_float_or_none) for key, part in parts.items())
    return found + ((Field("confidence", _confidence, get=_of_ratio("confidence"), load=float),) if confidence else ())


def _interval(values: Mapping[str, Any], confidence: Any, rounds: int) -> RatioInterval | None:
    """A ratio and its interval as read (None where the file has no ratio)."""
    if values["ratio"] is None:
        return None
    return RatioInterval(values["ratio"], values["ratio_low"], values["ratio_high"], float(confidence), rounds)


def _interval_defects(check: Mapping[str, Any], where: str) -> list[str]:
    """The defects of a paired check's ratio and interval taken together, and of its confidence, which its ratio and
    its candidates' share (each field alone is checked apart)."""
    ratio, low, high = (check.get(k) for k in ("ratio", "ratio_low", "ratio_high"))
    if any(_ratio_or_null(v) is not None for v in (ratio, low, high)):
        return []
    candidates = check.get("candidates")
    timed = isinstance(candidates, list) and any(isinstance(c, dict) and c.get("ratio") is not None for c in candidates)
    if (ratio is not None or timed) and "confidence" not in check:
        return [f"{where}confidence is missing (a check with a ratio has one)"]
    if ratio is None:
        return [] if low is None and high is None else [f"{where}ratio_low and ratio_high are set without a ratio"]
    if (low is None) != (high is None):
        return [f"{where}ratio_low and ratio_high are not both numbers or both null"]
    if low is not None and not low <= ratio <= high:
        return [f"{where[:-1]}'s interval {_shown(low)}-{_shown(high)} does not hold its ratio {_shown(ratio)}"]
    return []


_MS: dict[str, Any] = {"check": _ms, "required": True, "load": float}
_MS_OR_NULL: dict[str, Any] = {"check": _ms_or_null, "load": _float_or_none}

#: A stage of a block, written with its latency: a (stage, latency) pair.
STAGE = Record((
    Field("strategy", _one_of(STRATEGIES), required=True, get=lambda pair: pair[0].strategy),
    Field("groups", _groups, required=True, get=lambda pair: [list(g) for g in pair[0].groups],
          load=lambda groups: tuple(tuple(g) for g in groups)),
    Field("latency_ms", **_MS_OR_NULL, get=lambda pair: pair[1]),
), build=lambda v, _: (Stage(v["strategy"], v["groups"]), v["latency_ms"]))

BLOCK = Record((
    Field("block", _index, required=True),
    Field("latency_ms", _ms_or_null, get=lambda b: b.latency, read=False),
    Field("stages", _list, required=True, record=STAGE, many=True,
          get=lambda b: tuple(zip(b.stages, b.latencies or (None,) * len(b.stages)))),
), build=lambda v, _: BlockSchedule(v["block"], tuple(s for s, _ in v["stages"]), tuple(x for _, x in v["stages"])))

CANDIDATE = Record((
    Field("name", _one_of(tuple(CANDIDATES)), required=True),
    Field("ms", **_MS),
    Field("rounds", _rounds, required=True),
    Field("predicted_ms", **_MS_OR_NULL),
    Field("corrected_ms", **_MS_OR_NULL),
    *_interval_fields(confidence=False),
), build=lambda v, check: CandidateRun(v["name"], v["ms"], v["rounds"], v["predicted_ms"], v["corrected_ms"],
                                       _interval(v, check.get("confidence"), v["rounds"])))


def _model_as_is(values: Mapping[str, Any]) -> ModelAsIs | None:
    """The model as is as read (None where the file has no ratio for it)."""
    ratio = _interval(values, values["confidence"], values["rounds"])
    return None if ratio is None else ModelAsIs(values["ms"], values["rounds"], ratio)


AS_IS = Record((
    Field("ms", **_MS),
    Field("rounds", _rounds, required=True),
    *_interval_fields(confidence=True),
), build=lambda v, _: _model_as_is(v), rules=_interval_defects)

def _count(value: Any) -> str | None:
    return None if _is_int(value) and value >= 0 else "a whole number from 0"


def _seconds(value: Any) -> str | None:
    return None if _is_number(value) and value >= 0 else "a number of seconds"


COMPILED = Record((
    Field("workers", _count, required=True),
    Field("regions", _count, required=True),
    Field("by_workers", _count, required=True),
    Field("left", _count, required=True),
    Field("seconds", _seconds, required=True, load=float),
    Field("missed", _count, default=0),
), build=lambda v, _: CompiledAhead(**v))

END_TO_END = Record((
    Field("rounds", _rounds, required=True),
    Field("dp_ms", **_MS),
    Field("sequential_ms", **_MS),
    Field("dp_predicted_ms", **_MS_OR_NULL),
    Field("sequential_predicted_ms", **_MS_OR_NULL),
    *_interval_fields(confidence=True),
    Field("candidates", _list, default=(), record=CANDIDATE, many=True,
          get=lambda check: check.candidates or ABSENT),
    Field("kept", _one_of(tuple(CANDIDATES))),
    Field("decision", _text, read=False),
    Field("as_is", _object_or_null, record=AS_IS, get=lambda check: ABSENT if check.as_is is None else check.as_is),
    Field("left_out", _candidate_names, default=(), get=lambda check: list(check.left_out) or ABSENT, load=tuple),
    Field("compiled", _object_or_null, record=COMPILED,
          get=lambda check: ABSENT if check.compiled is None else check.compiled),
), build=lambda v, _: EndToEnd(v["rounds"], v["dp_ms"], v["sequential_ms"], v["dp_predicted_ms"],
                               v["sequential_predicted_ms"], _interval(v, v["confidence"], v["rounds"]),
                               v["candidates"], v["kept"] if v["candidates"] else None, v["as_is"], v["left_out"],
                               v["compiled"]),
    rules=_interval_defects)

MEMORY = Record((
    Field("peak_bytes", _bytes, required=True),
    Field("sequential_peak_bytes", _bytes, required=True),
    Field("budget_bytes", _bytes_or_null),
), build=lambda v, _: PeakMemory(**v))


#: The fields of the whole file, after its ``format`` and ``version``.
SCHEDULE_FIELDS = (
    Field("model", _text, required=True),
    Field("graph_fingerprint", _text, required=True),
    Field("input_shape", _shape, added=2, get=lambda s: None if s.input_shape is None else list(s.input_shape),
          load=tuple),
    Field("device", _text, required=True),
    Field("device_fingerprint", _text, default=""),
    Field("device_info", _mapping, default={}, get=lambda s: dict(s.device_info), load=dict),
    Field("batch", _batch, required=True),
    Field("dtype", _one_of(DTYPE_NAMES), default=DEFAULT_DTYPE),
    Field("memory_format", _one_of(tuple(MEMORY_FORMAT_TORCH_NAMES)), default=DEFAULT_MEMORY_FORMAT, added=2),
    Field("kernels", _one_of(KERNEL_NAMES), default=EAGER_KERNELS, added=2),
    Field("source", _one_of(SOURCES), default="measured"),
    Field("params", _mapping, default={}, get=lambda s: dict(s.params), load=dict),
    Field("predicted_latency_ms", _ms_or_null, get=lambda s: s.predicted_latency, read=False),
    Field("end_to_end", _object_or_null, added=2, record=END_TO_END),
    Field("memory", _object_or_null, added=2, record=MEMORY, get=lambda s: ABSENT if s.memory is None else s.memory),
    Field("blocks", _list, required=True, record=BLOCK, many=True),
)


def envelope_defects(data: Any) -> list[str]:
    """What makes JSON no schedule file this ios-ray reads: another ``format``, or a ``version`` it does not know
    (one phrase; empty where both are fine)."""
    if not isinstance(data, dict) or data.get("format") != SCHEDULE_FORMAT:
        shown = _shown(data.get("format")) if isinstance(data, dict) else "missing"
        return [f"format is {shown}, not \"{SCHEDULE_FORMAT}\": it is not an ios-ray schedule"]
    version = data.get("version")
    if not _is_int(version) or not 1 <= version <= SCHEDULE_VERSION:
        return [f"it is of schedule format version {_shown(version)}, and this ios-ray reads versions 1 to "
                f"{SCHEDULE_VERSION}"]
    return []


def upgraded(data: Mapping[str, Any]) -> dict[str, Any]:
    """A file's JSON form as this version reads it: each field added since the file's version that it lacks, filled
    with what its version meant (the field's default: no input shape, contiguous, eager kernels, no check, no peak)."""
    missing = {f.key: f.default for f in SCHEDULE_FIELDS if f.added > data["version"] and f.key not in data}
    return {**data, **missing, "version": SCHEDULE_VERSION}


def write_record(record: Record, found: Any) -> dict[str, Any]:
    """One object's JSON form, its fields in the record's order (those whose getter says ABSENT left out)."""
    written = {}
    for f in record.fields:
        value = f.get(found) if f.get is not None else getattr(found, f.key)
        if value is ABSENT:
            continue
        if f.record is not None and value is not None:
            value = [write_record(f.record, v) for v in value] if f.many else write_record(f.record, value)
        written[f.key] = value
    return written


def read_record(record: Record, data: Mapping[str, Any], outer: Mapping[str, Any]) -> Any:
    """One object read from its checked JSON form (``outer``: the JSON of the object that holds it)."""
    values = {}
    for f in (f for f in record.fields if f.read):
        value = data.get(f.key, f.default)
        if f.record is not None and value is not None:
            value = tuple(read_record(f.record, v, data) for v in value) if f.many else read_record(f.record, value, data)
        values[f.key] = f.load(value) if f.load is not None and value is not None else value
    return record.build(values, outer)


def record_defects(record: Record, data: Mapping[str, Any], where: str) -> list[str]:
    """The defects of one JSON object and the objects it holds, each named by its path."""
    defects = []
    for f in record.fields:
        if f.key not in data:
            defects += [f"{where}{f.key} is missing"] if f.required else []
            continue
        wanted = f.check(data[f.key])
        if wanted is not None:
            defects.append(f"{where}{f.key} is {_shown(data[f.key])}, not {wanted}")
        elif f.record is not None and data[f.key] is not None:
            items = enumerate(data[f.key]) if f.many else [(None, data[f.key])]
            for i, item in items:
                at = f"{where}{f.key}" if i is None else f"{where}{f.key}[{i}]"
                defects += record_defects(f.record, item, f"{at}.") if isinstance(item, dict) else \
                    [f"{at} is {_shown(item)}, not an object"]
    return defects + record.rules(data, where)


def _shown(value: Any) -> str:
    """A JSON value as a message shows it (cut short where long)."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
