"""End to end: ``run_search`` on a fake heterogeneous Ray cluster, then cross-evaluation of what it wrote.

The cluster is conftest's ``ray_cluster`` (a head plus nodes advertising the custom resources ``V100`` and
``K80``), so the ``sim:v100`` and ``sim:k80`` actors are pinned to the nodes offering their GPU. ``warmup=0,
repeat=1`` keeps the sim actors' sleeps short.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from ios_ray.app.evaluation import cross_evaluate, winners_hold
from ios_ray.frontend import import_model
from ios_ray.ir import Graph
from ios_ray.runtime import read_schedules
from ios_ray.schedule import read_schedule
from ios_ray.scheduler import Plan
from ios_ray.app.job import SearchOutcome, SearchRequest, run_search, schedule_path
from ios_ray.store import LatencyStore

MODEL = "inception_v3"
DEVICES = ("sim:v100", "sim:k80")
BATCHES = (1, 32)
SETTINGS = [(device, batch) for device in DEVICES for batch in BATCHES]


class RecordingProgress:
    """A SearchProgress that remembers what it was told."""

    def __init__(self) -> None:
        self.stages: int | None = None
        self.started: dict[str, tuple[int, int]] = {}
        self.done: dict[str, int] = {}
        self.checked: list[tuple[str, int]] = []

    def planned(self, graph: Graph, plan: Plan) -> None:
        self.stages = len(plan.stages)

    def device_started(self, device: str, total: int, cached: int) -> None:
        self.started[device] = (total, cached)

    def advanced(self, device: str, done: int, total: int) -> None:
        self.done[device] = done

    def checking(self, device: str, batch: int) -> None:
        self.checked.append((device, batch))


@pytest.mark.slow
def test_search_on_a_heterogeneous_cluster_then_cross_evaluate(ray_cluster: Cluster, tmp_path: Path) -> None:
    store_path, out = tmp_path / "store.duckdb", tmp_path / "schedules"
    request = SearchRequest(
        model=MODEL, devices=DEVICES, batches=BATCHES, store=store_path, out=out, address=ray_cluster.address,
        warmup=0, repeat=1, measure="all",
    )
    progress = RecordingProgress()
    outcomes = run_search(request, progress)

    # One outcome and one schedule file per (device, batch), everything simulated and measured this time.
    stages = progress.stages
    assert stages is not None and stages > 100
    assert [(o.device, o.batch) for o in outcomes] == SETTINGS
    assert {o.source for o in outcomes} == {"simulated"}
    assert all(o.measured == stages and o.cached == 0 for o in outcomes)
    assert progress.started == {d: (stages * len(BATCHES), 0) for d in DEVICES}
    assert progress.done == {d: stages * len(BATCHES) for d in DEVICES}
    assert progress.checked == [] and all(o.end_to_end is None for o in outcomes)  # simulated: nothing to time
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert files == sorted(f"{MODEL}/{d}/bs{b}.json" for d, b in SETTINGS)
    for o in outcomes:
        assert o.path == schedule_path(out, MODEL, o.device, o.batch) and o.path.is_file()
        assert 0 < o.predicted_ms <= o.sequential_ms * (1 + 1e-9)

    # The store holds every stage for every setting, simulated only.
    stats = LatencyStore(store_path, create=False).stats().to_pylist()
    assert sorted((r["device"], r["batch"], r["source"], r["rows"]) for r in stats) == sorted(
        (d, b, "simulated", stages) for d, b in SETTINGS
    )

    # Each schedule is specialised: a schedule differs from the one for the other batch and the other device.
    graph = import_model(MODEL).graph
    schedules = {(o.device, o.batch): read_schedule(o.path) for o in outcomes}
    for (device, batch), schedule in schedules.items():
        assert schedule.source == "simulated" and schedule.graph_fingerprint == graph.fingerprint
        assert schedule.predicted_latency == pytest.approx(_outcome_for(outcomes, device, batch).predicted_ms)
    assert schedules[("sim:v100", 1)].stages != schedules[("sim:v100", 32)].stages
    assert schedules[("sim:v100", 1)].stages != schedules[("sim:k80", 1)].stages
    assert schedules[("sim:k80", 1)].stages != schedules[("sim:k80", 32)].stages

    # Cross-evaluation from the store: every schedule is the fastest on its own setting.
    store = LatencyStore(store_path, create=False)
    found = list(read_schedules(out).values())
    cells = cross_evaluate(found, graph, lambda keys, fp, batch: store.lookup(list(keys), fp, batch), {})
    assert len(cells) == len(SETTINGS) ** 2
    assert {c.how for c in cells} == {"simulated"} and all(c.latency_ms is not None for c in cells)
    assert winners_hold(cells) == {setting: True for setting in SETTINGS}
    for c in cells:
        if c.own:
            assert c.latency_ms == pytest.approx(schedules[c.made_for].predicted_latency)
    # ...and strictly faster than somebody else's schedule somewhere, or specialising would be pointless.
    assert any(
        own.latency_ms < other.latency_ms * (1 - 1e-6)
        for own in cells if own.own
        for other in cells if other.run_on == own.run_on and not other.own
    )

    # The evaluate command prints the same table.
    shown = subprocess.run(
        [sys.executable, "-m", "ios_ray", "evaluate", "--schedules", str(out), "--store", str(store_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr
    assert "cells are simulated;" in shown.stdout
    for device, batch in SETTINGS:
        assert f"{device} bs{batch}" in shown.stdout
        assert f"{device} bs{batch} yes" in shown.stdout
    assert " NO" not in shown.stdout

    # A second search on the same store measures nothing and predicts the same latencies.
    again = run_search(request, RecordingProgress())
    assert [(o.device, o.batch) for o in again] == SETTINGS
    assert all(o.measured == 0 and o.cached == stages for o in again)
    assert [o.predicted_ms for o in again] == [o.predicted_ms for o in outcomes]
    assert [o.sequential_ms for o in again] == [o.sequential_ms for o in outcomes]
    assert {o.source for o in again} == {"simulated"}
    assert {(o.device, o.batch): read_schedule(o.path).stages for o in again} == {
        setting: schedule.stages for setting, schedule in schedules.items()
    }
    assert LatencyStore(store_path, create=False).stats().to_pylist() == stats


def _outcome_for(outcomes: list[SearchOutcome], device: str, batch: int) -> SearchOutcome:
    return next(o for o in outcomes if o.device == device and o.batch == batch)
