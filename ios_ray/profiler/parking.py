"""The actors of the last search, kept warm for the next search of this process.

A fresh actor spends seconds before it measures anything (its process imports torch, Ray and ios-ray; its first
model build imports torch.export's machinery; its first compile, Inductor's): most of a small search's time, and paid
again by every search of a notebook or a test session. So a pool that ends cleanly parks its CPU and simulated actors
(:func:`park`) for :data:`PARK_S` seconds; the next pool started meanwhile on the same Ray takes those whose placement
it plans too (:func:`take`: each renews its backend, so no model, program or setting of the last search carries over)
and kills the others before it starts its own. Unused for :data:`PARK_S`, they are killed: a parked CPU actor holds
its node's CPUs against other Ray work for that long at most. GPU actors are never parked (each holds a CUDA context
in GPU memory), nor are the actors of a pool that failed or was stopped.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError

from ios_ray.profiler.cluster import Placement

#: Seconds a parked actor waits for the next search before it is killed.
PARK_S = 30.0
#: Seconds a parked actor has to renew its backend before it is given up (killed) and a fresh one started instead.
RENEW_TIMEOUT_S = 10.0

#: What makes a parked actor fit a planned one: its placement and restart budget.
ParkingKey = Hashable


def parking_key(placement: Placement, max_restarts: int) -> ParkingKey | None:
    """The key under which an actor of ``placement`` parks (None: it is never parked, a GPU actor)."""
    if placement.num_gpus:
        return None
    return (placement.label, placement.node_id, placement.num_cpus, tuple(sorted(placement.resources.items())),
            tuple(sorted(placement.env.items())), max_restarts)


@dataclass
class _Lot:
    """The parked actors: the Ray connection they live on (:func:`_connection`), each with its key, and the timer that
    kills them."""

    connection: tuple[str, str]
    actors: list[tuple[ParkingKey, ActorHandle[Any]]]
    timer: threading.Timer = field(init=False)


_lot: _Lot | None = None
_lock = threading.Lock()


def park(actors: Sequence[tuple[ParkingKey, ActorHandle[Any]]]) -> None:
    """Keep these actors for the next pool of this process, for :data:`PARK_S` seconds (replacing any parked)."""
    global _lot
    if not actors:
        return
    lot = _Lot(_connection(), list(actors))
    lot.timer = threading.Timer(PARK_S, _release_if, args=(lot,))
    lot.timer.daemon = True
    with _lock:
        earlier, _lot = _lot, lot
    _release(earlier)
    lot.timer.start()


def take(placements: Sequence[Placement], max_restarts: int, warmup: int | None,
         repeat: int | None) -> dict[int, ActorHandle[Any]]:
    """The parked actors that fit ``placements`` (by index), each renewed with ``warmup`` and ``repeat``; the parked
    actors that fit none, or failed to renew, are killed."""
    global _lot
    with _lock:
        lot, _lot = _lot, None
    if lot is None:
        return {}
    lot.timer.cancel()
    if not _ours(lot):
        return {}  # they went with the driver that owned them
    free = list(lot.actors)
    fits: dict[int, ActorHandle[Any]] = {}
    for index, placement in enumerate(placements):
        key = parking_key(placement, max_restarts)
        match = None if key is None else next((i for i, (k, _) in enumerate(free) if k == key), None)
        if match is not None:
            fits[index] = free.pop(match)[1]
    kill([actor for _, actor in free])
    return _renewed(fits, warmup, repeat)


def release() -> None:
    """Kill the parked actors now (none parked: nothing)."""
    take([], 0, None, None)


def _renewed(fits: dict[int, ActorHandle[Any]], warmup: int | None,
             repeat: int | None) -> dict[int, ActorHandle[Any]]:
    """The actors that renewed their backend in time; the others killed."""
    calls = {index: actor.renew.remote(warmup, repeat) for index, actor in fits.items()}
    renewed = {}
    try:
        for index, call in calls.items():
            try:
                ray.get(call, timeout=RENEW_TIMEOUT_S)
                renewed[index] = fits[index]
            except (GetTimeoutError, RayActorError):
                kill([fits[index]])
    except BaseException:  # a stop (Ctrl-C) while they renew: none is left holding its node's CPUs
        kill(list(fits.values()))
        raise
    return renewed


def _release_if(lot: _Lot) -> None:
    """The timer's end: kill ``lot``'s actors if they are still the parked ones."""
    global _lot
    with _lock:
        if _lot is not lot:
            return
        _lot = None
    try:
        _release(lot)
    except Exception:  # noqa: BLE001 - on the timer's thread, beside a Ray shutting down (which ends them anyway)
        pass


def _release(lot: _Lot | None) -> None:
    """Kill a lot's actors where their Ray is still the one connected."""
    if lot is None:
        return
    lot.timer.cancel()
    if _ours(lot):
        kill([actor for _, actor in lot.actors])


def _ours(lot: _Lot) -> bool:
    """Whether a lot's actors still live on this driver's Ray: connected, on the connection they were parked on."""
    return ray.is_initialized() and _connection() == lot.connection


def _connection() -> tuple[str, str]:
    """This driver's connection to Ray: the cluster's GCS address and the job's id (a new ``ray.init`` to the same
    cluster is another job, and the actors the last one owned died with it)."""
    context = ray.get_runtime_context()
    return context.gcs_address, context.get_job_id()


def kill(actors: Sequence[ActorHandle[Any]]) -> None:
    """Kill actors for good (no restart)."""
    for actor in actors:
        ray.kill(actor, no_restart=True)
