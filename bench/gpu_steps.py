"""The in-process steps of bench/gpu_check.py, each run by it in a fresh process; each writes one JSON file.

    python bench/gpu_steps.py env --device cuda --out env.json
    python bench/gpu_steps.py calibrate --device cuda --model inception_v3 --batches 1,32 --sample 24 --out cal.json
    python bench/gpu_steps.py profile --device cuda --model inception_v3 --batch 1 --store S --schedules DIR \\
        --calls 20 --out profile.json --text profile.txt

* ``env``: the device, driver and software versions, the CPU, the date.
* ``calibrate``: what measuring one candidate stage costs on this device, so a search can be sized to a time
  budget: a sample of the model's planned stages is measured through the profiler's own backend, as an actor
  measures a batch, with two protocols (at most 4 and 12 replays), giving a fixed cost per stage and a cost per
  replay; on a GPU also the per-stage
  time with 1, 2, 4 and 8 copies per graph and uncaptured (eager), which shows how much a replay's start-up and the
  host's launches weigh.
* ``profile``: the DP's schedule (recomputed from the store, so it is there even where the search kept sequential)
  and the sequential schedule, each run as deployed (with the search's kernels, or ``--kernels``: ``inductor``
  compiles its regions at the first call, whose seconds are reported), under the PyTorch profiler: a key_averages
  table per schedule and, per forward, the kernels launched, how many of them are cuDNN's layout transposes, and
  the device time they sum to.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ios_ray.app.cli.util import store_lookup
from ios_ray.app.cli.evaluation import predicted_ms
from ios_ray.devices import parse_device
from ios_ray.frontend import import_model
from ios_ray.ir import Graph
from ios_ray.models import resolve_model
from ios_ray.profiler.fingerprint import cpu_info, gpu_info
from ios_ray.profiler.jobs import MeasureJob, ModelSource
from ios_ray.profiler.real import RealBackend, random_inputs
from ios_ray.dtypes import in_memory_format, torch_dtype
from ios_ray.runtime import Program, Programs, ScheduleRunner, compile_stage, make_lanes, measure_latency
from ios_ray.runtime.cuda_graph import CaptureError
from ios_ray.runtime.timing import graph_samples_ms
from ios_ray.runtime.timing import samples_ms
from ios_ray.schedule import Schedule, read_schedule, schedule_path
from ios_ray.scheduler import (LazySpace, PlannedStage, SearchParams, TableLatency, baseline_schedule, optimize_graph,
                               plan_graph)
from ios_ray.stage import StageKeys
from ios_ray.store import LatencyStore
from ios_ray.vocabulary import KERNEL_NAMES

#: The two (warmup, repeat) protocols a calibration measures each sampled stage with: 4 and 12 replays.
PROTOCOLS = ((1, 3), (1, 11))
#: Copies per graph compared on a GPU, and how many sampled stages that comparison uses.
COPIES = (1, 2, 4, 8)
COPIES_STAGES = 8


def environment(device: str) -> dict[str, Any]:
    """Date, host, Python and package versions, the CPU, and on a GPU its model, driver and CUDA/cuDNN versions."""
    packages = {}
    for name in ("torch", "ray", "duckdb", "triton", "numpy"):
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    found: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "host": socket.gethostname(),
        "python": platform.python_version(), "packages": packages,
        "cpu": {**cpu_info(), "cores": os.cpu_count()},
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        found["gpu"] = {**gpu_info(0), "memory_gib": round(props.total_memory / 2**30, 1), "nvidia_smi": _smi_line()}
    return found


def _smi_line() -> str | None:
    """One read-only nvidia-smi query (clocks, power limit, temperature), as it prints it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = "name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu,persistence_mode"
    try:
        done = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.SubprocessError):  # a hung or broken nvidia-smi costs this line only
        return None
    return done.stdout.strip() or done.stderr.strip() or None


