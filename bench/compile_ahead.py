"""The check's regions compiled ahead, side by side (:mod:`ios_ray.runtime.ahead`), against one after another.

    python bench/compile_ahead.py --store S.duckdb [--model inception_v3] [--device cuda] [--batch 1]
        [--dtype float32] [--run-on cpu] [--workers N] [--pairs 2]

Solves the candidates a search's check would run from the latencies a store holds for ``--device`` (as
bench/shared_regions.py does: a GPU's store can be read on any machine), builds them with ``inductor`` kernels on
``--run-on`` over one program, and times how long their regions take to compile before every candidate runs
compiled code, each way in a process of its own on an empty Inductor cache (so each compiles everything), in rounds
of alternating order:

- ``in turn``: each candidate's first call in order, compiling its regions one after another (as before);
- ``ahead alone``: :func:`~ios_ray.runtime.ahead.compile_ahead` with no worker (the passes traced, then compiled here);
- ``ahead, N workers``: with ``--workers`` compile workers (default: as many as the check would start here,
  :func:`~ios_ray.runtime.ahead.default_workers`).

Prints seconds per way (median, range) and each way's ratio to ``in turn`` per round, with its 95% interval, and how
many regions the workers compiled. Every way's outputs are checked against the model as is. No target: a report of
what compiling beside workers saves on this host (a 2-core CPU gives one worker; a GPU host 8).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WAYS = ("in turn", "ahead alone", "ahead, workers")


def one_way(args: argparse.Namespace, way: str) -> dict[str, float]:
    """In this process: build the candidates and compile their regions ``way``; seconds, traces and worker share."""
    import torch

    from bench.shared_regions import stored_candidates
    from ios_ray.dtypes import torch_dtype
    from ios_ray.frontend import import_model
    from ios_ray.runtime import Program, ScheduleRunner
    from ios_ray.runtime.ahead import compile_ahead
    from ios_ray.vocabulary import INDUCTOR_KERNELS

    imported = import_model(args.model, dtype=args.dtype)
    found = stored_candidates(imported, args.model, args.store, args.device, args.batch, args.dtype)
    program = Program.from_imported(imported, args.run_on, INDUCTOR_KERNELS)
    runners = [ScheduleRunner(program, schedule, cuda_graph=False) for schedule in found.values()]
    x = torch.randn(args.batch, *imported.graph.input_shape, dtype=torch_dtype(args.dtype), device=args.run_on)
    with torch.no_grad():
        expected = imported.module.to(args.run_on)(x)
        warm = Program.from_imported(imported, args.run_on, INDUCTOR_KERNELS)  # Inductor's start, once a process
        ScheduleRunner(warm, found["sequential"], cuda_graph=False)(x)
        del warm
        _synchronize(args.run_on)
        started = time.perf_counter()
        ahead = None
        if way != "in turn":
            ahead = compile_ahead([lambda r=r: r.run_stages(x) for r in runners], 0 if way == "ahead alone" else
                                  args.workers)
        outputs = [runner(x) for runner in runners]
        _synchronize(args.run_on)
        seconds = time.perf_counter() - started
    worst = max(float((y - expected).abs().max() / expected.abs().max()) for y in outputs)
    if worst > (1e-2 if args.dtype != "float32" else 1e-3):
        raise SystemExit(f"compile_ahead: {way}: an output is off by {worst:.2e} of the model's")
    return {"seconds": seconds, "traces": ahead.regions if ahead else 0, "workers": ahead.workers if ahead else 0,
            "by_workers": ahead.by_workers if ahead else 0, "missed": ahead.missed if ahead else 0}


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def in_a_process(args: argparse.Namespace, way: str) -> dict[str, float]:
    """One way timed in a process of its own, on an empty Inductor cache."""
    with tempfile.TemporaryDirectory(prefix="ios-ray-ahead-") as cache:
        command = [sys.executable, __file__, "--one-way", way, "--store", str(args.store), "--model", args.model,
                   "--device", args.device, "--batch", str(args.batch), "--dtype", args.dtype, "--run-on",
                   args.run_on, "--workers", str(args.workers)]
        done = subprocess.run(command, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}, capture_output=True,
                              text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"compile_ahead: {way} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Time each way in alternating order, ``--pairs`` rounds, and print the table."""
    from rich.console import Console
    from rich.table import Table

    from bench.shared_regions import stored_candidates_arguments
    from ios_ray.paired import median_interval
    from ios_ray.runtime.ahead import default_workers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stored_candidates_arguments(parser)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--one-way", choices=WAYS)
    args = parser.parse_args()
    if args.one_way:
        print(json.dumps(one_way(args, args.one_way)))
        return
    found: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for index in range(args.pairs):
        for way in (WAYS if index % 2 == 0 else WAYS[::-1]):
            found[way].append(in_a_process(args, way))
            print(f"round {index + 1}, {way}: {found[way][-1]['seconds']:.1f} s", file=sys.stderr)
    table = Table(title=f"{args.model} bs{args.batch} {args.dtype} on {args.run_on}: the check's regions compiled "
                        f"({args.device}'s candidates from {args.store.name}), {args.pairs} rounds")
    for column in ("way", "seconds: median (range)", "/ in turn: median (95% interval)", "traces",
                   "by workers (read from the cache)", "workers' missed"):
        table.add_column(column, justify="right")
    for way, runs in found.items():
        seconds = [run["seconds"] for run in runs]
        ratio = median_interval([s / base["seconds"] for s, base in zip(seconds, found["in turn"])])
        interval = "" if ratio.low is None else f" ({ratio.low:.2f}-{ratio.high:.2f})"
        name = way if way != "ahead, workers" else f"ahead, {int(runs[0]['workers'])} workers"
        table.add_row(name, f"{statistics.median(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f})",
                      f"{ratio.median:.2f}{interval}", f"{int(runs[0]['traces'])}",
                      f"{statistics.median(run['by_workers'] for run in runs):.0f}",
                      f"{statistics.median(run['missed'] for run in runs):.0f}")
    Console().print(table)


if __name__ == "__main__":
    main()
