"""The main job, ``ios-ray search``: plan, look up, measure what is missing, run the DP, write schedules.

The steps follow DESIGN.md's data flow. All candidate stages of a model are known before anything is measured
(:func:`~ios_ray.scheduler.plan_graph`), so they are deduplicated by stage key, looked up in the latency store for
every (device, batch), and only the missing ones go out to the device actors, all devices at once. The driver
alone writes the store, batch by batch as results stream back, so an interrupted search keeps what it measured
and a rerun resumes. The DP then reads latencies from the store and never waits on a device.

On a measured device the DP's schedule is then checked end to end: it and the sequential schedule run whole, side
by side, on an actor of the device, and the file keeps the faster. Stages timed one at a time miss what happens
between them (on a CPU, handing work to worker threads and back), so the sum of a schedule's stages can favour a
schedule that is slower as a whole; the check makes sure a search never deploys one slower than sequential.

This module is the one place that joins Ray, the store and the search; it is imported by the CLI command only.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Protocol, Sequence

from ios_ray.devices import parse_device
from ios_ray.errors import UserError, first_line
from ios_ray.frontend import import_model
from ios_ray.ir import Graph
from ios_ray.profiler import CheckJob, DevicePool, MeasureJob
from ios_ray.profiler.jobs import DeviceIdentity
from ios_ray.schedule import EndToEnd, Schedule, save_schedule
from ios_ray.scheduler import Plan, SearchParams, TableLatency, optimize_graph, plan_graph, sequential
from ios_ray.stage import StageKeys
from ios_ray.store import LatencyStore, rows_to_table


@dataclass(frozen=True)
class SearchRequest:
    """What to search: a model, devices, batch sizes, where the store and schedules live, and the DP bounds."""

    model: str
    devices: tuple[str, ...]
    batches: tuple[int, ...]
    store: Path
    out: Path
    params: SearchParams = SearchParams()
    address: str | None = None
    sim_actors: int = 2
    warmup: int | None = None
    repeat: int | None = None
    check_rounds: int = 10


@dataclass(frozen=True)
class SearchOutcome:
    """The result for one (device, batch): the DP's and the sequential schedule's predicted latency, what was
    measured, where the file went, and on a measured device the end-to-end check (which of the two it keeps)."""

    device: str
    batch: int
    predicted_ms: float
    sequential_ms: float
    measured: int
    cached: int
    wall_s: float
    path: Path
    source: str
    end_to_end: EndToEnd | None = None

    @property
    def speedup(self) -> float:
        """Predicted speedup of the IOS schedule over the sequential one."""
        return self.sequential_ms / self.predicted_ms


@dataclass(frozen=True)
class _Search:
    """What every step of one search shares: the request, the model's graph, its stage keys and plan, the store."""

    request: SearchRequest
    graph: Graph
    keys: StageKeys
    plan: Plan
    store: LatencyStore


class SearchProgress(Protocol):
    """Where the search reports progress (the CLI draws rich progress bars)."""

    def planned(self, graph: Graph, plan: Plan) -> None:
        """The model is imported and its candidate stages are known."""

    def device_started(self, device: str, total: int, cached: int) -> None:
        """A device has ``total`` stages to measure; ``cached`` more were found in the store."""

    def advanced(self, device: str, done: int, total: int) -> None:
        """``done`` of ``total`` stages of a device are measured."""

    def checking(self, device: str, batch: int) -> None:
        """The DP and sequential schedules of (device, batch) are being timed end to end."""


def run_search(request: SearchRequest, progress: SearchProgress) -> list[SearchOutcome]:
    """Run a whole search; returns one outcome per (device, batch) and writes one schedule file for each."""
    started = time.perf_counter()
    request = _checked(request)
    graph = import_model(request.model).graph
    keys = StageKeys(graph)
    plan = plan_graph(graph, request.params, keys)
    progress.planned(graph, plan)
    search = _Search(request, graph, keys, plan, LatencyStore(request.store))
    identities = _simulated_identities(request.devices)
    jobs, cached = _missing_jobs(search, identities) if identities else ({}, {})
    if identities is not None and not any(j for by_batch in jobs.values() for j in by_batch.values()):
        for label in request.devices:
            progress.device_started(label, 0, cached[label])
        return _schedule_all(search, identities, jobs, started, None, progress)
    with ray_session(request.address), _pool(request) as pool:
        identities = pool.identities()
        jobs, cached = _missing_jobs(search, identities)
        _measure(pool, search.store, jobs, cached, request, progress)
        return _schedule_all(search, identities, jobs, started, pool, progress)


def _schedule_all(
    search: _Search, identities: Mapping[str, DeviceIdentity], jobs: Mapping[str, Mapping[int, list[MeasureJob]]],
    started: float, pool: DevicePool | None, progress: SearchProgress,
) -> list[SearchOutcome]:
    """Run the DP for every (device, batch), check it end to end where the device is real, write the files."""
    request = search.request
    outcomes = []
    for label in request.devices:
        for batch in request.batches:
            dp, plain = _optimize(search, identities[label], batch)
            kept = dp
            if pool is not None and identities[label].source == "measured" and request.check_rounds > 0:
                progress.checking(label, batch)
                kept = _checked_end_to_end(pool, search, dp, plain)
            path = schedule_path(request.out, request.model, label, batch)
            save_schedule(kept, path)
            measured = len(jobs[label][batch])
            outcomes.append(SearchOutcome(
                label, batch, dp.predicted_latency or 0.0, plain.predicted_latency or 0.0, measured,
                len(search.plan.stages) - measured, time.perf_counter() - started, path, identities[label].source,
                kept.end_to_end))
    return outcomes


