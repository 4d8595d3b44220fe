"""How long an import takes through torch.export against through a torch.fx trace, side by side.

    python bench/import_time.py                                  # timm's pnasnet5large and nasnetalarge, the zoo
    python bench/import_time.py --models timm:resnet50 inception_v3 --rounds 5

Each round imports every model once per capture (``import_module(..., capture=...)``: ``fx`` is the import as it
was before torch.export, the torch.fx trace and its two runs of the model; ``export`` the capture imports use now),
the two captures in alternating order, in one process after one warm-up import of each; the model is built once.
The table gives per model the median seconds of each and the median of the per-round ratios export / fx with its
spread (least and largest round). Target (issue "Import what torch.fx refuses"): the ratio at most 1.5 on the
largest models. Nothing here is measured on a device: imports run on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.model_libraries import _define_torchvision_schemas  # noqa: E402
from ios_ray.dtypes import example_input  # noqa: E402
from ios_ray.frontend import import_module  # noqa: E402
from ios_ray.models import resolve_model  # noqa: E402

DEFAULT_MODELS = ("timm:pnasnet5large", "timm:nasnetalarge", "inception_v3", "nasnet_a")
CAPTURES = ("fx", "export")
TARGET = 1.5


def time_imports(spec: str, rounds: int) -> dict[str, list[float]]:
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="model specs")
    parser.add_argument("--rounds", type=int, default=5, help="imports per capture and model (default 5)")
    args = parser.parse_args()
    _define_torchvision_schemas()
    table = Table(title=f"import time, torch.export against torch.fx ({args.rounds} rounds, alternating)")
    for column in ("model", "fx s (median)", "export s (median)", "export / fx (median)", "spread", "target"):
        table.add_column(column, justify="left" if column == "model" else "right")
    missed = 0
    for spec in args.models:
        times = time_imports(spec, args.rounds)
        ratios = sorted(e / f for e, f in zip(times["export"], times["fx"]))
        ratio = statistics.median(ratios)
        missed += ratio > TARGET
        table.add_row(spec, f"{statistics.median(times['fx']):.2f}", f"{statistics.median(times['export']):.2f}",
                      f"{ratio:.2f}", f"{ratios[0]:.2f}-{ratios[-1]:.2f}",
                      f"<= {TARGET} {'met' if ratio <= TARGET else 'MISSED'}")
        Console().print(f"{spec}: fx {times['fx']}, export {times['export']}", highlight=False)
    Console(width=140).print(table)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
