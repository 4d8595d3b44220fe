"""What ``torch.compile(model, backend="ios_ray")`` costs at start-up once its graphs were searched ahead of time.

For each model: ``ios_ray.search(model, ["cpu"], [batch], torch_compile=True)`` into one store and schedules folder
(skipped with ``--no-search``), then ``--rounds`` times two fresh processes: one times ios-ray's import of the whole
model (``import s``, the process's first, as ``ios-ray inspect`` does it), the other Dynamo alone (``backend="eager"``,
a first call), then the first call of the model compiled with the ios_ray backend (``compile s``: Dynamo's tracing
again, each graph's import, the schedule looked up), of which ``backend s`` is the time spent in the backend itself
(its callback inside Dynamo and each graph's first call: import, checks, runner). Printed: medians with their spread (least-largest), what each graph ran (its schedule's file, the store's DP, its one
schedule, or its fallback), the largest difference from eager, whether Ray started and whether the store gained a
row: a compile that finds its schedules measures nothing. Target (issue "torch.compile(model, backend='ios_ray')"):
what the backend adds to a compile at most the import time plus 1 s, in every round (exit code 1 where missed).

    python bench/compile_time.py                       # GoogLeNet, Inception V3, a model with a graph break, YOLOv8n
    python bench/compile_time.py --models inception_v3 --no-search

torchvision and Ultralytics are needed for their models (they are skipped, said so, where absent).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("torchvision:googlenet", "inception_v3", "tests.compile_models:broken", "ultralytics:yolov8n")


def measure_import(spec: str, batch: int) -> dict[str, Any]:
    """A fresh process's first import of ``spec``, in seconds (``import_s``)."""
    from bench.model_libraries import _define_torchvision_schemas
    from ios_ray.dtypes import example_input
    from ios_ray.frontend import import_module
    from ios_ray.models import resolve_model

    _define_torchvision_schemas()
    model_spec = resolve_model(spec)
    model = model_spec.build().eval()
    x = example_input(model, model_spec.input_shape, batch)
    with torch.no_grad():
        model(x)
        start = time.perf_counter()
        import_module(model, x, spec)
    return {"import_s": time.perf_counter() - start}


def measure(spec: str, batch: int, store: Path, out: Path) -> dict[str, Any]:
    """A fresh process's compile figures for ``spec`` (see the module docstring)."""
    import ios_ray
    from bench.model_libraries import _define_torchvision_schemas
    from ios_ray.app.compile.backend import IosRayBackend
    from ios_ray.app.compile.compiled_graph import CompiledGraph
    from ios_ray.dtypes import example_input
    from ios_ray.models import resolve_model
    from ios_ray.store import LatencyStore

    _define_torchvision_schemas()
    model_spec = resolve_model(spec)
    model = model_spec.build().eval()
    x = example_input(model, model_spec.input_shape, batch)
    rows = LatencyStore(store, create=False).query().num_rows if store.exists() else 0
    spent: list[float] = []
    _timed(IosRayBackend, "__call__", spent)
    _timed(CompiledGraph, "__call__", spent)
    with torch.no_grad():
        eager = model(x)
        start = time.perf_counter()
        torch.compile(model, backend="eager")(x)
        dynamo_s = time.perf_counter() - start
        torch._dynamo.reset()
        backend = ios_ray.backend(schedules=out, store=store)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            got = torch.compile(model, backend=backend)(x)
            compile_s = time.perf_counter() - start
    ran = collections.Counter(_origin(g) for g in backend.graphs)
    ray = sys.modules.get("ray")
    return {"model": spec, "batch": batch, "dynamo_s": dynamo_s, "compile_s": compile_s,
            "backend_s": sum(spent), "ran": dict(ran), "max_abs_error": _max_error(got, eager),
            "warnings": sum("ios_ray" in str(w.message) for w in caught),
            "ray_started": bool(ray is not None and ray.is_initialized()),
            "new_rows": (LatencyStore(store, create=False).query().num_rows if store.exists() else 0) - rows,
            "graphs": sum(isinstance(g, CompiledGraph) for g in backend.graphs)}


