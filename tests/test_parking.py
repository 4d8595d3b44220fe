"""A pool that ends cleanly parks its CPU and simulated actors for the next pool of this process
(ios_ray.profiler.parking): taken back where they fit, renewed, killed where they fit none, died, or waited too long."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import ray

from ios_ray.app.search.job import _pool
from ios_ray.ir import Graph
from ios_ray.profiler import DevicePool, parking
from ios_ray.profiler.cluster import Placement
from ios_ray.profiler.parking import parking_key
from tests.conftest import _init_local_ray
from tests.helpers import HANG_S, actor_pid, killed
from tests.test_profiler import jobs_for


@pytest.fixture(autouse=True)
def nothing_parked() -> Any:
    """Each test starts and ends with no actor parked."""
    parking.release()
    yield
    parking.release()


def test_the_next_pool_takes_the_parked_actor_renewed_with_its_own_protocol(ray_local: None,
                                                                             small_graph: Graph) -> None:
    pool = DevicePool.start(["sim:v100"], sim_actors=1, warmup=0, repeat=1)
    [first] = pool.actors("sim:v100")
    pid = actor_pid(first)
    pool.park()
    assert pool.actors("sim:v100") == []  # the pool is over: its actors are the parking's
    rows: list[dict[str, Any]] = []
    with DevicePool.start(["sim:v100"], sim_actors=1, warmup=1, repeat=3) as again:
        [taken] = again.actors("sim:v100")
        assert taken == first and actor_pid(taken) == pid
        again.measure({"sim:v100": jobs_for(small_graph)[:2]}, rows.extend)
    assert [(row["warmup"], row["repeat"]) for row in rows] == [(1, 3)] * 2  # the new pool's protocol, not the old
    assert killed(first)  # the `with` shut it down: nothing parked


def test_a_parked_actor_that_fits_no_planned_one_is_killed_before_the_next_pool_starts(ray_local: None) -> None:
    pool = DevicePool.start(["sim:v100"], sim_actors=1)
    [first] = pool.actors("sim:v100")
    pool.park()
    with DevicePool.start(["sim:k80"], sim_actors=1) as other:
        [started] = other.actors("sim:k80")
        assert started != first
        assert killed(first)


def test_a_parked_actor_that_died_is_replaced_by_a_fresh_one(ray_local: None) -> None:
    pool = DevicePool.start(["sim:v100"], sim_actors=1)
    [first] = pool.actors("sim:v100")
    pool.park()
    ray.kill(first, no_restart=True)
    with DevicePool.start(["sim:v100"], sim_actors=1) as again:
        [fresh] = again.actors("sim:v100")
        assert fresh != first and again.identities()["sim:v100"].fingerprint


def test_a_stop_while_a_parked_actor_renews_kills_it(ray_local: None, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = DevicePool.start(["sim:v100"], sim_actors=1)
    [first] = pool.actors("sim:v100")
    pool.park()

    def stopped(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(ray, "get", stopped)  # the Ctrl-C lands while the pool waits for the renewal
        with pytest.raises(KeyboardInterrupt):
            DevicePool.start(["sim:v100"], sim_actors=1)
    assert parking._lot is None and killed(first)


def test_actors_parked_on_an_earlier_connection_to_ray_are_not_taken(ray_local: None) -> None:
    pool = DevicePool.start(["sim:v100"], sim_actors=1)
    pool.park()
    ray.shutdown()  # the actors go with the driver that owned them
    _init_local_ray()
    with DevicePool.start(["sim:v100"], sim_actors=1) as again:
        assert again.identities()["sim:v100"].fingerprint  # a fresh actor, no call to one that has gone
    assert parking._lot is None


def test_a_parked_cpu_actor_gives_its_cpus_back_after_park_s(ray_local: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parking, "PARK_S", 0.5)
    cpus = ray.cluster_resources()["CPU"]
    pool = DevicePool.start(["cpu"])
    [actor] = pool.actors("cpu")
    pool.park()
    assert parking._lot is not None and parking._lot.actors[0][1] == actor  # parked, holding the node's CPUs
    assert killed(actor)
    deadline = time.monotonic() + HANG_S
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ray.available_resources().get("CPU", 0) == cpus and parking._lot is None


def test_a_search_parks_its_pool_only_where_it_ends_without_an_error(ray_local: None) -> None:
    plan = SimpleNamespace(labels=("sim:v100",), sim_actors=1, warmup=None, repeat=None)
    with pytest.raises(KeyboardInterrupt), _pool(plan) as pool:  # type: ignore[arg-type]
        [stopped] = pool.actors("sim:v100")
        raise KeyboardInterrupt
    assert parking._lot is None and killed(stopped)
    with _pool(plan) as pool:  # type: ignore[arg-type]
        [ended] = pool.actors("sim:v100")
    assert parking._lot is not None and [actor for _, actor in parking._lot.actors] == [ended]


def test_gpu_actors_are_never_parked_and_a_cpu_actor_parks_under_its_own_share() -> None:
    assert parking_key(Placement("v100", "node", num_cpus=1, num_gpus=1), 3) is None
    assert parking_key(Placement("cuda", "node", num_cpus=1, num_gpus=1), 3) is None
    whole, less_one = Placement("cpu", "node", num_cpus=16), Placement("cpu", "node", num_cpus=15)
    assert parking_key(whole, 3) is not None and parking_key(whole, 3) != parking_key(less_one, 3)
    assert parking_key(whole, 3) != parking_key(whole, 0)  # and its restart budget
