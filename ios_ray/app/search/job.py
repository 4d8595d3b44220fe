"""The main job behind ``ios_ray.search`` and ``ios-ray search``: plan, look up, measure what is missing, run the DP,
check, and hand back (and write) schedules.

The steps follow docs/DESIGN.md's data flow. The model comes as a spec or an ``nn.Module`` object
(:func:`~ios_ray.frontend.load_model`); actors on real devices rebuild it from the spec or fetch the object through
Ray's object store (:class:`~ios_ray.profiler.ModelSource`), while the driver imports and plans it, on a thread of
its own (:mod:`~ios_ray.app.search.planning`). All candidate stages of a
model are known before anything is measured, so they are deduplicated by stage key and looked up in the latency
store for every setting
(device, batch, a :class:`~ios_ray.app.search.measuring.Setting`); a measuring strategy
(:mod:`~ios_ray.app.search.measuring`: every planned stage, or lazily only those that can change the schedule) says what
each setting still needs, and the job measures it on all devices at once, round after round, until no setting asks
for more. The driver alone writes the store, batch by batch as results stream back, so an interrupted search keeps
what it measured and a rerun resumes. The DP then reads the settings' latencies and never waits on a device.

Each setting first gets the kernels its stages run with (:mod:`~ios_ray.app.search.kernel_choice`: those the
request names, or on a measured device the faster as the sequential schedule runs whole), and is looked up and
measured under its device identity running them. On a measured device its candidates
(:mod:`~ios_ray.app.search.candidates`: the IOS schedule, its alternatives, greedy, sequential) are then checked end
to end: they run whole, in paired rounds, on an actor of the device, and the file keeps, of those whose interval of
the ratio over sequential lies wholly below 1, the one of the lowest median (:mod:`ios_ray.app.search.check`,
:mod:`ios_ray.paired`); otherwise sequential (fewer threads and streams, the same speed). Stages timed one at a time
miss what happens between them (on a CPU, handing work to worker threads and back), so the sum of a schedule's
stages can favour a schedule that is slower as a whole; the check makes sure a search never deploys one slower than
sequential, nor calls one faster on a coin flip.

This module is the one place that joins Ray, the store and the scheduler; the Python API (:mod:`ios_ray.app.search.api`)
is its only caller.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

from ios_ray.app.search import planning
from ios_ray.app.search.budgets import refuse_unreachable_budgets
from ios_ray.app.search.candidates import candidates
from ios_ray.app.search.check import checked_end_to_end, corrected_prediction, stored_correction
from ios_ray.app.search.kernel_choice import given_kernels, measured_kernels, stored_kernels
from ios_ray.app.search.measuring import Setting
from ios_ray.app.search.outcome import SearchOutcome
from ios_ray.app.search.phases import Stopwatch
from ios_ray.app.search.planning import Planned, plan_model
from ios_ray.app.search.progress import SearchProgress
from ios_ray.app.search.ray_session import cluster_in_use, joined, ray_session
from ios_ray.app.search.request import SearchPlan, SearchRequest, checked_request
from ios_ray.app.search.rounds import RoundSize
from ios_ray.app.search.solver import Solver
from ios_ray.devices import DeviceSpec
from ios_ray.dtypes import copied, module_device
from ios_ray.errors import UserError
from ios_ray.frontend import Model, load_model
from ios_ray.profiler import DeviceIdentity, DevicePool, MeasureJob, ModelSource
from ios_ray.profiler.cluster import check_offered
from ios_ray.schedule import save_schedule, schedule_path
from ios_ray.scheduler import sequential_stages
from ios_ray.store import rows_to_table
from ios_ray.vocabulary import KERNEL_NAMES


def model_source(model: Model, shared: bool) -> ModelSource:
    """Where actors get the model: its spec, else (where ``shared``: actors on real devices need it) the object, put
    into Ray's object store (Ray must run) from the CPU, so that a node without a GPU can rebuild it."""
    import ray

    if model.spec is not None or not shared:
        return ModelSource(model.name, model.input_shape, spec=model.spec)
    module = model.module if module_device(model.module).type == "cpu" else copied(model.module).cpu()
    return ModelSource(model.name, model.input_shape, module_ref=ray.put(module))


