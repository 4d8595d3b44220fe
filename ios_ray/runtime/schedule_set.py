"""The schedules a deployed model carries: reading them from files, and choosing one per device and batch size.

Device rule: a ``cpu`` schedule runs on CPU tensors; on CUDA tensors every GPU label is accepted (``cuda``,
``cuda:<i>``, a GPU name such as ``v100`` or ``h100``, and ``sim:<gpu>``, which is meant for that GPU), best
first: the GPU's own name, then ``cuda``/``cuda:<i>``, then ``sim:`` of the GPU, then other GPU names, then
other ``sim:`` GPUs; asked to (``any_device``), where no label fits, every schedule, as a correctness check of
schedules made for another device (a ``sim:`` plan on the CPU, say). Dtype rule, among the schedules of the best
device rank: those made for the input's dtype, else (none is) all of them: a schedule made for another dtype still
computes the model, only tuned for other kernels. Batch rule, among those: the input's batch size if scheduled,
else the smallest scheduled batch above it, else the largest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from ios_ray.devices import DeviceSpec, parse_device
from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.schedule import Schedule, read_schedule
from ios_ray.vocabulary import spelt_shape

#: Ranks of labels on a CUDA tensor by (label kind, whether the label names this very GPU).
_CUDA_RANKS = {("gpu", True): 0, ("cuda", False): 1, ("sim", True): 2, ("gpu", False): 3, ("sim", False): 4}


def read_schedules(path: Path | str) -> dict[str, Schedule]:
    """A schedule file, or every ``*.json`` under a folder (e.g. ``DIR/<model>/<device>/bs<batch>.json``), by file."""
    path = Path(path)
    if path.is_file():
        return {str(path): read_schedule(path)}
    if not path.is_dir():
        raise UserError(f"no schedule file or folder at {path}; pass a schedule file or the folder a search wrote its schedules to.")
    files = sorted(path.rglob("*.json"))
    if not files:
        raise UserError(f"no schedule files (*.json) under {path}; write some there with a search (out={path}).")
    return {str(f): read_schedule(f) for f in files}


def device_rank(label: str, device_type: str, gpu_name: str | None = None) -> int | None:
    """How well a schedule's device label fits a torch device type (lower is better), or None if it does not."""
    spec = parse_device(label)
    if device_type == "cpu":
        return 0 if spec.kind == "cpu" else None
    if device_type != "cuda" or spec.kind == "cpu":
        return None
    return _CUDA_RANKS[(spec.kind, _same_gpu(spec, gpu_name))]


def pick_batch(batches: Iterable[int], batch: int) -> int:
    """``batch`` if scheduled, else the smallest scheduled batch above it, else the largest scheduled batch."""
    scheduled = sorted(set(batches))
    if not scheduled:
        raise ValueError("no scheduled batch sizes to pick from")
    return next((b for b in scheduled if b >= batch), scheduled[-1])


def select_schedule(
    schedules: Sequence[Schedule], device_type: str, batch: int, gpu_name: str | None = None,
    dtype: str | None = None, any_device: bool = False,
) -> Schedule | None:
    """The schedule to run a batch (of ``dtype``, where given) on a device by the rules above, or None where no
    schedule fits the device (and ``any_device`` is false)."""
    ranked = [(device_rank(s.device, device_type, gpu_name), s) for s in schedules]
    fitting = [(rank, s) for rank, s in ranked if rank is not None]
    if not fitting and any_device:
        fitting = [(0, s) for s in schedules]
    if not fitting:
        return None
    best = min(rank for rank, _ in fitting)
    candidates = [s for rank, s in fitting if rank == best]
    candidates = [s for s in candidates if s.dtype == dtype] or candidates
    chosen = pick_batch((s.batch for s in candidates), batch)
    return next(s for s in candidates if s.batch == chosen)


def _same_gpu(spec: DeviceSpec, gpu_name: str | None) -> bool:
    """Whether a GPU or sim label names the GPU called ``gpu_name`` (False for ``cuda`` labels)."""
    model = spec.gpu_model
    return model is not None and gpu_name is not None and model.matches(gpu_name)


def why_none_fit(found: Iterable[Schedule], graph: Graph) -> str:
    """Why schedules made for a model may not fit its graph, where they differ from it in memory format or all in
    input shape: in parentheses, with what to do, for the end of a sentence; else nothing."""
    found = list(found)
    layouts = sorted({s.memory_format for s in found} - {graph.memory_format})
    if layouts:
        return (f" (those there are for models in {' and '.join(layouts)} memory format, and this one is "
                f"{graph.memory_format}: convert it, as model.to(memory_format=torch.channels_last) does, or search "
                "it as it is)")
    shapes = other_input_shapes(found, graph)
    if shapes:
        made = " and ".join(spelt_shape(s) for s in shapes)
        return (f" (those there were made for inputs of shape {made}, and this one is imported at "
                f"{spelt_shape(graph.input_shape)}: pass the shape it was searched at, --input-shape on the command "
                "line, input_shape= in Python)")
    return ""


def other_input_shapes(found: Iterable[Schedule], graph: Graph) -> list[tuple[int, ...]]:
    """The input shapes the schedules record, where none is the graph's (they were all made at other shapes); else
    none."""
    shapes = sorted({tuple(s.input_shape) for s in found if s.input_shape is not None})
    return [] if tuple(graph.input_shape) in shapes else shapes
