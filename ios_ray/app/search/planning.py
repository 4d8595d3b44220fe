"""A search's model imported on the driver and its candidate stages planned, on a thread of their own where the
search has devices to wait for meanwhile (:func:`plan_model`).

On a measured device the import and the plan run while Ray's actors start and build the model, and where no device
is a CPU (:func:`plans_during_kernels`) while the devices time the kernels too, which need only the graph: RandWire's
plan (110,374 candidate stages) takes seconds. The thread starts once the model object is in Ray's store (Ray could
not pickle a module while the import traced it). Each step's result is a future, read where the search needs it
(:class:`Planned`): a step that failed raises there, as it would have where it ran.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, TypeVar

from ios_ray.app.search.budgets import refuse_what_cannot_fit
from ios_ray.app.search.measuring import Exhaustive, Lazy, Measuring
from ios_ray.app.search.ray_session import runs_here
from ios_ray.app.search.request import SearchPlan
from ios_ray.frontend import Model, import_model
from ios_ray.ir import Graph
from ios_ray.stage import StageKeys
from ios_ray.store import LatencyStore

T = TypeVar("T")


@dataclass(frozen=True)
class LoadedModel:
    """The model of a request (:func:`~ios_ray.frontend.load_model`) and its graph, imported on the driver."""

    model: Model
    graph: Graph

    @property
    def name(self) -> str:
        """The model's name."""
        return self.model.name


@dataclass(frozen=True)
class Planned:
    """A search's model being imported on the driver and its candidate stages being planned (:func:`plan_model`),
    and its store."""

    importing: Future[tuple[LoadedModel, StageKeys]]
    planning: Future[Measuring]
    store: LatencyStore

    @property
    def model(self) -> LoadedModel:
        """The model imported (waiting for the thread that imports it, if any)."""
        return self.importing.result()[0]

    @property
    def keys(self) -> StageKeys:
        """The stage keys of the model's graph (waiting for its import)."""
        return self.importing.result()[1]

    @property
    def measuring(self) -> Measuring:
        """The measuring strategy, its candidate stages planned (waiting for the thread that plans them, if any)."""
        return self.planning.result()


def plan_model(plan: SearchPlan, model: Model, threaded: bool) -> Planned:
    """Import the model on the driver (in the request's dtype and memory format), refuse a batch that cannot fit,
    and plan its candidate stages (build the measuring strategy), now, or where ``threaded`` on a daemon thread (a
    Ctrl-C does not wait for it); the store opened. An exception of either step is raised where its result is read
    (:class:`Planned`)."""
    local = runs_here(plan.address)  # asked of Ray here, on the search's thread

    def imported() -> tuple[LoadedModel, StageKeys]:
        loaded = LoadedModel(model, import_model(model, dtype=plan.dtype, memory_format=plan.memory_format).graph)
        refuse_what_cannot_fit(loaded.graph, plan.batches, plan.dtype, plan.labels, local=local)
        return loaded, StageKeys(loaded.graph)

    def measuring() -> Measuring:
        keys = importing.result()[1]
        return (Lazy(keys, plan.params, plan.stage_budget, plan.dtype) if plan.measure == "lazy"
                else Exhaustive(keys, plan.params))

    importing: Future[tuple[LoadedModel, StageKeys]] = Future()
    planning: Future[Measuring] = Future()

    def run() -> None:
        _settle(importing, imported)
        _settle(planning, measuring)

    if threaded:
        threading.Thread(target=run, name="ios-ray planning", daemon=True).start()
    else:
        run()
    return Planned(importing, planning, LatencyStore(plan.store))


def plans_during_kernels(plan: SearchPlan) -> bool:
    """Whether the search goes on planning its candidate stages while its devices time the kernels: where none is a
    CPU (a CPU's timing shares the host's cores with the driver's planning, whose work would disturb it)."""
    return all(device.spec.kind != "cpu" for device in plan.devices)


def _settle(future: Future[T], work: Callable[[], T]) -> None:
    """Give ``future`` the result of ``work``, or the exception it raised."""
    try:
        future.set_result(work())
    except BaseException as error:  # noqa: BLE001 - handed to the reader of the result, whatever it is
        future.set_exception(error)
