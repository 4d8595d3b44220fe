"""What ``torch.compile(model, backend="ios_ray")`` costs at start-up once its graphs were searched ahead of time.

For each model: ``ios_ray.search(model, ["cpu"], [batch], torch_compile=True)`` into one store and schedules folder
(skipped with ``--no-search``), then, in a fresh process, the first call of the compiled model (Dynamo's tracing,
each graph's import and the schedule looked up) beside the import of the whole model by ios-ray, Dynamo alone
(``backend="eager"``), what each graph ran (its schedule's file, the store's DP, its one schedule, or its fallback),
the largest difference from eager, whether Ray started and whether the store gained a row: a compile that finds its
schedules measures nothing.

    python bench/compile_time.py                       # GoogLeNet, Inception V3, a model with a graph break, YOLOv8n
    python bench/compile_time.py --models inception_v3 --no-search

torchvision and Ultralytics are needed for their models (they are skipped, said so, where absent).
"""

from __future__ import annotations

import argparse
import collections
import json
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


def measure(spec: str, batch: int, store: Path, out: Path) -> dict[str, Any]:
    """One fresh process's figures for ``spec`` (see the module docstring)."""
    import ios_ray
    from bench.model_libraries import _define_torchvision_schemas
    from ios_ray.app.compiled_graph import CompiledGraph
    from ios_ray.dtypes import example_input
    from ios_ray.frontend import import_module
    from ios_ray.models import resolve_model
    from ios_ray.store import LatencyStore

    _define_torchvision_schemas()
    model_spec = resolve_model(spec)
    model = model_spec.build().eval()
    x = example_input(model, model_spec.input_shape, batch)
    rows = LatencyStore(store, create=False).query().num_rows if store.exists() else 0
    with torch.no_grad():
        eager = model(x)
        start = time.perf_counter()
        import_module(model, x, spec)
        import_s = time.perf_counter() - start
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
    return {"model": spec, "batch": batch, "import_s": import_s, "dynamo_s": dynamo_s, "compile_s": compile_s,
            "ran": dict(ran), "max_abs_error": _max_error(got, eager),
            "warnings": sum("ios_ray" in str(w.message) for w in caught),
            "ray_started": bool(ray is not None and ray.is_initialized()),
            "new_rows": (LatencyStore(store, create=False).query().num_rows if store.exists() else 0) - rows,
            "graphs": sum(isinstance(g, CompiledGraph) for g in backend.graphs)}


def _origin(graph: Any) -> str:
    """What a graph ran, in a word: a schedule file, the store's DP, its one schedule, or its fallback."""
    from ios_ray.app.compiled_graph import FALLBACK

    if isinstance(graph, str):
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
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    store, out = args.work / "latency.duckdb", args.work / "schedules"
    if args.measure:
        print(json.dumps(measure(args.measure, args.batch, store, out)))
        return 0
    console, table = Console(width=170), Table("model", "graphs", "search s", "import s", "dynamo s", "compile s",
                                               "compile - import s", "ran", "max |err|", "Ray", "new rows",
                                               title=f"torch.compile(model, backend='ios_ray') at batch {args.batch}")
    for spec in args.models:
        searched = "-" if args.no_search else f"{search(spec, args.batch, store, out):.1f}"
        done = subprocess.run([sys.executable, __file__, "--measure", spec, "--batch", str(args.batch),
                               "--work", str(args.work)], capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            console.print(f"{spec}: {done.stderr.strip().splitlines()[-1]}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        console.print(json.dumps(r))
        table.add_row(spec, str(r["graphs"]), searched, f"{r['import_s']:.2f}", f"{r['dynamo_s']:.2f}",
                      f"{r['compile_s']:.2f}", f"{r['compile_s'] - r['import_s']:+.2f}",
                      ", ".join(f"{n} {k}" for k, n in r["ran"].items()), f"{r['max_abs_error']:.1e}",
                      "started" if r["ray_started"] else "no", str(r["new_rows"]))
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
