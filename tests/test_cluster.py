"""Everything on a heterogeneous Ray cluster: placing actors, measuring while an actor's process is killed, and a
search end to end followed by cross-evaluation of what it wrote.

The tests that need a cluster share conftest's ``ray_cluster`` (a head plus nodes advertising the custom resources
``V100``, ``K80`` and ``2080Ti``), started once for this module; ``sim:v100`` and ``sim:k80`` actors are pinned to
the nodes offering their GPU. ``warmup=0, repeat=1`` keeps the sim actors' sleeps short.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster

from ios_ray.app.cli.evaluation import Cell, cross_evaluate, winners_hold
from ios_ray.app.search.job import SearchRequest, run_search
from ios_ray.app.search.outcome import SearchOutcome
from ios_ray.app.search.progress import SilentProgress
from ios_ray.devices import parse_device
from ios_ray.errors import UserError
from ios_ray.frontend import import_model
from ios_ray.ir import Graph
from ios_ray.profiler import DevicePool, MeasureJob, ModelSource
from ios_ray.profiler.cluster import Node, check_offered, local_node, offered_labels, plan, plan_all
from ios_ray.runtime import read_schedules
from ios_ray.schedule import read_schedule, schedule_path
from ios_ray.scheduler import Plan
from ios_ray.stage import Stage, StageKeys
from ios_ray.store import LatencyStore
from tests.helpers import actor_pid, ios_ray_here

SIM_LABELS = ("sim:v100", "sim:k80", "sim:2080ti")

HEAD_ID, V100_ID, K80_ID, FAKE_ID = ("a" * 56, "b" * 56, "c" * 56, "d" * 56)
HEAD = Node(HEAD_ID, {"CPU": 8}, is_driver=True)
V100_NODE = Node(V100_ID, {"CPU": 16, "GPU": 4, "accelerator_type:V100": 1})
K80_NODE = Node(K80_ID, {"CPU": 4, "GPU": 2, "K80": 2})
FAKE_2080TI = Node(FAKE_ID, {"CPU": 0, "2080Ti": 1})


def test_gpu_actors_one_per_gpu_pinned_to_its_node() -> None:
    v100 = plan(parse_device("v100"), [HEAD, V100_NODE, K80_NODE])
    assert len(v100) == 4 and {p.node_id for p in v100} == {V100_ID}
    assert v100[0].num_gpus == 1 and v100[0].resources == {"accelerator_type:V100": 0.001}
    k80 = plan(parse_device("k80"), [HEAD, V100_NODE, K80_NODE])
    assert len(k80) == 2 and k80[0].resources == {"K80": 1}
    assert "scheduling_strategy" in k80[0].options()
    assert plan(parse_device("2080ti"), [HEAD, FAKE_2080TI]) == []


def test_sim_actors_follow_their_gpu_or_float() -> None:
    nodes = [HEAD, V100_NODE, K80_NODE, FAKE_2080TI]
    assert [p.node_id for p in plan(parse_device("sim:k80"), nodes)] == [K80_ID] * 2
    assert [p.node_id for p in plan(parse_device("sim:v100"), nodes)] == [V100_ID] * 4
    assert plan(parse_device("sim:2080ti"), nodes)[0].resources == {"2080Ti": 1}
    floating = plan(parse_device("sim:h100"), nodes, sim_actors=3)
    assert len(floating) == 3 and all(p.node_id is None and p.num_cpus == 0 for p in floating)
    assert "scheduling_strategy" not in floating[0].options()


def test_cpu_actor_takes_its_node_less_the_gpu_actors() -> None:
    placements = plan_all([parse_device("cpu"), parse_device("v100")], [HEAD, V100_NODE])
    cpu = {p.node_id: p.num_cpus for p in placements if p.label == "cpu"}
    assert cpu == {HEAD_ID: 8, V100_ID: 12}


def test_a_setting_whose_own_cell_is_missing_is_neither_won_nor_lost() -> None:
    a, b = ("sim:v100", 1), ("sim:v100", 8)
    cells = [Cell(a, a, None, "simulated"), Cell(b, a, 2.0, "simulated"), Cell(a, b, 3.0, "simulated"),
             Cell(b, b, 4.0, "simulated")]
    assert winners_hold(cells) == {a: None, b: False}  # a lacks a stage of its own schedule: nothing can be said


def test_cuda_means_the_driver_node() -> None:
    driver_with_gpus = Node("e" * 56, {"CPU": 4, "GPU": 2}, is_driver=True)
    assert len(plan(parse_device("cuda"), [driver_with_gpus, V100_NODE])) == 2
    [one] = plan(parse_device("cuda:1"), [driver_with_gpus])
    assert one.options()["runtime_env"] == {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    assert plan(parse_device("cuda:2"), [driver_with_gpus]) == []
    assert plan(parse_device("cuda"), [HEAD, V100_NODE]) == []


def test_offered_labels_and_the_sentence() -> None:
    nodes = [HEAD, V100_NODE, K80_NODE, FAKE_2080TI]
    assert offered_labels(nodes) == ["cpu", "k80", "v100", "sim:*"]
    with pytest.raises(UserError) as error:
        check_offered([parse_device("sim:a100"), parse_device("2080ti")], nodes)
    assert str(error.value) == (
        "no node offers device '2080ti': this cluster offers cpu, k80, v100, sim:*; a node advertises 2080Ti but gives "
        "Ray no GPU to measure it on, so start that node with --num-gpus, or search sim:2080ti to simulate it.")
    with pytest.raises(UserError) as error:
        check_offered([parse_device("a100")], nodes, "the Ray cluster at 10.0.0.1:6379")
    assert str(error.value) == (
        "no node offers device 'a100': the Ray cluster at 10.0.0.1:6379 offers cpu, k80, v100, sim:*; search sim:a100 "
        "to simulate it, or join a cluster that has one with --address (address= in Python; cluster.yaml starts one).")


def test_cuda_on_a_driver_without_gpus_names_what_to_search_instead() -> None:
    with pytest.raises(UserError) as error:
        check_offered([parse_device("cuda")], [HEAD])
    assert str(error.value) == ("no node offers device 'cuda': this cluster offers cpu, sim:*; search cpu or a sim: "
                                "device here, or run the search on a machine with a GPU.")
    with pytest.raises(UserError, match="GPUs cuda:0 to cuda:1, so name one of those"):
        check_offered([parse_device("cuda:2")], [Node("e" * 56, {"CPU": 4, "GPU": 2}, is_driver=True)])


def test_this_machine_is_foreseen_as_a_local_ray_would_see_it() -> None:
    node = local_node()
    assert node.is_driver and node.count("CPU") >= 1
    assert ("cuda" in offered_labels([node])) == (node.count("GPU") > 0)
    assert "v100" not in offered_labels([node]) or node.count("GPU")


def plan_jobs(graph: Graph) -> list[MeasureJob]:
    """Single-unit and head stages of the small graph at four batch sizes."""
    keys = StageKeys(graph)
    stages = [Stage("concurrent", ((u.id,),)) for u in graph.units[:-1]]
    stages += [Stage("concurrent", (("b1",), ("b7a",), ("bda",), ("bp",))), Stage("merge", (("b1",), ("bp",)))]
    source = ModelSource(graph.name, graph.input_shape)
    return [MeasureJob(keys.key(s), s, keys.describe_json(s), graph, source, b) for s in stages for b in (1, 4, 16, 64)]


@pytest.mark.slow
def test_cluster_survives_a_killed_actor(ray_cluster: Cluster, small_graph: Graph) -> None:
    jobs = plan_jobs(small_graph)
    rows: list[dict[str, Any]] = []
    killed: list[int] = []
    with DevicePool.start(SIM_LABELS, warmup=2, repeat=10) as pool:
        assert {label: len(pool.actors(label)) for label in SIM_LABELS} == {
            "sim:v100": 2, "sim:k80": 2, "sim:2080ti": 1,
        }
        victim = actor_pid(pool.actors("sim:k80")[0])

        def kill_once(batch: list[dict[str, Any]]) -> None:
            rows.extend(batch)
            if not killed and any(r["device"] == "sim:k80" for r in batch):
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)

        report = pool.measure({label: jobs for label in SIM_LABELS}, kill_once, batch_size=3)
    assert killed and report.complete and report.rerun >= 1
    unique = sorted({(job.key, job.batch, job.dtype) for job in jobs})  # all of them eager kernels
    for label in SIM_LABELS:
        measured = [(r["stage_key"], r["batch"], r["dtype"]) for r in rows if r["device"] == label]
        assert sorted(measured) == unique


@pytest.mark.slow
def test_cluster_refuses_a_device_it_lacks_before_starting_an_actor(ray_cluster: Cluster,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def no_actor(*args: object) -> None:
        raise AssertionError("an actor was started for a search that must fail first")

    monkeypatch.setattr("ios_ray.profiler.pool.start_actor", no_actor)
    with pytest.raises(UserError) as error:
        DevicePool.start(["sim:v100", "v100"])
    assert str(error.value).startswith("no node offers device 'v100': this cluster offers cpu, sim:*; a node "
                                       "advertises V100 but gives Ray no GPU")


# ------------------------------------------------------------------ a search end to end on the cluster

#: A model whose schedules differ by batch and device on the simulated V100 and K80 (SqueezeNet's 89 stages: a
#: search of every stage in seconds).
MODEL = "squeezenet"
DEVICES = ("sim:v100", "sim:k80")
BATCHES = (1, 32)
SETTINGS = [(device, batch) for device in DEVICES for batch in BATCHES]


class RecordingProgress(SilentProgress):
    """A SearchProgress that remembers what it was told."""

    def __init__(self) -> None:
        self.clusters: list[str] = []
        self.stages: int | None = None
        self.started: dict[str, tuple[int, int]] = {}
        self.done: dict[str, int] = {}
        self.checked: list[tuple[str, int]] = []
        self.chose: list[tuple[str, int]] = []
        self.kept_lines: list[str] = []

    def cluster(self, summary: str) -> None:
        self.clusters.append(summary)

    def planned(self, graph: Graph, plan: Plan) -> None:
        self.stages = len(plan.stages)

    def device_started(self, device: str, total: int, cached: int) -> None:
        self.started[device] = (total, cached)

    def advanced(self, device: str, done: int, total: int) -> None:
        self.done[device] = done

    def choosing_kernels(self, device: str, batch: int) -> None:
        self.chose.append((device, batch))

    def checking(self, device: str, batch: int) -> None:
        self.checked.append((device, batch))

    def kept(self, outcome: SearchOutcome) -> None:
        self.kept_lines.append(outcome.summary())


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
    assert stages is not None and stages > 50
    assert [(o.device, o.batch) for o in outcomes] == SETTINGS
    assert {o.source for o in outcomes} == {"simulated"}
    assert all(o.measured == stages and o.cached == 0 for o in outcomes)
    assert progress.started == {d: (stages * len(BATCHES), 0) for d in DEVICES}
    assert progress.done == {d: stages * len(BATCHES) for d in DEVICES}
    assert progress.checked == [] and all(o.end_to_end is None for o in outcomes)  # simulated: nothing to time
    [cluster] = progress.clusters  # said once, first: the Ray the test connected to, its four nodes
    assert cluster.startswith("cluster: the Ray at ") and ": 4 nodes, 1 CPU, no GPU; devices offered: cpu, sim:*" \
        in cluster
    assert progress.kept_lines == [o.summary() for o in outcomes]  # a line per setting, as each is decided
    assert [line.split(";")[0] for line in progress.kept_lines] == [
        f"{d} batch {b}: kept IOS: simulated, so nothing to time end to end" for d, b in SETTINGS]
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert files == sorted(f"{MODEL}/{d.replace(':', '-')}/bs{b}.json" for d, b in SETTINGS)
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
    cells = cross_evaluate(found, graph, lambda keys, fp, batch, dtype: store.lookup(list(keys), fp, batch, dtype), {})
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
    shown = ios_ray_here("evaluate", "--schedules", str(out), "--store", str(store_path), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr
    assert "cells are simulated;" in shown.stdout
    for device, batch in SETTINGS:
        assert f"{device} bs{batch}" in shown.stdout
        assert f"{device} bs{batch} yes" in shown.stdout
    assert " NO" not in shown.stdout
    # Given another store, which lacks their stages, it says so rather than that the schedules lost.
    elsewhere = ios_ray_here("evaluate", "--schedules", str(out), "--store", str(tmp_path / "other.duckdb"),
                             cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert " NO" not in elsewhere.stdout and f"{DEVICES[0]} bs{BATCHES[0]} -" in elsewhere.stdout
    assert "lacks a stage of every schedule here; pass the store their search wrote (--store)" in elsewhere.stdout

    # A second search on the same store measures nothing and predicts the same latencies.
    progress = RecordingProgress()
    again = run_search(request, progress)
    assert [(o.device, o.batch) for o in again] == SETTINGS
    assert all(o.measured == 0 and o.cached == stages for o in again)
    assert progress.started == {d: (0, stages * len(BATCHES)) for d in DEVICES}  # the bars' cached: the table's
    assert [o.predicted_ms for o in again] == [o.predicted_ms for o in outcomes]
    assert [o.sequential_ms for o in again] == [o.sequential_ms for o in outcomes]
    assert {o.source for o in again} == {"simulated"}
    assert {(o.device, o.batch): read_schedule(o.path).stages for o in again} == {
        setting: schedule.stages for setting, schedule in schedules.items()
    }
    assert LatencyStore(store_path, create=False).stats().to_pylist() == stats


def _outcome_for(outcomes: list[SearchOutcome], device: str, batch: int) -> SearchOutcome:
    return next(o for o in outcomes if o.device == device and o.batch == batch)