def _measure(
    pool: DevicePool, store: LatencyStore, jobs: Mapping[str, Mapping[int, list[MeasureJob]]],
    cached: Mapping[str, int], request: SearchRequest, progress: SearchProgress,
) -> None:
    """Measure every missing stage on all devices at once, storing each batch of rows as it arrives."""
    for label in request.devices:
        progress.device_started(label, sum(len(j) for j in jobs[label].values()), cached[label])
    flat = {label: [job for batch_jobs in by_batch.values() for job in batch_jobs] for label, by_batch in jobs.items()}
    report = pool.measure(flat, lambda rows: store.put(rows_to_table(rows)), progress.advanced)
    if report.interrupted:
        raise KeyboardInterrupt


def _simulated_identities(devices: Sequence[str]) -> dict[str, DeviceIdentity] | None:
    """Where every device is simulated, their identities computed here (no Ray needed to look up the store)."""
    specs = [parse_device(label) for label in devices]
    if not all(spec.simulated for spec in specs):
        return None
    from ios_ray.profiler.simulated import SimBackend

    return {spec.label: SimBackend(spec).start() for spec in specs}


def _checked(request: SearchRequest) -> SearchRequest:
    """Fail on bad devices, an unwritable --out or an unreachable --address before anything slow starts.

    Device labels come back in their canonical spelling (``SIM:V100`` is ``sim:v100``), without repeats.
    """
    devices = tuple(dict.fromkeys(parse_device(label).label for label in request.devices))
    if request.out.exists() and not request.out.is_dir():
        raise UserError(f"--out {request.out} is a file; pass a folder for the schedules.")
    if request.address not in (None, "auto"):
        _check_reachable(request.address)
    return dataclasses.replace(request, devices=devices)


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray for the duration of a command: started locally in-process without an address, else joined."""
    import ray

    if ray.is_initialized():
        yield
        return
    try:
        if address is None:
            ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        else:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        raise UserError(f"cannot reach a Ray cluster at {address!r}: {first_line(exc)}") from None
    try:
        yield
    finally:
        ray.shutdown()


@contextmanager
def _pool(request: SearchRequest) -> Iterator[DevicePool]:
    pool = DevicePool.start(list(request.devices), sim_actors=request.sim_actors, warmup=request.warmup,
                            repeat=request.repeat)
    try:
        yield pool
    finally:
        pool.shutdown()


def _missing_jobs(
    search: _Search, identities: Mapping[str, DeviceIdentity]
) -> tuple[dict[str, dict[int, list[MeasureJob]]], dict[str, int]]:
    """Per device and batch, the jobs of the planned stages the store does not hold; and per device the rest."""
    request, planned = search.request, search.plan.stages
    keys = list(planned)
    jobs: dict[str, dict[int, list[MeasureJob]]] = {}
    cached: dict[str, int] = {}
    for label in request.devices:
        jobs[label] = {}
        for batch in request.batches:
            missing = search.store.missing(keys, identities[label].fingerprint, batch)
            jobs[label][batch] = [
                MeasureJob(key, planned[key].stage, planned[key].description, search.graph, request.model, batch)
                for key in missing
            ]
        cached[label] = len(keys) * len(request.batches) - sum(len(j) for j in jobs[label].values())
    return jobs, cached


def _optimize(search: _Search, identity: DeviceIdentity, batch: int) -> tuple[Schedule, Schedule]:
    """The DP's schedule and the sequential one for one (device, batch), priced from the store."""
    request, graph = search.request, search.graph
    table = search.store.lookup(list(search.plan.stages), identity.fingerprint, batch)
    if len(table) < len(search.plan.stages):
        raise UserError(
            f"the store lacks {len(search.plan.stages) - len(table)} stage latencies for {identity.label} at batch "
            f"{batch}; rerun the search to measure them."
        )
    latency = TableLatency(search.keys, table)
    result = optimize_graph(graph, latency, request.params)
    schedule = Schedule(
        model=request.model, graph_fingerprint=graph.fingerprint, device=identity.label, batch=batch,
        blocks=result.schedules, device_fingerprint=identity.fingerprint, device_info=dict(identity.info),
        params=request.params.to_json(), source=identity.source, input_shape=graph.input_shape,
    )
    plain = dataclasses.replace(schedule, blocks=tuple(sequential(graph, block, latency) for block in graph.blocks))
    return schedule, plain


def _checked_end_to_end(pool: DevicePool, search: _Search, dp: Schedule, plain: Schedule) -> Schedule:
    """Time the DP's schedule and the sequential one whole, side by side, on the device; keep the faster."""
    rounds = search.request.check_rounds
    dp_ms, sequential_ms = pool.time_schedules(dp.device, CheckJob(dp.model, search.graph, (dp, plain), dp.batch,
                                                                   rounds))
    return keep_faster(dp, plain, EndToEnd(rounds, dp_ms, sequential_ms, dp.predicted_latency,
                                           plain.predicted_latency))


def keep_faster(dp: Schedule, sequential: Schedule, check: EndToEnd) -> Schedule:
    """The schedule the check found faster end to end (the DP's where they tie), carrying the check."""
    return dataclasses.replace(sequential if check.kept == "sequential" else dp, end_to_end=check)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail within seconds where nothing listens at a ``host:port`` or ``ray://host:port`` address."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--address must be auto, host:port or ray://host:port, not {address!r}.")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(f"cannot reach a Ray cluster at {address!r} ({exc.strerror or exc}); check the address, "
                        "or leave out --address to start Ray locally.") from None


def schedule_path(out: Path, model: str, device: str, batch: int) -> Path:
    """Where a schedule is written: ``OUT/<model>/<device>/bs<batch>.json`` (odd characters of a spec made safe)."""
    safe_model = re.sub(r"[^A-Za-z0-9_.:-]", "_", model)
    return Path(out) / safe_model / device / f"bs{batch}.json"

