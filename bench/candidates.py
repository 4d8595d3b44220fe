"""The check's candidates and the correction on this CPU: what a search predicts of the schedule it keeps, once an
earlier search has fitted the correction, and what running several candidates costs the check.

Two parts (``--part``):

* ``prediction``: for each model and batch, a search on a fresh store (its check runs the candidates and stores
  them as runs), then the same search again on that store (its DP priced by the correction fitted from the first
  check's runs; it measures only the stages the corrected costs newly ask for, none twice). Target: the second search's kept schedule measured (its check's median) over
  predicted (its corrected prediction) within 0.95-1.05. The first search's figure (a plain stage sum) is shown
  beside it.
* ``cost``: for the same settings, in this process, the candidates of the second search (rebuilt from the store as
  the search builds them) timed whole against sequential as the check times them (:func:`~ios_ray.runtime.compare
  .contest`), and the check of the DP's schedule alone against sequential (the check before candidates), by turns,
  three times each. Target: the candidates' wall time at most 1.5x the DP's alone (the median of the per-turn
  ratios).

Run: python bench/candidates.py [--models inception_v3,nasnet_a] [--batches 1,8]
(about an hour on 2 cores with the defaults; exit code 1 when a target is missed); the cost part alone on the stores
of an earlier run: ``--part cost --stores /tmp/ios-ray-candidates-XXXX``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import ios_ray  # noqa: E402
from bench.verdict import run_parts  # noqa: E402
from ios_ray.app.search.candidates import candidates  # noqa: E402
from ios_ray.app.search.check import stored_correction  # noqa: E402
from ios_ray.app.compile.graph_schedules import local_device  # noqa: E402
from ios_ray.app.search.job import SearchOutcome  # noqa: E402
from ios_ray.app.search.measuring import Lazy, Setting  # noqa: E402
from ios_ray.app.search.solver import Solver  # noqa: E402
from ios_ray.frontend import import_model  # noqa: E402
from ios_ray.paired import LookPlan, contest_confidence  # noqa: E402
from ios_ray.runtime import Programs, ScheduleRunner  # noqa: E402
from ios_ray.runtime.compare import contest  # noqa: E402
from ios_ray.scheduler import SearchParams  # noqa: E402
from ios_ray.stage import StageKeys  # noqa: E402
from ios_ray.store import LatencyStore  # noqa: E402
from ios_ray.vocabulary import DEFAULT_CHECK_CONFIDENCE, DEFAULT_CHECK_ROUNDS, KERNEL_NAMES  # noqa: E402

#: The kept schedule's measured / predicted that a search after one fitted the correction must reach.
BAND = (0.95, 1.05)
#: The most the candidates' check may cost over the check of the DP's schedule alone.
COST_LIMIT = 1.5
#: Turns of each check in the cost part.
TURNS = 3


def prediction(models: list[str], batches: list[int], folder: Path, console: Console,
               searched: dict[tuple[str, int], Path]) -> tuple[Table, bool]:
    """Search each setting twice on one store; the second search's kept measured / predicted."""
    table = Table("model", "batch", "kernels", "first: kept, measured / stage sum", "correction (alpha, beta ms, "
                  "gamma ms, runs)", "again: kept, measured / corrected prediction", "new stages again",
                  "sequential ms, first check -> again (the machine's drift)", "target",
                  title="the kept schedule's prediction after one search fitted the correction (CPU)")
    passed = True
    for model in models:
        for batch in batches:
            store = folder / f"{model}-bs{batch}.duckdb"
            first, again = (_search(model, batch, store) for _ in range(2))
            searched[model, batch] = store
            over = again.end_to_end.kept_over_predicted if again.end_to_end else None
            ok = over is not None and BAND[0] <= over <= BAND[1]
            passed &= ok
            c = again.correction
            row = (model, str(batch), again.schedule.kernels, _kept(first), f"{c.alpha:.3f}, {c.beta_ms:.4f}, "
                   f"{c.gamma_ms:.4f}, {c.runs}", _kept(again), str(again.measured), _drift(first, again),
                   "PASS" if ok else "MISS")
            table.add_row(*row)
            console.print(" | ".join(row))  # as each setting ends: a run stopped later keeps what it found
    return table, passed


