"""The timing protocol, latency rows, the real backend, and dispatch to actors on the local Ray."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from typing import Any

import pytest
import ray
import torch

from ios_ray.devices import parse_device
from ios_ray.errors import UserError
from ios_ray.frontend import import_model
from ios_ray.ir import Graph
from ios_ray.paired import REPORT_CONFIDENCE, LookPlan
from ios_ray.profiler import CheckJob, DevicePool, MeasureJob, ModelSource
from ios_ray.profiler.actors import Built
from ios_ray.profiler.pool import Preparing
from ios_ray.profiler.protocol import DEFAULT_PROTOCOL, Timing
from ios_ray.profiler.real import RealBackend, random_inputs
from ios_ray.runtime.executor import ScheduleRunner
from ios_ray.profiler.timing import time_callable
from ios_ray.schedule import BlockSchedule, Schedule
from ios_ray.scheduler import greedy_stages, sequential_stages
from ios_ray.stage import Stage, StageKeys
from ios_ray.store.schema import STORE_SCHEMA, conform, rows_to_table
from ios_ray.vocabulary import MODEL_AS_IS_ROUNDS
from tests.helpers import actor_pid, killed, spec_source

#: The zoo's SqueezeNet, as actors build it.
SQUEEZENET = spec_source("squeezenet")


def jobs_for(graph: Graph, batches: tuple[int, ...] = (1, 8)) -> list[MeasureJob]:
    """Every single-unit stage, the heads as one concurrent stage, and a chain, at each batch size (no model code:
    for sim devices)."""
    model = ModelSource(graph.name, graph.input_shape)
    keys = StageKeys(graph)
    stages = [Stage("concurrent", ((u.id,),)) for u in graph.units]
    stages += [Stage("concurrent", (("b1",), ("b7a",), ("bda",), ("bp",))), Stage("concurrent", (("b7a", "b7b"),))]
    return [MeasureJob(keys.key(s), s, keys.describe_json(s), graph, model, b) for s in stages for b in batches]


def test_timing_protocol_orders_and_counts() -> None:
    calls = []
    x = torch.randn(32, 32)
    timing = time_callable(lambda: calls.append(x @ x), "cpu", warmup=2, repeat=7)
    assert len(calls) == 9
    assert timing.samples == timing.repeat == 7 and timing.warmup == 2
    assert 0 < timing.p10_ms <= timing.median_ms <= timing.p90_ms


def test_timing_defaults_and_bad_counts() -> None:
    timing = time_callable(lambda: None, torch.device("cpu"))
    assert (timing.warmup, timing.repeat) == DEFAULT_PROTOCOL["cpu"]
    assert DEFAULT_PROTOCOL["gpu"][1] > DEFAULT_PROTOCOL["cpu"][1]
    with pytest.raises(ValueError):
        time_callable(lambda: None, "cpu", repeat=0)


def test_timing_summary() -> None:
    timing = Timing.of_samples([5.0, 1.0, 3.0, 2.0, 4.0], warmup=1)
    assert (timing.median_ms, timing.p10_ms, timing.p90_ms, timing.samples) == (3.0, 1.4, 4.6, 5)


def test_random_inputs_cover_external_sources(small_graph: Graph) -> None:
    stage = Stage("concurrent", (("b7b", "b7c"), ("b1",)))
    env = random_inputs(small_graph, stage, 4, torch.float32, torch.device("cpu"))
    assert set(env) == {"b7a", "@input"}
    assert env["b7a"].shape == (4, 128, 17, 17) and env["@input"].shape == (4, 768, 17, 17)
    assert all(float((t == 0).float().mean()) < 1e-4 for t in env.values())  # random, not zero-filled (randn can hit 0.0)
    assert 0.9 < float(env["@input"].std()) < 1.1


def test_real_backend_measures_a_cpu_stage() -> None:
    graph = import_model("squeezenet").graph
    block = graph.blocks[1]
    stage = Stage("concurrent", ((block.units[0],),))
    keys = StageKeys(graph)
    backend = RealBackend(parse_device("cpu"), warmup=1, repeat=3)
    identity = backend.start()
    row = backend.measure(MeasureJob(keys.key(stage), stage, keys.describe_json(stage), graph, SQUEEZENET, 2))
    assert tuple(row) == tuple(STORE_SCHEMA.names)
    assert row["source"] == "measured" and row["device_fingerprint"] == identity.fingerprint
    assert 0 < row["p10_ms"] <= row["median_ms"] <= row["p90_ms"] and row["samples"] == 3


def test_a_real_backend_builds_a_model_before_measuring_and_says_which_graph_it_imported() -> None:
    backend = RealBackend(parse_device("cpu"))
    backend.start()
    assert backend.prepare(SQUEEZENET, "float32", "contiguous") == import_model("squeezenet").graph.fingerprint


def test_the_driver_waits_for_the_actors_build_and_refuses_a_problem_or_another_graph(ray_local: None) -> None:
    graph = import_model("squeezenet").graph

    def preparing(*built: Built) -> Preparing:
        return Preparing("squeezenet", [("cpu", ray.put(found)) for found in built], {"cpu": "node-7"})

    preparing(Built(graph.fingerprint), Built(None)).check(graph)  # the same graph, and a sim actor that built none
    with pytest.raises(UserError, match="^cannot unpickle it$"):
        preparing(Built(graph.fingerprint), Built(None, "cannot unpickle it")).check(graph)
    with pytest.raises(UserError, match="^model 'squeezenet' imports to a different graph on node-7 than on the driver"):
        preparing(Built("another")).check(graph)


def whole_schedules(graph: Graph, model: str) -> dict[str, Schedule]:
    """The sequential (``first``) and the greedy schedule (``second``, the baseline) of a graph, for the CPU at
    batch 2."""
    return {name: Schedule(model, graph.fingerprint, "cpu", 2, tuple(BlockSchedule(b.index, make(graph, b))
                                                                      for b in graph.blocks))
            for name, make in (("first", sequential_stages), ("second", greedy_stages))}


@pytest.mark.slow
def test_real_backend_times_two_whole_schedules_in_paired_rounds() -> None:
    graph = import_model("squeezenet").graph
    backend = RealBackend(parse_device("cpu"))
    timing = backend.time_schedules(CheckJob(SQUEEZENET, graph, whole_schedules(graph, "squeezenet"), "second", 2,
                                             rounds=8, as_is_rounds=MODEL_AS_IS_ROUNDS))
    assert timing.rounds in LookPlan.planned(8).looks and len(timing.times_ms["second"]) == timing.rounds
    assert all(ms > 0 for ms in (*timing.times_ms["first"], *timing.times_ms["second"])) and timing.ratios["first"].rounds == timing.rounds
    # The same forward pass either way: greedy's threads may cost or gain, but not an order of magnitude.
    assert 0.2 < timing.ratios["first"].median < 5
    # then the schedule kept (the baseline: 8 rounds at 99.9% cannot decide) against the model as is
    assert timing.kept == "second" and timing.as_is is not None
    assert timing.as_is.rounds in LookPlan.planned(MODEL_AS_IS_ROUNDS).looks and 0.2 < timing.as_is.ratio.median < 5
    assert timing.as_is.ratio.confidence == REPORT_CONFIDENCE
    alone = backend.time_schedules(CheckJob(SQUEEZENET, graph, whole_schedules(graph, "squeezenet"), "second", 2,
                                            rounds=2))
    assert alone.as_is is None and alone.rounds == 2

    other = import_model("inception_v3").graph
    with pytest.raises(UserError, match="another graph"):
        backend.time_schedules(CheckJob(SQUEEZENET, graph, whole_schedules(other, "squeezenet"), "second", 2,
                                               rounds=8))


def test_the_model_as_is_that_does_not_fit_beside_the_schedules_is_left_out_not_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    graph = import_model("squeezenet").graph
    backend = RealBackend(parse_device("cpu"))

    def out_of_memory(*args: Any, **kwargs: Any) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr("ios_ray.profiler.real.paired_timing", out_of_memory)
    timing = backend.time_schedules(CheckJob(SQUEEZENET, graph, whole_schedules(graph, "squeezenet"), "second", 2,
                                             rounds=2, as_is_rounds=MODEL_AS_IS_ROUNDS))
    assert timing.as_is is None and timing.rounds == 2 and timing.kept == "second"


def test_a_candidate_whose_first_calls_would_start_past_half_the_checks_time_is_left_out_and_never_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    graph = import_model("squeezenet").graph
    backend = RealBackend(parse_device("cpu"))
    first, second = whole_schedules(graph, "squeezenet").values()
    called: list[str] = []
    run = ScheduleRunner.__call__

    def counted(self: ScheduleRunner, x: torch.Tensor) -> torch.Tensor:
        called.append(next(name for name, s in schedules.items() if s is self.schedule))
        return run(self, x)

    monkeypatch.setattr(ScheduleRunner, "__call__", counted)
    schedules = {"first": first, "late": dataclasses.replace(first), "second": second}
    timing = backend.time_schedules(CheckJob(SQUEEZENET, graph, schedules, "second", 2, rounds=2,
                                             max_seconds=1e-9))
    assert timing.left_out == ("late",) and timing.times_ms["late"] == () and "late" not in called
    assert len(timing.times_ms["first"]) == len(timing.times_ms["second"]) >= 1  # the first candidate and the baseline


def test_a_check_takes_over_the_last_checks_kept_runner_where_it_runs_the_same_schedule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel choice's kept sequential schedule comes back as the check's baseline: built once (inductor regions
    compile in seconds), not twice; a runner of other stages or another program is built anew."""
    graph = import_model("squeezenet").graph
    backend = RealBackend(parse_device("cpu"))
    built: list[ScheduleRunner] = []

    def counted(*args: Any, **kwargs: Any) -> ScheduleRunner:
        built.append(ScheduleRunner(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr("ios_ray.profiler.real.ScheduleRunner", counted)
    first, second = whole_schedules(graph, "squeezenet").values()
    timing = backend.time_schedules(CheckJob(SQUEEZENET, graph, {"first": first, "second": second}, "second", 2,
                                             rounds=2))
    assert timing.kept == "second" and len(built) == 2  # two rounds cannot decide: the baseline is kept
    kept = built[1]
    timing = backend.time_schedules(CheckJob(SQUEEZENET, graph, {"again": second, "new": first}, "again", 2,
                                             rounds=2))
    assert len(built) == 3 and built[2].schedule is first and kept.schedule.stages == second.stages
    assert all(ms > 0 for ms in timing.times_ms["again"])  # the runner taken over ran the baseline's rounds
    fused = dataclasses.replace(second, kernels="fused")
    backend.time_schedules(CheckJob(SQUEEZENET, graph, {"fused": fused, "first": first}, "first", 2, rounds=2))
    assert len(built) == 5  # another program (the kept "again" was the last job's; these run other kernels or stages)


@pytest.mark.slow
def test_pool_times_schedules_where_the_device_is_real(ray_local: None) -> None:
    graph = import_model("squeezenet").graph
    job = CheckJob(SQUEEZENET, graph, whole_schedules(graph, "squeezenet"), "second", 1, rounds=8)
    with DevicePool.start(["cpu", "sim:v100"], warmup=0, repeat=1) as pool:
        timing = pool.time_schedules("cpu", job)
        assert timing.rounds >= LookPlan.planned(8).looks[0] and timing.ratios["first"].median > 0
        with pytest.raises(UserError, match=r"^sim:v100 is simulated, so its schedules cannot be timed end to end\.$"):
            pool.time_schedules("sim:v100", job)


@pytest.mark.slow
@pytest.mark.parametrize("restarts", (1, 0))
def test_an_actor_killed_during_the_end_to_end_check_is_given_the_check_again(ray_local: None, restarts: int) -> None:
    graph = import_model("squeezenet").graph
    job = CheckJob(SQUEEZENET, graph, whole_schedules(graph, "squeezenet"), "second", 1, rounds=2)
    with DevicePool.start(["cpu"], warmup=0, repeat=1, max_restarts=restarts) as pool:
        actor = pool.actors("cpu")[0]
        pid, kill_after_s = actor_pid(actor), 0.2  # the check imports the model first: longer than that
        killer = threading.Timer(kill_after_s, os.kill, (pid, signal.SIGKILL))
        started = time.monotonic()
        killer.start()
        if restarts:
            timing = pool.time_schedules("cpu", job)
            assert time.monotonic() - started > kill_after_s  # the kill came while the check ran
            assert timing.rounds == 2 and all(ms > 0 for ms in (*timing.times_ms["first"], *timing.times_ms["second"]))
            assert actor_pid(actor) != pid  # restarted, and the check given to it again
            return
        with pytest.raises(UserError) as error:
            pool.time_schedules("cpu", job)
    assert str(error.value) == (
        "every actor of 'cpu' died while timing the schedules of squeezenet end to end at batch 1 (killed or crashed, "
        "out of memory perhaps, each after up to 0 restarts); the measured stages were kept, so run the search again.")


@pytest.mark.slow
def test_pool_measures_every_job_once(ray_local: None, small_graph: Graph) -> None:
    jobs = jobs_for(small_graph)
    rows: list[dict[str, Any]] = []
    progress: dict[str, list[tuple[int, int]]] = {}
    with DevicePool.start(["sim:v100", "sim:a100"], warmup=1, repeat=2) as pool:
        fingerprints = {label: identity.fingerprint for label, identity in pool.identities().items()}
        assert len(pool.actors("sim:v100")) == 2
        report = pool.measure(
            {"sim:v100": jobs, "sim:a100": jobs + jobs[:5]}, rows.extend,
            lambda device, done, total: progress.setdefault(device, []).append((done, total)),
        )
    unique = {(job.key, job.batch, job.dtype) for job in jobs}  # all of them eager kernels
    assert report.complete and report.done == report.total == {"sim:v100": len(unique), "sim:a100": len(unique)}
    for device in ("sim:v100", "sim:a100"):
        measured = [(r["stage_key"], r["batch"], r["dtype"]) for r in rows if r["device"] == device]
        assert sorted(measured) == sorted(unique)
        steps = progress[device]
        assert steps[0] == (0, len(unique)) and steps[-1] == (len(unique), len(unique))
        assert [done for done, _ in steps] == sorted(done for done, _ in steps)
    assert all(tuple(r) == tuple(STORE_SCHEMA.names) and r["source"] == "simulated" for r in rows)
    assert all(r["device_fingerprint"] == fingerprints[r["device"]] for r in rows)


@pytest.mark.slow
def test_rows_fit_the_store_schema(ray_local: None, small_graph: Graph) -> None:
    rows: list[dict[str, Any]] = []
    with DevicePool.start(["sim:2080ti"], warmup=0, repeat=1) as pool:
        pool.measure({"sim:2080ti": jobs_for(small_graph)[:6]}, rows.extend)
    assert conform(rows_to_table(rows)).num_rows == 6


def test_cpu_pool_measures_for_real(ray_local: None) -> None:
    graph = import_model("squeezenet").graph
    keys = StageKeys(graph)
    stages = [Stage("concurrent", ((u,),)) for u in graph.blocks[1].units]
    jobs = [MeasureJob(keys.key(s), s, keys.describe_json(s), graph, SQUEEZENET, 1) for s in stages]
    rows: list[dict[str, Any]] = []
    with DevicePool.start(["cpu"], warmup=1, repeat=2) as pool:
        assert pool.identities()["cpu"].info["threads"] == ray.cluster_resources()["CPU"]
        report = pool.measure({"cpu": jobs}, rows.extend)
    assert report.complete and {r["source"] for r in rows} == {"measured"} and len(rows) == len(jobs)


@pytest.mark.slow
def test_ctrl_c_returns_what_was_finished(ray_local: None, small_graph: Graph) -> None:
    rows: list[dict[str, Any]] = []

    def interrupt_after_four(device: str, done: int, total: int) -> None:
        if done >= 4:
            raise KeyboardInterrupt

    pool = DevicePool.start(["sim:h100"], warmup=1, repeat=2)
    actors = pool.actors("sim:h100")
    jobs = jobs_for(small_graph, (1, 8, 32, 128))
    report = pool.measure({"sim:h100": jobs}, rows.extend, interrupt_after_four, batch_size=2)
    assert report.interrupted and not report.complete
    assert report.done["sim:h100"] == len(rows) == 4 < report.total["sim:h100"]
    assert killed(actors[0])  # the pool killed its actors


def test_unknown_and_unoffered_devices_fail_before_an_actor_starts(ray_local: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def no_actor(*args: object) -> None:
        raise AssertionError("an actor was started for devices that must fail first")

    monkeypatch.setattr("ios_ray.profiler.pool.start_actor", no_actor)
    with pytest.raises(UserError, match="known devices"):
        DevicePool.start(["cpu", "p100"])
    with pytest.raises(UserError) as error:
        DevicePool.start(["sim:v100", "k80"])
    assert str(error.value) == ("no node offers device 'k80': this cluster offers cpu, sim:*; search sim:k80 to "
                                "simulate it, or join a cluster that has one with --address (address= in Python; "
                                "cluster.yaml starts one).")
    with pytest.raises(UserError, match="cuda"):
        DevicePool.start(["cuda:0"])


@pytest.mark.slow
def test_jobs_for_devices_without_actors_are_refused(ray_local: None, small_graph: Graph) -> None:
    with DevicePool.start(["sim:v100"], sim_actors=1) as pool:
        with pytest.raises(UserError, match="sim:k80"):
            pool.measure({"sim:k80": jobs_for(small_graph)}, lambda rows: None)


@pytest.mark.slow
def test_a_stage_error_in_an_actor_is_one_sentence(ray_local: None, small_graph: Graph) -> None:
    jobs = [dataclasses.replace(job, dtype="float16") for job in jobs_for(small_graph)[:2]]
    with DevicePool.start(["sim:v100"], sim_actors=1) as pool:
        with pytest.raises(UserError, match="float32 only"):
            pool.measure({"sim:v100": jobs}, lambda rows: None)


@pytest.mark.slow
def test_a_lone_actor_killed_while_measuring_is_restarted_and_finishes_the_stages(
    ray_local: None, small_graph: Graph
) -> None:
    """While Ray restarts an actor every call to it fails at once; those failures are no deaths of their own."""
    rows: list[dict[str, Any]] = []
    jobs = jobs_for(small_graph, (1, 8, 32))
    with DevicePool.start(["sim:v100"], sim_actors=1, max_restarts=3) as pool:
        actor = pool.actors("sim:v100")[0]
        pid = actor_pid(actor)

        def kill_after_first(batch: list[dict[str, Any]]) -> None:
            if not rows:
                os.kill(pid, signal.SIGKILL)
            rows.extend(batch)

        report = pool.measure({"sim:v100": jobs}, kill_after_first, batch_size=2)
        assert actor_pid(actor) != pid
    assert report.complete and report.rerun >= 1
    assert len(rows) == len({job.measurement for job in jobs})


@pytest.mark.slow
def test_a_device_whose_actors_all_die_is_reported(ray_local: None, small_graph: Graph) -> None:
    rows: list[dict[str, Any]] = []
    with DevicePool.start(["sim:v100"], sim_actors=1, max_restarts=0) as pool:
        pid = actor_pid(pool.actors("sim:v100")[0])

        def kill_after_first(batch: list[dict[str, Any]]) -> None:
            if not rows:
                os.kill(pid, signal.SIGKILL)
            rows.extend(batch)

        with pytest.raises(UserError, match="every actor of 'sim:v100' died") as error:
            pool.measure({"sim:v100": jobs_for(small_graph, (1, 8, 32))}, kill_after_first, batch_size=2)
    assert len(rows) >= 2 and "run the search again" in str(error.value)
