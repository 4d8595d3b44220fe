"""Schedule files on disk: where a search writes each (:func:`schedule_path`), writing one whole
(:func:`save_schedule`), reading one with every field checked (:func:`read_schedule`: a malformed file is refused
in one sentence naming each defect), and checking one against the graph it is loaded for (:func:`load_schedule`).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.schedule.graph_schedule import Schedule, schedule_defects, schedule_from_json, schedule_to_json
from ios_ray.schedule.records import MEMORY_FORMAT_TORCH_NAMES
from ios_ray.vocabulary import DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, numerics_named


def schedule_path(
    out: Path, model: str, device: str, batch: int, dtype: str = DEFAULT_DTYPE,
    memory_format: str = DEFAULT_MEMORY_FORMAT,
) -> Path:
    """Where a schedule is written: ``OUT/<model>/<device>/bs<batch>.json``, with ``-<dtype>`` after the batch for a
    dtype other than float32 and ``-channels_last`` for that memory format (``bs8-float16-channels_last.json``); the
    model and device spelt as folder names (:func:`folder_name`: ``sim:v100`` is ``sim-v100``)."""
    suffix = "".join(f"-{name}" for name in numerics_named(dtype, memory_format))
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
            file.write(json.dumps(schedule_to_json(schedule), indent=1))
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