def _timed(cls: type, method: str, spent: list[float]) -> None:
    """Add the seconds of every outermost call of ``cls.method`` to ``spent``."""
    original = getattr(cls, method)
    depth = [0]

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                spent.append(time.perf_counter() - start)
    setattr(cls, method, timed)


def _origin(graph: Any) -> str:
    """What a graph ran, in a word: a schedule file, the store's DP, its one schedule, or its fallback."""
    from ios_ray.app.compile.backend import FallbackGraph
    from ios_ray.app.compile.compiled_graph import FALLBACK

    if isinstance(graph, FallbackGraph):
        return "not a module (fallback)"
    [origin] = graph.runs
    if origin == FALLBACK:
        return "no schedule (fallback)"
    return "schedule file" if origin.endswith(".json") else origin.split(" over ")[0]


def _max_error(got: Any, eager: Any) -> float:
    """The largest absolute difference between two outputs of the same structure."""
    flat = [torch.as_tensor(t).reshape(-1) for t in torch.utils._pytree.tree_leaves((got,))]
    ref = [torch.as_tensor(t).reshape(-1) for t in torch.utils._pytree.tree_leaves((eager,))]
    return max(float((a.double() - b.double()).abs().max()) for a, b in zip(flat, ref))


def search(spec: str, batch: int, store: Path, out: Path) -> float:
    """Search the model's compiled graphs on this CPU ahead of time (no end-to-end check); the seconds it took."""
    import ios_ray
    from bench.model_libraries import _define_torchvision_schemas

    _define_torchvision_schemas()
    start = time.perf_counter()
    ios_ray.search(spec, ["cpu"], [batch], torch_compile=True, store=store, out=out, check_rounds=0, progress=False)
    return time.perf_counter() - start


def main() -> int:
    """Search each model, then time its compile in a fresh process; print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("bench_compile"), help="store and schedules folder")
    parser.add_argument("--no-search", action="store_true", help="time only: the schedules are already there")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes timed per model (default 3)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--measure-import", help=argparse.SUPPRESS)
    args = parser.parse_args()
    store, out = args.work / "latency.duckdb", args.work / "schedules"
    if args.measure:
        print(json.dumps(measure(args.measure, args.batch, store, out)))
        return 0
    if args.measure_import:
        print(json.dumps(measure_import(args.measure_import, args.batch)))
        return 0
    console = Console(width=170)
    table = Table("model", "graphs", "search s", "import s", "dynamo s", "compile s", "backend s", "target",
                  "ran", "max |err|", "Ray", "new rows", title=f"torch.compile(model, backend='ios_ray') at batch "
                  f"{args.batch}: medians of {args.rounds} fresh processes (least-largest)")
    missed = 0
    for spec in args.models:
        searched = "-" if args.no_search else f"{search(spec, args.batch, store, out):.1f}"
        rounds = []
        for _ in range(args.rounds):
            figures: dict[str, Any] = {}
            for flag in ("--measure-import", "--measure"):
                done = subprocess.run([sys.executable, __file__, flag, spec, "--batch", str(args.batch),
                                       "--work", str(args.work)], capture_output=True, text=True, cwd=ROOT)
                if done.returncode != 0:
                    console.print(f"{spec}: {done.stderr.strip().splitlines()[-1]}")
                    break
                figures.update(json.loads(done.stdout.strip().splitlines()[-1]))
            else:
                rounds.append(figures)
                console.print(json.dumps(figures))
                continue
            break
        if len(rounds) < args.rounds:
            missed += 1
            continue
        met = all(r["backend_s"] <= r["import_s"] + 1 for r in rounds)
        missed += not met
        r = rounds[0]
        table.add_row(spec, str(r["graphs"]), searched, *(_spread([q[k] for q in rounds])
                                                         for k in ("import_s", "dynamo_s", "compile_s", "backend_s")),
                      f"<= import + 1: {'met' if met else 'MISSED'}",
                      ", ".join(f"{n} {k}" for k, n in r["ran"].items()),
                      f"{max(q['max_abs_error'] for q in rounds):.1e}",
                      "started" if any(q["ray_started"] for q in rounds) else "no",
                      str(sum(q["new_rows"] for q in rounds)))
    console.print(table)
    return 1 if missed else 0


def _spread(values: list[float]) -> str:
    """``median (least-largest)`` of some seconds."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