@dataclass(frozen=True)
class _Search(Planned):
    """What every step of one search shares: the model, the measuring strategy and the store (:class:`Planned`),
    the checked request, and one setting per (device, batch)."""

    plan: SearchPlan
    settings: tuple[Setting, ...]

    @property
    def dtype(self) -> str:
        """The dtype every stage is measured in."""
        return self.plan.dtype

    def of(self, device: str) -> list[Setting]:
        """The settings of one device, by batch."""
        return [setting for setting in self.settings if setting.device == device]

    def look_up(self) -> None:
        """Read every setting's latencies from the store."""
        for setting in self.settings:
            setting.table = self.store.lookup(self.measuring.keys, setting.identity.fingerprint, setting.batch,
                                              self.dtype)


def run_search(request: SearchRequest, progress: SearchProgress) -> list[SearchOutcome]:
    """Run a whole search; returns one outcome per (device, batch), writing a schedule file for each if ``out``.

    It says first which Ray it runs on, and fails there, before the model is imported, on a device no node offers;
    it says last where its time went (:mod:`~ios_ray.app.search.phases`)."""
    watch = Stopwatch()
    with watch.phase("start-up"):
        plan = checked_request(request)
    with joined(plan.address):
        with watch.phase("start-up"):
            cluster = cluster_in_use(plan.address)
            progress.cluster(cluster.summary())
            check_offered([device.spec for device in plan.devices], cluster.nodes, cluster.where)
        outcomes = _run(plan, progress, watch)
    progress.finished(watch.read())
    return outcomes


def _run(plan: SearchPlan, progress: SearchProgress, watch: Stopwatch) -> list[SearchOutcome]:
    """The search after its checks: build the model, import and plan it (on a measured device while the actors
    start and build it too, and where no device is a CPU while they time its kernels), look up, measure what is
    missing, schedule."""
    with watch.phase("import"):
        model = load_model(plan.model, plan.input_shape, plan.name)
    identities = _simulated_identities([device.spec for device in plan.devices])
    planned = None
    if identities is not None:
        with watch.phase("import"):
            planned = plan_model(plan, model, threaded=False)
            _planned_now(planned, progress)
        search = _search(plan, planned, identities)
        with watch.phase("kernels"):
            _choose_kernels(search, None, progress)
        with watch.phase("choosing"):
            asked = _ask(search, {}, RoundSize())
        if not asked:
            for label in plan.labels:
                progress.device_started(label, 0, _cached(search, label))
            return _schedule_all(search, watch, None, progress)
    measured = planned is None  # a device is measured: its actors build the model, the driver plans on a thread
    during_kernels = measured and planning.plans_during_kernels(plan)
    with ExitStack() as stack:
        with watch.phase("start-up"):
            stack.enter_context(ray_session(plan.address))
            source = model_source(model, shared=measured)  # before the import: it pickles the module
            planned = planned or plan_model(plan, model, threaded=True)
            pool = stack.enter_context(_pool(plan))
            building = pool.prepare(source, plan.dtype, plan.memory_format) if measured else None
        with watch.phase("import"):
            graph = planned.model.graph  # the actors build the model meanwhile
            if measured and not during_kernels:
                _planned_now(planned, progress)
        if building is not None:
            with watch.phase("build"):
                building.check(graph)
        search = _search(plan, planned, pool.identities())
        with watch.phase("kernels"):
            _choose_kernels(search, (pool, source), progress)
            _read_corrections(search)
        if during_kernels:
            with watch.phase("import"):
                _planned_now(planned, progress)  # what the kernels' timing left of planning
        _measure_rounds(pool, search, source, progress, watch)
        return _schedule_all(search, watch, (pool, source), progress)


