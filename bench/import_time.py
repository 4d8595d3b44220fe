"""How long an import takes through torch.export against through a torch.fx trace, or against another checkout.

    python bench/import_time.py                                  # timm's pnasnet5large and nasnetalarge, the zoo
    python bench/import_time.py --models timm:resnet50 inception_v3 --rounds 5
    git worktree add /tmp/base e809b8f                           # the tree before torch.export
    python bench/import_time.py --against /tmp/base --models timm:pnasnet5large timm:nasnetalarge

Captures in one process: each round imports every model once per capture (``import_module(..., capture=...)``:
``fx`` is the import as it was before torch.export, the torch.fx trace and its two runs of the model; ``export`` the
capture imports use now), the two captures in alternating order, after one warm-up import of each; the model is
built once. ``--against TREE``: the import of this checkout against that of another (the issue's baseline), each in
fresh processes, the two trees alternating; a process imports SqueezeNet (what a first import loads once), builds
the model and collects the garbage its construction left (else whichever import comes first pays a full collection
of it, or not, by where the collector's thresholds happen to fall), then times the model's first import and two
more. The table gives per model the median seconds of each and the median of the per-round (per process pair) ratios
with their spread (least and largest). Target (issue "Import what torch.fx refuses"): the ratio at most 1.5 on the
largest models. Nothing here is measured on a device: imports run on the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.model_libraries import _define_torchvision_schemas  # noqa: E402
from ios_ray.dtypes import example_input  # noqa: E402
from ios_ray.frontend import import_module  # noqa: E402
from ios_ray.models import resolve_model  # noqa: E402

DEFAULT_MODELS = ("timm:pnasnet5large", "timm:nasnetalarge", "inception_v3", "nasnet_a")
CAPTURES = ("fx", "export")
TARGET = 1.5
#: What one fresh process of ``--against`` runs: the tree's own ios_ray first on the path, this one's bench after.
_PROCESS = """
import gc, json, statistics, sys, time
sys.path[:0] = [{tree!r}, {bench!r}]
from bench.model_libraries import _define_torchvision_schemas
_define_torchvision_schemas()
import ios_ray
from ios_ray.dtypes import example_input
from ios_ray.frontend import import_module
from ios_ray.models import resolve_model
small = resolve_model("squeezenet")
module = small.build()
import_module(module, example_input(module, small.input_shape), "squeezenet")
resolved = resolve_model({spec!r})
model = resolved.build()
x = example_input(model, resolved.input_shape)
gc.collect()
times = []
for _ in range(3):
    started = time.perf_counter()
    import_module(model, x, {spec!r})
    times.append(time.perf_counter() - started)
print(json.dumps({{"package": ios_ray.__file__, "first": times[0], "warm": statistics.median(times[1:])}}))
"""


def time_captures(spec: str, rounds: int) -> dict[str, list[float]]:
    """Seconds per import of one model, per capture, ``rounds`` times each in alternating order."""
    resolved = resolve_model(spec)
    model = resolved.build()
    x = example_input(model, resolved.input_shape)
    times: dict[str, list[float]] = {c: [] for c in CAPTURES}
    for capture in CAPTURES:  # warm-up: what a first import in a process loads once
        import_module(model, x, spec, capture=capture)
    for round_ in range(rounds):
        for capture in CAPTURES if round_ % 2 == 0 else CAPTURES[::-1]:
            started = time.perf_counter()
            import_module(model, x, spec, capture=capture)
            times[capture].append(time.perf_counter() - started)
    return times


def time_trees(spec: str, trees: tuple[Path, Path], processes: int) -> dict[Path, list[dict[str, float]]]:
    """Per tree, the first and warm import seconds of ``processes`` fresh processes, the trees alternating."""
    times: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    for round_ in range(processes):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            code = _PROCESS.format(tree=str(tree), bench=str(ROOT), spec=spec)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"importing {spec} in {tree} failed: {done.stderr.strip().splitlines()[-1]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            if Path(result["package"]).resolve().parent.parent != tree.resolve():
                raise SystemExit(f"the process for {tree} imported ios_ray from {result['package']}")
            times[tree].append(result)
    return times


def _ratio_cells(numerators: list[float], denominators: list[float]) -> tuple[str, str, str, float]:
    """The median of ``numerators``, the median ratio, its spread, and the median ratio as a number."""
    ratios = sorted(n / d for n, d in zip(numerators, denominators))
    ratio = statistics.median(ratios)
    return f"{statistics.median(numerators):.2f}", f"{ratio:.2f}", f"{ratios[0]:.2f}-{ratios[-1]:.2f}", ratio


def compare_captures(models: list[str], rounds: int) -> int:
    """Print the fx against export table; the number of models over the target."""
    table = Table(title=f"import time, torch.export against torch.fx ({rounds} rounds, alternating)")
    for column in ("model", "fx s (median)", "export s (median)", "export / fx (median)", "spread", "target"):
        table.add_column(column, justify="left" if column == "model" else "right")
    missed = 0
    for spec in models:
        times = time_captures(spec, rounds)
        export, ratio_text, spread, ratio = _ratio_cells(times["export"], times["fx"])
        missed += ratio > TARGET
        table.add_row(spec, f"{statistics.median(times['fx']):.2f}", export, ratio_text, spread,
                      f"<= {TARGET} {'met' if ratio <= TARGET else 'MISSED'}")
        Console().print(f"{spec}: fx {times['fx']}, export {times['export']}", highlight=False)
    Console(width=140).print(table)
    return missed


def compare_trees(models: list[str], against: Path, processes: int) -> int:
    """Print this checkout's import against another's, first and warm; the number of ratios over the target."""
    table = Table(title=f"import time, this checkout against {against} ({processes} fresh processes each, "
                        "alternating)")
    for column in ("model", "import", f"{against.name} s", "this s", "this / that (median)", "spread", "target"):
        table.add_column(column, justify="left" if column == "model" else "right")
    missed = 0
    for spec in models:
        times = time_trees(spec, (against, ROOT), processes)
        for kind in ("first", "warm"):
            that = [t[kind] for t in times[against]]
            this, ratio_text, spread, ratio = _ratio_cells([t[kind] for t in times[ROOT]], that)
            missed += ratio > TARGET
            table.add_row(spec, kind, f"{statistics.median(that):.2f}", this, ratio_text, spread,
                          f"<= {TARGET} {'met' if ratio <= TARGET else 'MISSED'}")
        for tree, runs in times.items():
            Console().print(f"{spec} in {tree}: first " + ", ".join(f"{t['first']:.2f}" for t in runs) + "; warm "
                            + ", ".join(f"{t['warm']:.2f}" for t in runs), highlight=False)
    Console(width=140).print(table)
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="model specs")
    parser.add_argument("--rounds", type=int, default=5, help="imports per capture and model (default 5)")
    parser.add_argument("--against", type=Path, help="another checkout of ios-ray to compare this one with")
    parser.add_argument("--processes", type=int, default=3, help="with --against: processes per tree (default 3)")
    args = parser.parse_args()
    if args.against is not None:
        if not (args.against / "ios_ray" / "__init__.py").is_file():
            parser.error(f"{args.against} is not a checkout of ios-ray (it has no ios_ray/__init__.py)")
        return 1 if compare_trees(args.models, args.against, args.processes) else 0
    _define_torchvision_schemas()
    return 1 if compare_captures(args.models, args.rounds) else 0


if __name__ == "__main__":
    raise SystemExit(main())
