"""A pool of profiler actors for a set of device labels: start, fingerprint, measure, time schedules, shut down.

In phases, so that the driver can skip what the store already holds and check the schedules it then makes::

    pool = DevicePool.start(["v100", "sim:k80"])       # fails within seconds if no node offers a label
    identities = pool.identities()                       # {label: fingerprint and info}, to look up the store
    building = pool.prepare(model, "float32", "contiguous")  # every actor starts building the model...
    building.check(graph)                                # ...and it fails here if one cannot, or built another graph
    report = pool.measure({label: missing_jobs}, on_rows, on_progress)
    timing = pool.time_schedules(label, CheckJob(model, graph, (dp, sequential), batch))   # .ratio.verdict
    pool.park()                                          # or pool.shutdown(): kill the actors rather than park them
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

from ios_ray.devices import DeviceSpec, parse_device
from ios_ray.errors import UserError
from ios_ray.profiler.actors import Hello, start_actor
from ios_ray.profiler.cluster import check_offered, live_nodes, plan_all
from ios_ray.profiler.parking import ParkingKey, kill, park, parking_key, take
from ios_ray.profiler.dispatch import (RESTART_POLL_S, RESTART_TIMEOUT_S, Dispatcher, MeasureReport, ProgressCallback,
                                      RowsCallback, task_error)
from ios_ray.ir import Graph
from ios_ray.paired import ContestTiming
from ios_ray.profiler.jobs import CheckJob, DeviceIdentity, MeasureJob, ModelSource, refuse_another_graph
from ios_ray.vocabulary import DEFAULT_SIM_ACTORS

#: Seconds to wait for a device's actors to start and fingerprint their device.
START_TIMEOUT_S = 60.0


class DevicePool:
    """The started, fingerprinted actors of each device label (use :meth:`start`)."""

    def __init__(self, actors: Mapping[str, list[tuple[ActorHandle[Any], DeviceIdentity]]], max_restarts: int,
                 keys: Mapping[ActorHandle[Any], ParkingKey | None] | None = None) -> None:
        self._actors = {label: [actor for actor, _ in pairs] for label, pairs in actors.items()}
        self._identities = {label: pairs[0][1] for label, pairs in actors.items()}
        self._max_restarts = max_restarts
        self._keys = dict(keys or {})

    @classmethod
    def start(
        cls,
        devices: Sequence[str],
        *,
        sim_actors: int = DEFAULT_SIM_ACTORS,
        warmup: int | None = None,
        repeat: int | None = None,
        start_timeout: float = START_TIMEOUT_S,
        max_restarts: int = 3,
    ) -> "DevicePool":
        """Start one actor per device unit of every label and wait for their fingerprints (Ray must be running); the
        actors the last pool of this process parked are taken where they fit (:mod:`~ios_ray.profiler.parking`)."""
        if not ray.is_initialized():
            raise UserError("Ray is not running; connect with ray.init(...) before starting a device pool.")
        specs = list({spec.label: spec for spec in map(parse_device, devices)}.values())
        if not specs:
            raise UserError("no devices were given; pass at least one device label, e.g. cpu or sim:v100.")
        nodes = live_nodes()
        check_offered(specs, nodes)
        placements = plan_all(specs, nodes, sim_actors)
        warm: dict[int, ActorHandle[Any]] = {}
        started: list[ActorHandle[Any]] = []
        try:  # a stop (Ctrl-C) at any point kills what was taken or started so far
            warm = take(placements, max_restarts, warmup, repeat)
            for i, placement in enumerate(placements):
                started.append(warm[i] if i in warm else start_actor(placement, warmup, repeat, max_restarts))
            hellos = _greet([(p.label, actor) for p, actor in zip(placements, started)], specs, start_timeout)
        except BaseException:
            kill(started + [actor for actor in warm.values() if actor not in started])
            raise
        return cls(hellos, max_restarts, {actor: parking_key(p, max_restarts) for p, actor in zip(placements, started)})

    def identities(self) -> dict[str, DeviceIdentity]:
        """Fingerprint, device info, host and source of every label."""
        return dict(self._identities)

    def actors(self, label: str) -> list[ActorHandle[Any]]:
        """The actors measuring one label."""
        return list(self._actors[label])

    def prepare(self, model: ModelSource, dtype: str, memory_format: str) -> "Preparing":
        """Have every actor start building the model on its device in ``dtype`` and ``memory_format``; returns at once,
        so that the driver imports the model meanwhile (:meth:`Preparing.check` waits for the actors)."""
        refs = [(label, actor.prepare.remote(model, dtype, memory_format))
                for label, actors in self._actors.items() for actor in actors]
        return Preparing(model.name, refs, {label: identity.host for label, identity in self._identities.items()})

    def measure(
        self,
        jobs: Mapping[str, Sequence[MeasureJob]],
        on_rows: RowsCallback,
        on_progress: ProgressCallback | None = None,
        batch_size: int | None = None,
    ) -> MeasureReport:
        """Measure each label's jobs on its actors, all labels in parallel; Ctrl-C shuts the pool down."""
        dispatcher = Dispatcher(self._actors, on_rows, on_progress, self._max_restarts)
        report = dispatcher.run(jobs, batch_size)
        if report.interrupted:
            self.shutdown()
        return report

    def time_schedules(self, label: str, job: CheckJob) -> ContestTiming:
        """Time whole schedules in rounds against a baseline on one actor of a label, until the interval of the best's
        decides (or the job's cap). An actor that dies meanwhile gets the job again once Ray has restarted it (up to
        ``max_restarts`` times), then the label's other actors do; UserError once every one has died for good (or
        stayed unavailable for ``RESTART_TIMEOUT_S``)."""
        for actor in self._actors[label]:
            deadline = time.monotonic() + RESTART_TIMEOUT_S
            while time.monotonic() < deadline:
                try:
                    timing: ContestTiming = ray.get(actor.time_schedules.remote(job))
                    return timing
                except RayTaskError as error:
                    raise task_error(error, f"timing the schedules of {job.model.name} end to end on {label} at "
                                            f"batch {job.batch}") from None
                except ActorDiedError:
                    break  # for good: the next actor
                except RayActorError:
                    time.sleep(RESTART_POLL_S)  # Ray is restarting it: the job again once it is up
        raise UserError(f"every actor of {label!r} died while timing the schedules of {job.model.name} end to end at "
                        f"batch {job.batch} (killed or crashed, out of memory perhaps, each after up to "
                        f"{self._max_restarts} restarts); the measured stages were kept, so run the search again.")

    def shutdown(self) -> None:
        """Kill every actor of the pool."""
        kill(self._ended())

    def park(self) -> None:
        """End the pool, its CPU and simulated actors parked for the next pool of this process, its GPU actors killed
        (:mod:`~ios_ray.profiler.parking`)."""
        actors = self._ended()
        park([(key, actor) for actor in actors if (key := self._keys.get(actor)) is not None])
        kill([actor for actor in actors if self._keys.get(actor) is None])

    def _ended(self) -> list[ActorHandle[Any]]:
        """Every actor of the pool, the pool left with none."""
        actors = [actor for actors in self._actors.values() for actor in actors]
        self._actors = {label: [] for label in self._actors}
        return actors

    def __enter__(self) -> "DevicePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