def _measure_rounds(pool: DevicePool, search: _Search, source: ModelSource, progress: SearchProgress,
                    watch: Stopwatch) -> None:
    """Ask for stages and measure them, round after round, until no setting asks for more."""
    actors = {label: len(pool.actors(label)) for label in search.plan.labels}
    size = RoundSize()
    with watch.phase("choosing"):
        started_choosing = time.perf_counter()
        asked = _ask(search, actors, size)
    while asked:
        with watch.phase("measuring"):
            started_measuring = time.perf_counter()
            _measure(pool, search, source, asked, progress)
        with watch.phase("choosing"):
            measured_at = time.perf_counter()
            size = size.after(started_measuring - started_choosing, measured_at - started_measuring)
            started_choosing = measured_at
            asked = _ask(search, actors, size, before=asked)


def _planned_now(planned: Planned, progress: SearchProgress) -> None:
    """Wait for the candidate stages to be planned, and say how many there are."""
    progress.planned(planned.model.graph, planned.measuring.space.plan)


def _search(plan: SearchPlan, planned: Planned, identities: dict[str, DeviceIdentity]) -> _Search:
    """A search's shared state, one setting per (device, batch) in the request's order, each with its device's
    memory budget (resolved once per device, from the memory its identity reports); UserError where a budget is one
    no schedule meets."""
    model = planned.model
    budgets = {device.label: device.memory_budget.resolve(model.model.module,
                                                          identities[device.label].info.get("memory_bytes"))
               for device in plan.devices}
    settings = tuple(Setting(identities[label], batch, budgets[label]) for label in plan.labels
                     for batch in plan.batches)
    search = _Search(planned.importing, planned.planning, planned.store, plan, settings)
    refuse_unreachable_budgets(model.graph, plan.params, plan.dtype,
                               list(dict.fromkeys((s.batch, s.memory_budget) for s in settings)))
    return search


def _choose_kernels(search: _Search, devices: tuple[DevicePool, ModelSource] | None, progress: SearchProgress
                    ) -> None:
    """Give every setting its kernels (:mod:`~ios_ray.app.search.kernel_choice`): those the request names, else on a
    measured device those an earlier search chose (the store holds more of the model's units measured alone with
    them), else the faster as the sequential schedule runs whole there (``devices``: its pool and the model's
    source); on a sim device eager."""
    plan, graph = search.plan, search.model.graph
    units = [search.keys.key(stage) for block in graph.blocks for stage in sequential_stages(graph, block)]
    for setting in search.settings:
        choice = given_kernels(plan.kernels, setting.simulated) or stored_kernels({
            kernels: len(search.store.lookup(units, setting.identity.running(kernels).fingerprint, setting.batch,
                                             search.dtype)) for kernels in KERNEL_NAMES})
        if choice is None:
            assert devices is not None, "a measured device is reached through its pool"
            progress.choosing_kernels(setting.device, setting.batch)
            choice = measured_kernels(*devices, search.model.graph, setting.device, setting.batch, search.dtype,
                                      plan.check.confidence, plan.check.seconds)
        setting.run_with(choice)


def _schedule_all(search: _Search, watch: Stopwatch, checker: tuple[DevicePool, ModelSource] | None,
                  progress: SearchProgress) -> list[SearchOutcome]:
    """Run the DP for every setting, check its candidates end to end where the device is real (storing each as a
    run), write the files (each saying where the search's time went until then: ``params["search_s"]``)."""
    plan, graph = search.plan, search.model.graph
    solver = Solver(search.measuring, search.model.name, plan.dtype)
    outcomes = []
    for setting in search.settings:
        with watch.phase("DP"):
            found = candidates(solver, setting)
        kept = found["dp"]
        if checker is not None and not setting.simulated and plan.check.rounds > 0:
            progress.checking(setting.device, setting.batch)
            with watch.phase("check"):
                kept, ran = checked_end_to_end(*checker, graph, plan.check, found, setting.correction)
                search.store.put_runs(ran)
        times = watch.read()
        kept = dataclasses.replace(kept, params={**kept.params, "search_s": times.to_json()})
        path = None
        if plan.out is not None:
            path = schedule_path(plan.out, search.model.name, setting.device, setting.batch, kept.dtype,
                                 kept.memory_format)
            save_schedule(kept, path)
        ios, plain = (corrected_prediction(found[name], setting.correction) or 0.0 for name in ("dp", "sequential"))
        outcomes.append(SearchOutcome(
            setting.device, setting.batch, kept, ios, plain, setting.measured, len(setting.table) - setting.measured,
            times, path, setting.identity.source, len(search.measuring.space.plan.stages), setting.correction))
        progress.kept(outcomes[-1])
    return outcomes


