"""What a search is asked, :class:`SearchRequest` (a model, devices, batch sizes and the options, as given), and what
it is once checked, :class:`SearchPlan`: every value resolved before anything slow starts, so nothing downstream
re-defaults or re-parses."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ios_ray.app.search.budgets import BudgetRule, DeviceBudget
from ios_ray.app.search.check import CheckSettings
from ios_ray.app.search.kernel_choice import checked_kernel_choice
from ios_ray.app.search.options import SearchOptions
from ios_ray.devices import DeviceSpec, parse_device
from ios_ray.dtypes import dtype_name, memory_format_name, module_dtype, module_memory_format
from ios_ray.errors import UserError
from ios_ray.scheduler import SearchParams
from ios_ray.vocabulary import DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, MEASURE_MODES, checked_batches


@dataclass(frozen=True)
class SearchRequest(SearchOptions):
    """What to search: a model (spec or object), devices and batch sizes, and the options
    (:class:`~ios_ray.app.search.options.SearchOptions`)."""

    model: str | nn.Module
    devices: tuple[str, ...]
    batches: tuple[int, ...]


@dataclass(frozen=True)
class PlannedDevice:
    """A device of a checked search: its label, parsed (canonical: ``SIM:V100`` is ``sim:v100``), and the memory
    budget it keeps to, parsed (resolved once its actor reports its memory: :meth:`DeviceBudget.resolve`)."""

    spec: DeviceSpec
    memory_budget: DeviceBudget

    @property
    def label(self) -> str:
        """The device's label, in its canonical spelling."""
        return self.spec.label


@dataclass(frozen=True)
class SearchPlan:
    """A checked request (:func:`checked_request`): every value resolved, so nothing downstream defaults or parses
    again; None only where it means absence, as each field says."""

    #: The model as given (a spec or an object); ``input_shape`` and ``name`` None: the model's own.
    model: str | nn.Module
    input_shape: tuple[int, ...] | None
    name: str | None
    #: The devices, without repeats, each with its memory budget; the batch sizes.
    devices: tuple[PlannedDevice, ...]
    batches: tuple[int, ...]
    #: What the stages are measured in and the DP searches with.
    dtype: str
    memory_format: str
    params: SearchParams
    #: How to measure: ``lazy`` or ``all``; at most ``stage_budget`` stages per setting (None: no cap); the kernels.
    measure: str
    stage_budget: int | None
    kernels: str
    #: The end-to-end check of the candidates.
    check: CheckSettings
    #: Where things go: the store; ``out`` None: no files; ``address`` None: Ray started here.
    store: Path
    out: Path | None
    address: str | None
    #: Sim actors per sim device; ``warmup`` and ``repeat`` None: the timing protocol's own counts for each device's
    #: kind (:func:`~ios_ray.profiler.protocol.resolve_protocol`).
    sim_actors: int
    warmup: int | None
    repeat: int | None

    @property
    def labels(self) -> tuple[str, ...]:
        """The devices' labels, in the request's order."""
        return tuple(device.label for device in self.devices)


def checked_request(request: SearchRequest) -> SearchPlan:
    """The request checked and resolved: UserError on bad devices, batches or counts, an unwritable ``out`` or an
    unreachable ``address``, before anything slow starts."""
    specs = tuple({spec.label: spec for spec in map(parse_device, request.devices)}.values())
    if not specs:
        raise UserError("devices must name at least one device, e.g. cpu or sim:v100.")
    batches = checked_batches(request.batches)
    params = request.params
    for name, value, least in (("repeat", request.repeat, 1), ("warmup", request.warmup, 0),
                               ("check_rounds", request.check_rounds, 0), ("sim_actors", request.sim_actors, 1),
                               ("budget", request.budget, 1), ("compile_workers", request.compile_workers, 0)):
        if value is not None and value < least:
            raise UserError(f"{name} must be at least {least}, not {value}.")
    check = CheckSettings(request.check_rounds, request.check_confidence, request.check_seconds,
                          request.compile_workers)
    budget = BudgetRule.parse(request.memory_budget)
    kernels = checked_kernel_choice(request.kernels)
    _check_places(request)
    dtype, memory_format = _dtype_of(request), _memory_format_of(request)
    _refuse_what_sim_cannot_price(specs, dtype, memory_format)
    if request.address not in (None, "auto"):
        _check_reachable(request.address)
    return SearchPlan(
        request.model, request.input_shape, request.name, tuple(PlannedDevice(s, budget.on(s)) for s in specs),
        batches, dtype, memory_format, params, request.measure, request.budget, kernels, check, request.store,
        request.out, request.address, request.sim_actors, request.warmup, request.repeat)


def _check_places(request: SearchRequest) -> None:
    """Fail on an unknown way of measuring, an empty or non-positive input shape, or an ``out`` that is a file."""
    if request.measure not in MEASURE_MODES:
        raise UserError(f"measure must be one of {', '.join(MEASURE_MODES)}, not {request.measure!r}.")
    if request.input_shape is not None and (not request.input_shape or any(n < 1 for n in request.input_shape)):
        raise UserError(f"input_shape must be positive sizes such as (3, 224, 224), not {request.input_shape}.")
    if request.out is not None and request.out.exists() and not request.out.is_dir():
        raise UserError(f"out={request.out} is a file; pass a folder for the schedules.")


def _refuse_what_sim_cannot_price(specs: tuple[DeviceSpec, ...], dtype: str, memory_format: str) -> None:
    """Fail where a ``sim:`` device is to be searched in a dtype or memory format other than the sim model's."""
    simulated = [spec.label for spec in specs if spec.simulated]
    for asked, default in ((dtype, DEFAULT_DTYPE), (memory_format, DEFAULT_MEMORY_FORMAT)):
        if asked != default and simulated:
            raise UserError(f"the sim model covers {default} only, so {simulated[0]} cannot be searched in {asked}; "
                            f"search {asked} on a real device (cuda, a GPU name, cpu) or {default} on sim: devices.")


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