@dataclass(frozen=True)
class Preparing:
    """The actors building model ``name`` (:meth:`DevicePool.prepare`): per actor, its label and the reference to
    what it reports (:class:`~ios_ray.profiler.actors.Built`), and each label's host."""

    name: str
    refs: list[tuple[str, Any]]
    hosts: Mapping[str, str]

    def check(self, graph: Graph) -> None:
        """Wait until every actor has built the model; UserError with the first actor's problem, or where an actor
        imported it to another graph than ``graph`` (the driver's)."""
        try:
            built = ray.get([ref for _, ref in self.refs])
        except RayActorError:
            raise UserError(f"an actor died while building model {self.name!r} (killed or crashed, out of memory "
                            "perhaps); run the search again.") from None
        problems = [found.problem for found in built if found.problem is not None]
        if problems:
            raise UserError(problems[0])
        for (label, _), found in zip(self.refs, built):
            if found.fingerprint is not None:
                refuse_another_graph(self.name, found.fingerprint, graph.fingerprint, self.hosts[label])


def _greet(
    actors: list[tuple[str, ActorHandle[Any]]], specs: Sequence[DeviceSpec], timeout: float
) -> dict[str, list[tuple[ActorHandle[Any], DeviceIdentity]]]:
    """Wait for every actor's hello; fail on a reported problem or a label with no actor up in time."""
    refs = {actor.hello.remote(): (label, actor) for label, actor in actors}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    kill([refs[ref][1] for ref in pending])
    greeted: dict[str, list[tuple[ActorHandle[Any], DeviceIdentity]]] = {spec.label: [] for spec in specs}
    for ref in ready:
        label, actor = refs[ref]
        hello = _hello(ref, label)
        if hello.identity is None:
            raise UserError(hello.problem or f"an actor for device {label!r} could not identify its device.")
        greeted[label].append((actor, hello.identity))
    for label, pairs in greeted.items():
        if not pairs:
            raise UserError(
                f"no actor for device {label!r} started within {timeout:.0f} s; the nodes that offer it are busy "
                "or cannot place it: check `ray status` and try again."
            )
        greeted[label] = _same_fingerprint(label, pairs)
    return greeted


def _hello(ref: ray.ObjectRef[Any], label: str) -> Hello:
    """An actor's hello, or a Hello carrying the problem if the actor died while starting."""
    try:
        hello: Hello = ray.get(ref)
        return hello
    except RayActorError:
        return Hello(label, None, f"an actor for device {label!r} died while starting (killed or crashed, out of "
                                  "memory perhaps); run the search again.")


def _same_fingerprint(
    label: str, pairs: list[tuple[ActorHandle[Any], DeviceIdentity]]
) -> list[tuple[ActorHandle[Any], DeviceIdentity]]:
    """Keep the actors of the most common fingerprint; kill the rest, with a warning."""
    counts = Counter(identity.fingerprint for _, identity in pairs)
    keep = min(counts, key=lambda fp: (-counts[fp], fp))
    odd = [(actor, identity) for actor, identity in pairs if identity.fingerprint != keep]
    if odd:
        hosts = ", ".join(sorted({identity.host for _, identity in odd}))
        warnings.warn(
            f"{len(odd)} of {len(pairs)} actors of device {label!r} (on {hosts}) run a different device or "
            "software than the others; measuring on the others only.",
            stacklevel=3,
        )
        kill([actor for actor, _ in odd])
    return [(actor, identity) for actor, identity in pairs if identity.fingerprint == keep]