def _read_corrections(search: _Search) -> None:
    """Give every measured setting the correction fitted from the schedules its device ran whole before."""
    for setting in search.settings:
        if not setting.simulated:
            setting.correction = stored_correction(search.store, setting.identity.fingerprint, setting.batch,
                                                   search.dtype)


def _ask(search: _Search, actors: dict[str, int], size: RoundSize, before: dict[tuple[str, int], list[str]] | None
         = None) -> dict[tuple[str, int], list[str]]:
    """Per setting with something to measure, the stage keys to measure next (``size`` and ``actors`` per device
    size a lazy round)."""
    search.look_up()
    asked = {}
    for setting in search.settings:
        keys = search.measuring.ask(setting, size.stages(actors.get(setting.device, 1)))
        if keys:
            asked[setting.device, setting.batch] = keys
    if before is not None and asked and asked == before:
        raise UserError("the devices returned no latencies for stages they were asked to measure; the measured "
                        "ones were kept, so run the search again.")
    return asked


def _measure(pool: DevicePool, search: _Search, source: ModelSource, asked: dict[tuple[str, int], list[str]],
             progress: SearchProgress) -> None:
    """Measure the asked stages on all devices at once, storing each batch of rows as it arrives."""
    planned, graph = search.measuring.measurable, search.model.graph
    kernels = {(setting.device, setting.batch): setting.identity.kernels for setting in search.settings}
    jobs: dict[str, list[MeasureJob]] = {label: [] for label in search.plan.labels}
    for (label, batch), keys in asked.items():
        jobs[label] += [MeasureJob(key, planned[key].stage, planned[key].description, graph, source, batch,
                                   search.dtype, kernels[label, batch]) for key in keys]
    for label in search.plan.labels:
        progress.device_started(label, len(jobs[label]), _cached(search, label))
    for setting in search.settings:
        search.measuring.record(setting, asked.get((setting.device, setting.batch), []))
    report = pool.measure(jobs, lambda rows: search.store.put(rows_to_table(rows)), progress.advanced)
    if report.interrupted:
        raise report.interrupted


def _cached(search: _Search, label: str) -> int:
    """How many (stage, batch) latencies of one device the search found stored before it measured any: the sum of
    the ``cached`` of the device's outcomes."""
    return sum(len(setting.table) - setting.measured for setting in search.of(label))


def _simulated_identities(specs: Sequence[DeviceSpec]) -> dict[str, DeviceIdentity] | None:
    """Where every device is simulated, their identities computed here (no Ray needed to look up the store)."""
    if not all(spec.simulated for spec in specs):
        return None
    from ios_ray.profiler.sim_backend import SimBackend

    return {spec.label: SimBackend(spec).start() for spec in specs}


@contextmanager
def _pool(plan: SearchPlan) -> Iterator[DevicePool]:
    """The actors of every device of the search: parked for the next search where it ends, else shut down."""
    pool = DevicePool.start(list(plan.labels), sim_actors=plan.sim_actors, warmup=plan.warmup, repeat=plan.repeat)
    try:
        yield pool
    except BaseException:
        pool.shutdown()
        raise
    pool.park()