def calibrate(device: str, model: str, batches: list[int], sample: int) -> dict[str, Any]:
    """Per batch: the fixed and per-replay cost of measuring one planned stage of ``model`` on ``device``; and how
    many stages a lazy search measures, about (:func:`lazy_stages`)."""
    graph = import_model(model).graph
    space = LazySpace.build(graph, SearchParams())
    plan = space.plan
    ordered = sorted(plan.stages)
    chosen = [plan.stages[k] for k in ordered[:: max(1, len(ordered) // sample)][:sample]]
    backend = RealBackend(parse_device(device))
    result: dict[str, Any] = {"device": device, "model": model, "stages": len(plan.stages),
                              "lazy_stages": lazy_stages(space), "sample": len(chosen), "batches": {}}
    for batch in batches:
        entry = _costs(backend, graph, chosen, ModelSource(model, graph.input_shape, spec=model), batch)
        if device == "cuda":
            entry["copies"] = _copies(graph, model, chosen[:COPIES_STAGES], batch)
        result["batches"][str(batch)] = entry
    return result


#: A lazy search measures its seeds (every unit alone, every one- and two-group stage) in its first round, and then
#: up to this share more: on Inception V3, 1,016 stages on the CPU and 1,154 to 1,278 on ``sim:`` GPUs, of 952 seeds
#: (bench/RESULTS.md, lazy_search).
LAZY_OVER_SEEDS = 1.4


def lazy_stages(space: LazySpace) -> int:
    """About how many stages a lazy search of the space measures per setting (at most every planned stage)."""
    return min(len(space.planned), math.ceil(len(space.seeds) * LAZY_OVER_SEEDS))


def _costs(
    backend: RealBackend, graph: Graph, chosen: list[PlannedStage], model: ModelSource, batch: int
) -> dict[str, Any]:
    """Wall time per stage under each of :data:`PROTOCOLS`, and the line through them: fixed + replays x per."""
    jobs = [MeasureJob(p.key, p.stage, p.description, graph, model, batch) for p in chosen]
    settings = []
    for warmup, repeat in PROTOCOLS:
        backend.warmup, backend.repeat = warmup, repeat
        backend.measure(jobs[0])  # the first measurement builds the model on the device
        start = time.perf_counter()
        rows = backend.measure_all(jobs)  # as an actor measures a batch (on a GPU, several stages per graph)
        settings.append({"warmup": warmup, "repeat": repeat,
                         "wall_s_per_stage": (time.perf_counter() - start) / len(jobs),
                         "median_ms_mean": statistics.fmean(row["median_ms"] for row in rows),
                         "uncaptured": sum('"uncaptured"' in row["device_info"] for row in rows)})
    (n0, w0), (n1, w1) = [(s["warmup"] + s["repeat"], s["wall_s_per_stage"]) for s in settings]
    per_replay = max((w1 - w0) / (n1 - n0), 0.0)
    return {"settings": settings, "per_replay_s": per_replay, "fixed_s": max(w0 - n0 * per_replay, 0.0)}


def _copies(graph: Graph, model: str, chosen: list[PlannedStage], batch: int) -> dict[str, Any]:
    """Summed over some sampled stages (those that capture): the median ms per stage with each number of copies per
    graph, and uncaptured (``eager``: events around each call)."""
    device = torch.device("cuda", 0)
    program = Program.from_imported(import_model(model), device)
    lanes, stream = make_lanes(device), torch.cuda.Stream(device)
    sums = dict.fromkeys([*map(str, COPIES), "eager"], 0.0)
    timed = 0
    for planned in chosen:
        stage = compile_stage(program, planned.stage, device, lanes)
        env = random_inputs(graph, planned.stage, batch, torch.float32, device)
        run = lambda stage=stage, env=env: stage(env)  # noqa: E731
        try:
            medians = {str(k): statistics.median(graph_samples_ms(run, stream, 2, 10, k)) for k in COPIES}
        except CaptureError:
            continue
        medians["eager"] = statistics.median(samples_ms(run, device, 2, 10))
        sums = {name: sums[name] + medians[name] for name in sums}
        timed += 1
    return {"stages": timed, "ms_sum": sums}


def profile(
    device: str, model: str, batch: int, store: Path, schedules: Path, text: Path, calls: int = 20,
    dtype: str = "float32", memory_format: str = "contiguous", kernels: str | None = None,
) -> dict[str, Any]:
    """The DP's and the sequential schedule run as deployed (in ``dtype`` and ``memory_format``, with ``kernels``,
    by default the search's schedule's), timed and then profiled over ``calls`` forwards each; writes the tables to
    ``text`` and returns, per schedule, its stages, the seconds of its first call (regions compile there), median
    latency, kernels, layout transposes and device time per forward."""
    spec = resolve_model(model)
    target = torch.device(device)
    imported = import_model(model, dtype=dtype, memory_format=memory_format)
    kept = read_schedule(schedule_path(schedules, model, device, batch, dtype, memory_format))
    program = Programs(imported)(target, kernels or kept.kernels)
    named = {"DP schedule": dp_schedule(imported.graph, kept, store),
             "sequential schedule": baseline_schedule(imported.graph, "sequential", kept)}
    x = in_memory_format(torch.randn(batch, *spec.input_shape, device=target, dtype=torch_dtype(dtype)),
                         memory_format)
    keys, lookup = StageKeys(imported.graph), store_lookup(store)
    summary, sections = {}, []
    for name, schedule in named.items():
        runner = ScheduleRunner(program, schedule, target)
        started = time.perf_counter()
        runner(x)  # runs without gradients; with inductor kernels its regions compile here
        first_call_s = time.perf_counter() - started
        median = measure_latency(runner, x, 3, calls, target)[0]
        table, launched, transposes, busy_ms = _profiled(runner, x, calls)
        found = summary[name] = {
            "stages": len(schedule.stages), "multi_group_stages": sum(len(s.groups) > 1 for s in schedule.stages),
            "kernels": program.kernels, "first_call_s": round(first_call_s, 2), "median_ms": median,
            "predicted_ms": predicted_ms(schedule, keys, lookup, batch) if lookup else None,
            "kernels_per_forward": launched, "transposes_per_forward": transposes, "kernel_ms_per_forward": busy_ms}
        sections.append(_section(name, model, target, batch, found, table))
    text.write_text("\n".join(sections))
    return summary


def _section(name: str, model: str, target: torch.device, batch: int, found: dict[str, Any], table: str) -> str:
    """One schedule's part of profile.txt: what ran, its latency and prediction, then the profiler's table."""
    how = f"{found['kernels']} kernels, " + ("in a CUDA graph" if target.type == "cuda" else "no graph")
    kernels = (f"; per forward {found['kernels_per_forward']} kernels ({found['transposes_per_forward']} of them "
               f"layout transposes) summing to {found['kernel_ms_per_forward']} ms of device time (more than the "
               "latency where groups overlap)") if target.type == "cuda" else ""
    predicted = "-" if found["predicted_ms"] is None else f"{found['predicted_ms']:.3f}"
    return (f"== {name} of {model} on {target.type}, batch {batch}, run as deployed ({how}): {found['stages']} stages "
            f"({found['multi_group_stages']} with several groups), median {found['median_ms']:.3f} ms, predicted "
            f"{predicted} ms{kernels}\n{table}\n")


def dp_schedule(graph: Graph, like: Schedule, store: Path) -> Schedule:
    """The DP's schedule for ``like``'s device fingerprint and batch, from the store's latencies (over measured
    stages only: a lazy search leaves the stages that cannot change its answer unmeasured)."""
    params = SearchParams.from_json(like.params)
    keys = StageKeys(graph)
    plan = plan_graph(graph, params, keys)
    table = LatencyStore(store, create=False).lookup(list(plan.stages), like.device_fingerprint, like.batch,
                                                     like.dtype)
    result = optimize_graph(graph, TableLatency(keys, table, missing=math.inf), params)
    return Schedule(like.model, graph.fingerprint, like.device, like.batch, result.schedules, like.dtype,
                    like.device_fingerprint, like.device_info, dict(like.params), like.source,
                    memory_format=like.memory_format, kernels=like.kernels)


#: Device events that are copies or fills, not kernels (the graph's input copied in, its output copied out).
_COPIES = ("Memcpy", "Memset")
#: What cuDNN names the kernels that transpose activations between NCHW and NHWC around its NHWC convolutions.
LAYOUT_TRANSPOSES = ("nchwToNhwc", "nhwcToNchw")


def is_layout_transpose(kernel: str) -> bool:
    """Whether a profiled kernel's name is one of cuDNN's layout transposes."""
    return any(name in kernel for name in LAYOUT_TRANSPOSES)


def _profiled(runner: ScheduleRunner, x: torch.Tensor, calls: int
              ) -> tuple[str, float | None, float | None, float | None]:
    """The key_averages table of ``calls`` forwards, and per forward the kernels (copies and fills left out), the
    layout transposes among them and their summed device time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = x.is_cuda
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    try:
        with torch_profile(activities=activities) as prof:
            for _ in range(calls):
                runner(x)
            if cuda:
                torch.cuda.synchronize()
        averages = prof.key_averages()
        table = averages.table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=20,
                               max_name_column_width=60)
    except Exception as exc:  # noqa: BLE001 - a profiler that fails here still leaves the latencies
        return f"the PyTorch profiler failed: {type(exc).__name__}: {exc}", None, None, None
    if not cuda:
        return table, None, None, None
    kernels = [e for e in averages if e.device_type == DeviceType.CUDA and not e.key.startswith(_COPIES)]
    busy_us = sum(e.self_device_time_total for e in kernels)
    transposes = sum(e.count for e in kernels if is_layout_transpose(e.key))
    return (table, round(sum(e.count for e in kernels) / calls, 1), round(transposes / calls, 1),
            round(busy_us / calls / 1e3, 4))


def main(argv: list[str] | None = None) -> int:
    """Run one step and write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("env", "calibrate", "profile"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--sample", type=int, default=24)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--store", type=Path)
    parser.add_argument("--schedules", type=Path)
    parser.add_argument("--text", type=Path)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--memory-format", default="contiguous")
    parser.add_argument("--kernels", choices=KERNEL_NAMES, help="profile: the kernels (default: the search's)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.step == "env":
        found = environment(args.device)
    elif args.step == "calibrate":
        found = calibrate(args.device, args.model, [int(b) for b in args.batches.split(",")], args.sample)
    else:
        found = profile(args.device, args.model, args.batch, args.store, args.schedules, args.text, args.calls,
                        args.dtype, args.memory_format, args.kernels)
    args.out.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