def cost(searched: dict[tuple[str, int], Path], console: Console) -> tuple[Table, bool]:
    """Time the candidates' check against the DP's alone, by turns, on the stores the prediction part searched."""
    table = Table("model", "batch", "candidates", "candidates' check s", "DP's check alone s",
                  "ratio (median of turns)", "target", title="what the candidates cost the check (CPU, wall time)")
    passed = True
    for (model, batch), store in searched.items():
        found = _candidates(model, batch, store)
        imported = import_model(model)
        programs = Programs(imported)
        x = torch.randn(batch, *imported.graph.input_shape)
        runs = {name: (lambda r=ScheduleRunner(programs("cpu", s.kernels), s): r(x)) for name, s in found.items()}
        ratios, many_s, alone_s = [], [], []
        for _ in range(TURNS):
            many_s.append(_timed(runs))
            alone_s.append(_timed({name: runs[name] for name in ("dp", "sequential")}))
            ratios.append(many_s[-1] / alone_s[-1])
        ratio = statistics.median(ratios)
        ok = ratio <= COST_LIMIT
        passed &= ok
        table.add_row(model, str(batch), ", ".join(found), f"{statistics.median(many_s):.1f}",
                      f"{statistics.median(alone_s):.1f}", f"{ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                      "PASS" if ok else "MISS")
    return table, passed


def _search(model: str, batch: int, store: Path) -> SearchOutcome:
    """One search of the setting on ``store``, with the defaults."""
    return ios_ray.search(model, ["cpu"], [batch], store=store, progress=False)["cpu", batch]


def _kept(outcome: SearchOutcome) -> str:
    """The kept schedule's name and its measured / predicted, in words."""
    check = outcome.end_to_end
    over = None if check is None else check.kept_over_predicted
    return "-" if over is None else f"{check.kept}, {over:.3f}"


def _drift(first: SearchOutcome, again: SearchOutcome) -> str:
    """The sequential schedule's time in both checks and their ratio: the machine's own drift between them, which no
    prediction from the first check's runs can follow."""
    if first.end_to_end is None or again.end_to_end is None:
        return "-"
    before, after = first.end_to_end.sequential_ms, again.end_to_end.sequential_ms
    return f"{before:.2f} -> {after:.2f} ({after / before:.3f})"


def _candidates(model: str, batch: int, store_path: Path) -> dict:
    """The candidates a search of the setting builds from what the store holds now (as the search does)."""
    imported = import_model(model)
    graph = imported.graph
    measuring = Lazy(StageKeys(graph), SearchParams(), None, "float32")
    store = LatencyStore(store_path, create=False)
    base = local_device("cpu")
    kernels = max(KERNEL_NAMES, key=lambda k: len(store.lookup(measuring.keys, base.running(k).fingerprint, batch)))
    from ios_ray.app.search.kernel_choice import KernelChoice

    setting = Setting(base, batch)
    setting.run_with(KernelChoice(kernels, "as before"))
    setting.correction = stored_correction(store, setting.identity.fingerprint, batch, "float32")
    setting.table = store.lookup(measuring.keys, setting.identity.fingerprint, batch)
    measuring.ask(setting, 32)  # the lazy search's last round, which its record reads
    return candidates(Solver(measuring, model, "float32"), setting)


def _timed(runs: dict) -> float:
    """Seconds one check of these callables against sequential takes, as the search's check runs it."""
    plan = LookPlan.planned(DEFAULT_CHECK_ROUNDS, contest_confidence(DEFAULT_CHECK_CONFIDENCE, len(runs) - 1))
    started = time.perf_counter()
    contest(runs, "sequential", "cpu", plan, max_seconds=60.0)
    return time.perf_counter() - started


def main() -> int:
    """Run the parts; exit status 0 when every target of what ran is met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="inception_v3,nasnet_a")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--part", choices=("prediction", "cost"), help="run one part only (cost: on --stores)")
    parser.add_argument("--stores", type=Path, help="the folder of an earlier run's stores (<model>-bs<batch>.duckdb), "
                        "for --part cost")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ios-ray-candidates-"))
    models, batches = args.models.split(","), [int(b) for b in args.batches.split(",")]
    searched: dict[tuple[str, int], Path] = {}
    if args.stores is not None:
        searched = {(model, batch): args.stores / f"{model}-bs{batch}.duckdb" for model in models for batch in batches
                    if (args.stores / f"{model}-bs{batch}.duckdb").exists()}
    return run_parts({
        "prediction": lambda console: prediction(models, batches, folder, console, searched),
        "cost": lambda console: cost(searched, console),
    }, args.part, width=220)


if __name__ == "__main__":
    sys.exit(main())
