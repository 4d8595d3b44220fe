"""The main job behind ``ios_ray.search`` and ``ios-ray search``: plan, look up, measure what is missing, run the DP,
check, and hand back (and write) schedules.

The steps follow docs/DESIGN.md's data flow. The model comes as a spec (zoo name, ``package.module:factory``) or as
an ``nn.Module`` object; actors on real devices rebuild it from the spec or fetch the object through Ray's object
store (:class:`~ios_ray.profiler.ModelSource`). All candidate stages of a model are known before anything is measured
(:func:`~ios_ray.scheduler.plan_graph`), so they are deduplicated by stage key, looked up in the latency store for
every (device, batch), and only the missing ones go out to the device actors, all devices at once. The driver
alone writes the store, batch by batch as results stream back, so an interrupted search keeps what it measured
and a rerun resumes. The DP then reads latencies from the store and never waits on a device.

With ``measure="lazy"`` (the default) the job measures in rounds instead: the scheduler's pure
:func:`~ios_ray.scheduler.next_round` reads a setting's stored latencies and names the stages that can still change
its schedule; the job measures what every setting asks, on all devices at once, stores it, and asks again, until no
setting asks for anything (each schedule is then the exhaustive DP's, as far as the lower bounds hold) or the
budget is spent. The DP then runs on measured stages only.

On a measured device the DP's schedule is then checked end to end: it and the sequential schedule run whole, side
by side, on an actor of the device, and the file keeps the faster. Stages timed one at a time miss what happens
between them (on a CPU, handing work to worker threads and back), so the sum of a schedule's stages can favour a
schedule that is slower as a whole; the check makes sure a search never deploys one slower than sequential.

This module is the one place that joins Ray, the store and the scheduler; the Python API (:mod:`ios_ray.app.api`)
is its only caller.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Protocol, Sequence

import torch
from torch import nn

from ios_ray.app.ray_session import ray_session
from ios_ray.app.rounds import RoundSize
from ios_ray.devices import DEFAULT_SIM_ACTORS, parse_device
from ios_ray.dtypes import (DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, converted, dtype_name, example_input,
                            memory_format_name, module_device, module_dtype, module_memory_format, settings_named)
from ios_ray.errors import UserError
from ios_ray.frontend import import_module
from ios_ray.ir import Graph
from ios_ray.models import DEFAULT_INPUT_SHAPE, resolve_model
from ios_ray.profiler import CheckJob, DeviceIdentity, DevicePool, MeasureJob, ModelSource
from ios_ray.schedule import MAX_BATCH, EndToEnd, Schedule, save_schedule
from ios_ray.scheduler import (LAZY_MARGIN, LazyParams, LazyRound, LazySpace, Plan, PlannedStage, SearchParams,
                               TableLatency, inflated, next_round, optimize_graph, plan_graph, sequential, unit_parts)
from ios_ray.stage import StageKeys
from ios_ray.store import LatencyStore, rows_to_table

#: How a search measures: ``all`` planned stages, or ``lazy``: only those that can change the schedule.
MEASURE_MODES = ("all", "lazy")
DEFAULT_MEASURE = "lazy"


@dataclass(frozen=True)
class SearchRequest:
    """What to search: a model (spec or object), devices, batch sizes, where the store (and the schedule files, if
    ``out`` is given) live, and the DP bounds. ``name`` and ``input_shape`` default to the spec's or the object's;
    ``dtype`` (the one every stage is measured in) to the object's parameters' (float32 for a spec), and
    ``memory_format`` (``contiguous`` or ``channels_last``) to the object's 4-D parameters' (contiguous for a spec)."""

    model: str | nn.Module
    devices: tuple[str, ...]
    batches: tuple[int, ...]
    store: Path
    out: Path | None = None
    name: str | None = None
    input_shape: tuple[int, ...] | None = None
    params: SearchParams = SearchParams()
    address: str | None = None
    sim_actors: int = DEFAULT_SIM_ACTORS
    warmup: int | None = None
    repeat: int | None = None
    check_rounds: int = 10
    measure: str = DEFAULT_MEASURE
    budget: int | None = None
    dtype: str | None = None
    memory_format: str | None = None


@dataclass(frozen=True)
class SearchOutcome:
    """The result for one (device, batch): the schedule kept, the DP's and the sequential schedule's predicted
    latency, how many stages were measured new and found stored (outliers measured again count in neither: the
    schedule's ``params["measure"]["remeasured"]``), where the file went (None: not written), and on a measured
    device the end-to-end check (which of the two it kept)."""

    device: str
    batch: int
    schedule: Schedule
    predicted_ms: float
    sequential_ms: float
    measured: int
    cached: int
    wall_s: float
    path: Path | None
    source: str
    planned: int = 0

    @property
    def end_to_end(self) -> EndToEnd | None:
        """The end-to-end check behind the kept schedule (None on a ``sim:`` device or with no check)."""
        return self.schedule.end_to_end

    @property
    def speedup(self) -> float:
        """Predicted speedup of the IOS schedule over the sequential one."""
        return self.sequential_ms / self.predicted_ms


@dataclass(frozen=True)
class LoadedModel:
    """The model of a request, built and imported on the driver: its name, module, input shape and graph."""

    name: str
    module: nn.Module
    input_shape: tuple[int, ...]
    graph: Graph
    spec: str | None = None

    def source(self, shared: bool) -> ModelSource:
        """Where actors get the model: its spec, else (where ``shared``: actors on real devices need it) the object,
        put into Ray's object store (Ray must run) from the CPU, so that a node without a GPU can rebuild it."""
        import ray

        if self.spec is not None or not shared:
            return ModelSource(self.name, self.input_shape, spec=self.spec)
        module = self.module if module_device(self.module).type == "cpu" else copy.deepcopy(self.module).cpu()
        return ModelSource(self.name, self.input_shape, module_ref=ray.put(module))


@dataclass(frozen=True)
class _Search:
    """What every step of one search shares: the request, the model, its stage keys and plan, the store, and for a
    lazy search its space; and per (device, batch) the last round, what was measured so far, how many of the
    search's stages the store held when last asked, and which stored units alone were measured again as outliers."""

    request: SearchRequest
    model: LoadedModel
    keys: StageKeys
    plan: Plan
    store: LatencyStore
    lazy: LazySpace | None = None
    rounds: dict[tuple[str, int], LazyRound] = dataclasses.field(default_factory=dict)
    measured: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    stored: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    remeasured: dict[tuple[str, int], set[str]] = dataclasses.field(default_factory=dict)

    @property
    def graph(self) -> Graph:
        """The model's graph."""
        return self.model.graph

    @property
    def dtype(self) -> str:
        """The dtype every stage is measured in."""
        return self.request.dtype or DEFAULT_DTYPE

    @functools.cached_property
    def measurable(self) -> Mapping[str, PlannedStage]:
        """Every stage the search may measure, by key (the lazy search's include the plan's), built once."""
        if self.lazy is None:
            return self.plan.stages
        return {**{p.key: p for p in self.lazy.planned}, **self.plan.stages}

    @functools.cached_property
    def unit_parts(self) -> Mapping[str, tuple[str, ...]]:
        """For every stage of several units the search may measure, the keys of its units alone, built once."""
        return unit_parts(self.measurable, self.keys)


class SearchProgress(Protocol):
    """Where the search reports progress (the CLI draws rich progress bars)."""

    def planned(self, graph: Graph, plan: Plan) -> None:
        """The model is imported and its candidate stages are known."""

    def device_started(self, device: str, total: int, cached: int) -> None:
        """A device has ``total`` stages to measure (in this round, for a lazy search: once per round); ``cached``
        more were found in the store."""

    def advanced(self, device: str, done: int, total: int) -> None:
        """``done`` of ``total`` stages of a device are measured."""

    def checking(self, device: str, batch: int) -> None:
        """The DP and sequential schedules of (device, batch) are being timed end to end."""


def run_search(request: SearchRequest, progress: SearchProgress) -> list[SearchOutcome]:
    """Run a whole search; returns one outcome per (device, batch), writing a schedule file for each if ``out``."""
    started = time.perf_counter()
    request = _checked(request)
    model = load_model(request)
    keys = StageKeys(model.graph)
    lazy = LazySpace.build(model.graph, request.params, keys) if request.measure == "lazy" else None
    plan = lazy.plan if lazy is not None else plan_graph(model.graph, request.params, keys)
    progress.planned(model.graph, plan)
    search = _Search(request, model, keys, plan, LatencyStore(request.store), lazy)
    identities = _simulated_identities(request.devices)
    if identities is not None and not _any(_ask(search, identities, {}, RoundSize())):
        for label in request.devices:
            progress.device_started(label, 0, _stored(search, label))
        return _schedule_all(search, identities, started, None, progress)
    with ray_session(request.address), _pool(request) as pool:
        identities = pool.identities()
        measured = any(identity.source == "measured" for identity in identities.values())
        source = model.source(shared=measured)
        if measured:
            pool.prepare(source, model.graph, search.dtype)
        actors = {label: len(pool.actors(label)) for label in request.devices}
        size = RoundSize()
        started_choosing = time.perf_counter()
        asked = _ask(search, identities, actors, size)
        while _any(asked):
            started_measuring = time.perf_counter()
            _measure(pool, search, source, asked, identities, progress)
            measured = time.perf_counter()
            size = size.after(started_measuring - started_choosing, measured - started_measuring)
            started_choosing = measured
            asked = _ask(search, identities, actors, size, before=asked)
        return _schedule_all(search, identities, started, (pool, source), progress)


def load_model(request: SearchRequest) -> LoadedModel:
    """Build the request's model (a spec) or take it (an object), and import it in the request's dtype and memory
    format (a converted copy where it holds others) with a seeded batch-1 input on its device."""
    if isinstance(request.model, str):
        spec = resolve_model(request.model, input_shape=request.input_shape)
        shape = request.input_shape or spec.input_shape
        torch.manual_seed(0)
        module, name, source_spec = spec.build(), request.name or spec.name, request.model
    elif isinstance(request.model, nn.Module):
        module, source_spec = request.model, None
        name = request.name or type(module).__name__
        shape = request.input_shape or tuple(getattr(module, "input_shape", DEFAULT_INPUT_SHAPE))
    else:
        raise UserError(f"model must be an nn.Module or a model spec string, not a {type(request.model).__name__}.")
    held = converted(module, request.dtype or DEFAULT_DTYPE, request.memory_format or DEFAULT_MEMORY_FORMAT)
    graph = import_module(held, example_input(held, shape), name).graph
    return LoadedModel(name, module, tuple(shape), graph, source_spec)


def _schedule_all(
    search: _Search, identities: Mapping[str, DeviceIdentity], started: float,
    checker: tuple[DevicePool, ModelSource] | None, progress: SearchProgress,
) -> list[SearchOutcome]:
    """Run the DP for every (device, batch), check it end to end where the device is real, write the files."""
    request = search.request
    outcomes = []
    for label in request.devices:
        for batch in request.batches:
            dp, plain, stored = _optimize(search, identities[label], batch)
            kept = dp
            if checker is not None and identities[label].source == "measured" and request.check_rounds > 0:
                progress.checking(label, batch)
                kept = _checked_end_to_end(*checker, search, dp, plain)
            path = None
            if request.out is not None:
                path = schedule_path(request.out, search.model.name, label, batch, kept.dtype, kept.memory_format)
                save_schedule(kept, path)
            measured = search.measured.get((label, batch), 0)
            outcomes.append(SearchOutcome(
                label, batch, kept, dp.predicted_latency or 0.0, plain.predicted_latency or 0.0, measured,
                stored - measured, time.perf_counter() - started, path, identities[label].source,
                len(search.plan.stages)))
    return outcomes


def _ask(
    search: _Search, identities: Mapping[str, DeviceIdentity], actors: Mapping[str, int], size: RoundSize,
    before: Mapping[str, Mapping[int, list[str]]] | None = None,
) -> dict[str, dict[int, list[str]]]:
    """Per device and batch, the stage keys to measure next: every planned one the store lacks, or what the lazy
    search's next round asks for (``size`` and ``actors`` per device size the round)."""
    asked: dict[str, dict[int, list[str]]] = {}
    for label in search.request.devices:
        identity = identities[label]
        asked[label] = {}
        for batch in search.request.batches:
            keys = search.lazy.keys if search.lazy is not None else list(search.plan.stages)
            table = search.store.lookup(keys, identity.fingerprint, batch, search.dtype)
            search.stored[label, batch] = len(table)
            if search.lazy is None:
                asked[label][batch] = [key for key in keys if key not in table]
            else:
                params = LazyParams(_margin(identity), size.stages(actors.get(label, 1)), search.request.budget)
                found = next_round(search.lazy, table, params)
                search.rounds[label, batch] = found
                asked[label][batch] = list(found.measure)
            if identity.source == "measured":
                asked[label][batch] += _outliers(search, label, batch, table)
    if before is not None and _any(asked) and asked == before:
        raise UserError("the devices returned no latencies for stages they were asked to measure; the measured "
                        "ones were kept, so run the search again.")
    return asked


def _outliers(search: _Search, label: str, batch: int, table: Mapping[str, float]) -> list[str]:
    """Units alone whose stored latency is an outlier (:mod:`~ios_ray.scheduler.outliers`) and that this search has
    not measured again yet; they are marked as measured again."""
    done = search.remeasured.setdefault((label, batch), set())
    again = [key for key in inflated(table, search.unit_parts) if key not in done]
    done.update(again)
    return again


def _margin(identity: DeviceIdentity) -> float:
    """How far below what they come from a device's lower bounds sit: nothing on a ``sim:`` device."""
    return 0.0 if identity.source == "simulated" else LAZY_MARGIN


def _any(asked: Mapping[str, Mapping[int, list[str]]]) -> bool:
    """Whether any device has a stage to measure."""
    return any(keys for by_batch in asked.values() for keys in by_batch.values())


def _measure(
    pool: DevicePool, search: _Search, source: ModelSource, asked: Mapping[str, Mapping[int, list[str]]],
    identities: Mapping[str, DeviceIdentity], progress: SearchProgress,
) -> None:
    """Measure the asked stages on all devices at once, storing each batch of rows as it arrives."""
    planned, graph = search.measurable, search.graph
    jobs = {
        label: [MeasureJob(key, planned[key].stage, planned[key].description, graph, source, batch, search.dtype)
                for batch, keys in by_batch.items() for key in keys]
        for label, by_batch in asked.items()
    }
    for label in search.request.devices:
        progress.device_started(label, len(jobs[label]), _stored(search, label))
        for batch, keys in asked[label].items():
            again = search.remeasured.get((label, batch), set())
            search.measured[label, batch] = search.measured.get((label, batch), 0) + sum(k not in again for k in keys)
    report = pool.measure(jobs, lambda rows: search.store.put(rows_to_table(rows)), progress.advanced)
    if report.interrupted:
        raise KeyboardInterrupt


def _stored(search: _Search, label: str) -> int:
    """How many (stage, batch) latencies of one device the search could take from the store when it last asked."""
    return sum(search.stored[label, batch] for batch in search.request.batches)


def _simulated_identities(devices: Sequence[str]) -> dict[str, DeviceIdentity] | None:
    """Where every device is simulated, their identities computed here (no Ray needed to look up the store)."""
    specs = [parse_device(label) for label in devices]
    if not all(spec.simulated for spec in specs):
        return None
    from ios_ray.profiler.simulated import SimBackend

    return {spec.label: SimBackend(spec).start() for spec in specs}


def _checked(request: SearchRequest) -> SearchRequest:
    """Fail on bad devices, batches or counts, an unwritable ``out`` or an unreachable ``address`` before anything
    slow starts. Device labels come back in their canonical spelling (``SIM:V100`` is ``sim:v100``), without repeats.
    """
    devices = tuple(dict.fromkeys(parse_device(label).label for label in request.devices))
    if not devices:
        raise UserError("devices must name at least one device, e.g. cpu or sim:v100.")
    if not request.batches or any(type(b) is not int or not 0 < b <= MAX_BATCH for b in request.batches):
        raise UserError(f"batch sizes must be integers from 1 to {MAX_BATCH:,}, not {list(request.batches)}.")
    for name, value, least in (("repeat", request.repeat, 1), ("warmup", request.warmup, 0),
                               ("check_rounds", request.check_rounds, 0), ("sim_actors", request.sim_actors, 1)):
        if value is not None and value < least:
            raise UserError(f"{name} must be at least {least}, not {value}.")
    if request.measure not in MEASURE_MODES:
        raise UserError(f"measure must be one of {', '.join(MEASURE_MODES)}, not {request.measure!r}.")
    if request.budget is not None and request.budget < 1:
        raise UserError(f"budget must be at least 1 stage, not {request.budget}.")
    if request.input_shape is not None and (not request.input_shape or any(n < 1 for n in request.input_shape)):
        raise UserError(f"input_shape must be positive sizes such as (3, 224, 224), not {request.input_shape}.")
    if request.out is not None and request.out.exists() and not request.out.is_dir():
        raise UserError(f"out={request.out} is a file; pass a folder for the schedules.")
    dtype = _dtype_of(request)
    simulated = [label for label in devices if parse_device(label).simulated]
    memory_format = _memory_format_of(request)
    for setting, default in ((dtype, DEFAULT_DTYPE), (memory_format, DEFAULT_MEMORY_FORMAT)):
        if setting != default and simulated:
            raise UserError(f"the sim model covers {default} only, so {simulated[0]} cannot be searched in {setting}; "
                            f"search {setting} on a real device (cuda, a GPU name, cpu) or {default} on sim: devices.")
    if request.address not in (None, "auto"):
        _check_reachable(request.address)
    return dataclasses.replace(request, devices=devices, batches=tuple(dict.fromkeys(request.batches)), dtype=dtype,
                               memory_format=memory_format)


def _dtype_of(request: SearchRequest) -> str:
    """The dtype a search measures in: the request's, else the model object's parameters', else float32."""
    if request.dtype is not None:
        return dtype_name(request.dtype)
    return module_dtype(request.model) if isinstance(request.model, nn.Module) else DEFAULT_DTYPE


def _memory_format_of(request: SearchRequest) -> str:
    """The memory format a search measures in: the request's, else the model object's 4-D parameters', else
    contiguous."""
    if request.memory_format is not None:
        return memory_format_name(request.memory_format)
    return module_memory_format(request.model) if isinstance(request.model, nn.Module) else DEFAULT_MEMORY_FORMAT


@contextmanager
def _pool(request: SearchRequest) -> Iterator[DevicePool]:
    pool = DevicePool.start(list(request.devices), sim_actors=request.sim_actors, warmup=request.warmup,
                            repeat=request.repeat)
    try:
        yield pool
    finally:
        pool.shutdown()


def _optimize(search: _Search, identity: DeviceIdentity, batch: int) -> tuple[Schedule, Schedule, int]:
    """The DP's schedule and the sequential one for one (device, batch), priced from the store, and how many
    latencies the store held for it."""
    request, graph = search.request, search.graph
    keys = search.lazy.keys if search.lazy is not None else list(search.plan.stages)
    table = search.store.lookup(keys, identity.fingerprint, batch, search.dtype)
    record = _measure_record(search, identity, batch, len(table))
    if len(table) < len(keys) and search.lazy is None:
        raise UserError(
            f"the store lacks {len(keys) - len(table)} stage latencies for {identity.label} at batch "
            f"{batch}; rerun the search to measure them."
        )
    latency = TableLatency(search.keys, table, missing=math.inf if search.lazy is not None else None)
    result = search.lazy.optimize(table) if search.lazy is not None else optimize_graph(graph, latency, request.params)
    schedule = Schedule(
        model=search.model.name, graph_fingerprint=graph.fingerprint, device=identity.label, batch=batch,
        blocks=result.schedules, dtype=search.dtype, device_fingerprint=identity.fingerprint,
        device_info=dict(identity.info),
        params={**request.params.to_json(), "measure": record}, source=identity.source,
        input_shape=graph.input_shape, memory_format=graph.memory_format,
    )
    plain = dataclasses.replace(schedule, blocks=tuple(sequential(graph, block, latency) for block in graph.blocks))
    return schedule, plain, len(table)


def _measure_record(search: _Search, identity: DeviceIdentity, batch: int, stored: int) -> dict[str, object]:
    """What a schedule file records of how its stages were measured: the mode, the units alone measured again as
    outliers and, for a lazy search, the bound."""
    again = len(search.remeasured.get((identity.label, batch), ()))
    if search.lazy is None:
        return {"mode": "all", "stages": stored, "planned": len(search.plan.stages), "remeasured": again}
    found = search.rounds[identity.label, batch]
    if not math.isfinite(found.upper):
        raise UserError(f"a budget of {search.request.budget} stages ends before {identity.label} at batch {batch} "
                        "has a schedule of measured stages (every unit alone and every one- and two-group stage "
                        "come first); raise the budget.")
    return {"mode": "lazy", "stages": stored, "planned": len(search.plan.stages), "certified": found.certified,
            "lower_ms": found.lower, "upper_ms": found.upper, "calibration": found.calibration,
            "audited": found.audited, "audit_population": found.audit_population, "margin": _margin(identity),
            "remeasured": again}


def _checked_end_to_end(
    pool: DevicePool, source: ModelSource, search: _Search, dp: Schedule, plain: Schedule
) -> Schedule:
    """Time the DP's schedule and the sequential one whole, side by side, on the device; keep the faster."""
    rounds = search.request.check_rounds
    job = CheckJob(source, search.graph, (dp, plain), dp.batch, rounds, dtype=dp.dtype)
    dp_ms, sequential_ms = pool.time_schedules(dp.device, job)
    return keep_faster(dp, plain, EndToEnd(rounds, dp_ms, sequential_ms, dp.predicted_latency,
                                           plain.predicted_latency))


def keep_faster(dp: Schedule, sequential: Schedule, check: EndToEnd) -> Schedule:
    """The schedule the check found faster end to end (the DP's where they tie), carrying the check."""
    return dataclasses.replace(sequential if check.kept == "sequential" else dp, end_to_end=check)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail within seconds where nothing listens at a ``host:port`` or ``ray://host:port`` address."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"address must be auto, host:port or ray://host:port, not {address!r}.")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(f"cannot reach a Ray cluster at {address!r} ({exc.strerror or exc}); check the address, "
                        "or leave the address out to start Ray locally.") from None


def schedule_path(
    out: Path, model: str, device: str, batch: int, dtype: str = DEFAULT_DTYPE,
    memory_format: str = DEFAULT_MEMORY_FORMAT,
) -> Path:
    """Where a schedule is written: ``OUT/<model>/<device>/bs<batch>.json``, with ``-<dtype>`` after the batch for a
    dtype other than float32 and ``-channels_last`` for that memory format (``bs8-float16-channels_last.json``; odd
    characters of a spec made safe)."""
    safe_model = re.sub(r"[^A-Za-z0-9_.:-]", "_", model)
    suffix = "".join(f"-{setting}" for setting in settings_named(dtype, memory_format))
    return Path(out) / safe_model / device / f"bs{batch}{suffix}.json"

