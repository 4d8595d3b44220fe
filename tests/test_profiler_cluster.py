"""Placing actors on a heterogeneous cluster, and measuring on it while an actor's process is killed."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from ios_ray.devices import parse_device
from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.profiler import DevicePool, MeasureJob, ModelSource
from ios_ray.profiler.cluster import Node, check_offered, offered_labels, plan, plan_all
from ios_ray.stage import Stage, StageKeys

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
    assert str(error.value) == "no node offers device '2080ti'; this cluster offers: cpu, k80, v100, sim:*."


def plan_jobs(graph: Graph) -> list[MeasureJob]:
    """Single-unit and head stages of the small graph at four batch sizes."""
    keys = StageKeys(graph)
    stages = [Stage("concurrent", ((u.id,),)) for u in graph.units[:-1]]
    stages += [Stage("concurrent", (("b1",), ("b7a",), ("bda",), ("bp",))), Stage("merge", (("b1",), ("bp",)))]
    return [MeasureJob(keys.key(s), s, keys.describe_json(s), graph, ModelSource(graph.name, graph.input_shape), b) for s in stages for b in (1, 4, 16, 64)]


def test_cluster_survives_a_killed_actor(ray_cluster: Cluster, small_graph: Graph) -> None:
    jobs = plan_jobs(small_graph)
    rows: list[dict[str, Any]] = []
    killed: list[int] = []
    with DevicePool.start(SIM_LABELS, warmup=2, repeat=10) as pool:
        assert {label: len(pool.actors(label)) for label in SIM_LABELS} == {
            "sim:v100": 2, "sim:k80": 2, "sim:2080ti": 1,
        }
        victim = ray.get(pool.actors("sim:k80")[0].pid.remote())

        def kill_once(batch: list[dict[str, Any]]) -> None:
            rows.extend(batch)
            if not killed and any(r["device"] == "sim:k80" for r in batch):
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)

        report = pool.measure({label: jobs for label in SIM_LABELS}, kill_once, batch_size=3)
    assert killed and report.complete and report.rerun >= 1
    unique = sorted({job.measurement for job in jobs})
    for label in SIM_LABELS:
        measured = [(r["stage_key"], r["batch"], r["dtype"]) for r in rows if r["device"] == label]
        assert sorted(measured) == unique


def test_cluster_refuses_a_device_it_lacks_within_seconds(ray_cluster: Cluster) -> None:
    start = time.monotonic()
    with pytest.raises(UserError) as error:
        DevicePool.start(["sim:v100", "v100"])
    assert time.monotonic() - start < 10
    assert str(error.value) == "no node offers device 'v100'; this cluster offers: cpu, sim:*."
