"""What a search's check compiles with ``inductor`` kernels: its candidates' regions, each once or once per candidate.

    python bench/shared_regions.py --store S.duckdb [--model inception_v3] [--device cuda] [--batch 1]
        [--dtype float32] [--memory-format contiguous] [--run-on cpu] [--compile]

Solves the candidates a search's check would run (:func:`~ios_ray.app.search.candidates.candidates`: the DP's
schedule, its alternatives, greedy, sequential) over the latencies a store holds for ``--device`` (a GPU's store
can be read on any machine), builds each with ``inductor`` kernels on ``--run-on`` over one program, as the check
does, and counts their regions: per candidate, in all, and the distinct ones the program holds (what the check
compiles now that passes over one program share their regions). ``--compile`` also runs each candidate once on
``--run-on``, first with the regions shared and then with a program of its own per candidate (as before), and prints
the seconds the first calls took (the regions' compiles, from Inductor's cache where it holds them) side by side,
after a first call of the sequential schedule in a program of its own (Inductor's one-time start in the process).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from ios_ray.app.search.candidates import candidates  # noqa: E402
from ios_ray.app.search.kernel_choice import KernelChoice  # noqa: E402
from ios_ray.app.search.measuring import Lazy, Setting  # noqa: E402
from ios_ray.app.search.solver import Solver  # noqa: E402
from ios_ray.dtypes import torch_dtype  # noqa: E402
from ios_ray.frontend import Imported, import_model  # noqa: E402
from ios_ray.profiler.jobs import DeviceIdentity  # noqa: E402
from ios_ray.runtime import Program, ScheduleRunner  # noqa: E402
from ios_ray.schedule import Schedule  # noqa: E402
from ios_ray.scheduler import SearchParams  # noqa: E402
from ios_ray.stage import StageKeys  # noqa: E402
from ios_ray.store import LatencyStore  # noqa: E402
from ios_ray.vocabulary import INDUCTOR_KERNELS  # noqa: E402


def stored_candidates(imported: Imported, model: str, store: Path, device: str, batch: int, dtype: str
                      ) -> dict[str, Schedule]:
    """The check's candidates over the store's ``inductor`` latencies of ``device`` at ``batch``, as a search would
    solve them from what it measured."""
    latencies = LatencyStore(store, create=False)
    rows = latencies.query(device=device, batch=batch).to_pylist()
    rows = [row for row in rows if row["dtype"] == dtype and '"inductor"' in row["device_info"]]
    infos = [row["device_info"] for row in rows]
    fingerprints = {row["device_fingerprint"] for row in rows}
    if not infos or len(fingerprints) != 1:
        raise SystemExit(f"shared_regions: {store} holds no inductor stages of one {device} at batch {batch}.")
    identity = DeviceIdentity(device, fingerprints.pop(), json.loads(infos[0]), "stored", "measured")
    measuring = Lazy(StageKeys(imported.graph), SearchParams(), None, dtype)
    solver = Solver(measuring, model, dtype, mode="store")
    setting = Setting(identity, batch)
    setting.kernels = KernelChoice(INDUCTOR_KERNELS, "given")
    setting.table = latencies.lookup(measuring.keys, identity.fingerprint, batch, dtype)
    measuring.wanted(setting, round_size=1)
    return candidates(solver, setting)


def alone(imported: Imported, device: str, schedule: Schedule) -> ScheduleRunner:
    """A runner of ``schedule`` over a program of its own (its regions shared with no other pass)."""
    return ScheduleRunner(Program.from_imported(imported, device, INDUCTOR_KERNELS), schedule, cuda_graph=False)


def first_calls_s(runners: dict[str, ScheduleRunner], x: torch.Tensor) -> dict[str, float]:
    """Each runner's first call, in seconds (its regions compiled there)."""
    found = {}
    with torch.no_grad():
        for name, runner in runners.items():
            started = time.perf_counter()
            runner(x)
            found[name] = time.perf_counter() - started
    return found


def stored_candidates_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments that say which stored candidates to build, and where (:func:`stored_candidates`)."""
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--run-on", default="cpu")


def main() -> None:
    """Count (and with --compile, time) the check's regions shared and apart."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stored_candidates_arguments(parser)
    parser.add_argument("--memory-format", default="contiguous")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    imported = import_model(args.model, dtype=args.dtype, memory_format=args.memory_format)
    found = stored_candidates(imported, args.model, args.store, args.device, args.batch, args.dtype)
    program = Program.from_imported(imported, args.run_on, INDUCTOR_KERNELS)
    shared = {name: ScheduleRunner(program, schedule, cuda_graph=False) for name, schedule in found.items()}
    table = Table(title=f"{args.model} bs{args.batch} {args.dtype}: the check's candidates over {args.store.name} "
                        f"({args.device}'s latencies), built on {args.run_on}")
    for column in ("candidate", "stages", "regions", "of them in another candidate too"):
        table.add_column(column, justify="right")
    ids = {name: {id(r) for r in runner.regions} for name, runner in shared.items()}
    for name, runner in shared.items():
        others = set().union(*(ids[o] for o in ids if o != name))
        table.add_row(name, str(len(runner.schedule.stages)), str(len(ids[name])), str(len(ids[name] & others)))
    table.add_row("in all", "", str(sum(map(len, ids.values()))), f"{len(program.regions)} distinct")
    Console().print(table)
    if not args.compile:
        return
    x = torch.randn(args.batch, *imported.graph.input_shape, dtype=torch_dtype(args.dtype), device=args.run_on)
    first_calls_s({"Inductor started": alone(imported, args.run_on, found["sequential"])}, x)  # its one-time costs
    together = first_calls_s(shared, x)
    apart = first_calls_s({name: alone(imported, args.run_on, runner.schedule) for name, runner in shared.items()}, x)
    times = Table(title="first call of each candidate, s (its regions compiled or read from Inductor's cache)")
    for column in ("candidate", "regions shared", "a program each (before)"):
        times.add_column(column, justify="right")
    for name in shared:
        times.add_row(name, f"{together[name]:.2f}", f"{apart[name]:.2f}")
    times.add_row("in all", f"{sum(together.values()):.2f}", f"{sum(apart.values()):.2f}")
    Console().print(times)


if __name__ == "__main__":
    main()
