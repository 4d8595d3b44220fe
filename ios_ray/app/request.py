"""What a search is asked: :class:`SearchRequest` (a model, devices, batch sizes and the options), and its checks
before anything slow starts."""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass

from torch import nn

from ios_ray.app.budgets import parse_memory_budget
from ios_ray.app.check import check_the_check
from ios_ray.app.kernel_choice import checked_kernel_choice
from ios_ray.app.options import SearchOptions
from ios_ray.devices import parse_device
from ios_ray.dtypes import dtype_name, memory_format_name, module_dtype, module_memory_format
from ios_ray.errors import UserError
from ios_ray.vocabulary import DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, MEASURE_MODES, checked_batches


@dataclass(frozen=True)
class SearchRequest(SearchOptions):
    """What to search: a model (spec or object), devices and batch sizes, and the options
    (:class:`~ios_ray.app.options.SearchOptions`)."""

    model: str | nn.Module
    devices: tuple[str, ...]
    batches: tuple[int, ...]


def checked_request(request: SearchRequest) -> SearchRequest:
    """Fail on bad devices, batches or counts, an unwritable ``out`` or an unreachable ``address`` before anything
    slow starts. Device labels come back in their canonical spelling (``SIM:V100`` is ``sim:v100``), without repeats.
    """
    devices = tuple(dict.fromkeys(parse_device(label).label for label in request.devices))
    if not devices:
        raise UserError("devices must name at least one device, e.g. cpu or sim:v100.")
    batches = checked_batches(request.batches)
    request.params  # noqa: B018 - validates r, s and the strategies
    for name, value, least in (("repeat", request.repeat, 1), ("warmup", request.warmup, 0),
                               ("check_rounds", request.check_rounds, 0), ("sim_actors", request.sim_actors, 1),
                               ("budget", request.budget, 1)):
        if value is not None and value < least:
            raise UserError(f"{name} must be at least {least}, not {value}.")
    check_the_check(request)
    parse_memory_budget(request.memory_budget)
    checked_kernel_choice(request.kernels)
    if request.measure not in MEASURE_MODES:
        raise UserError(f"measure must be one of {', '.join(MEASURE_MODES)}, not {request.measure!r}.")
    if request.input_shape is not None and (not request.input_shape or any(n < 1 for n in request.input_shape)):
        raise UserError(f"input_shape must be positive sizes such as (3, 224, 224), not {request.input_shape}.")
    if request.out is not None and request.out.exists() and not request.out.is_dir():
        raise UserError(f"out={request.out} is a file; pass a folder for the schedules.")
    dtype, memory_format = _dtype_of(request), _memory_format_of(request)
    simulated = [label for label in devices if parse_device(label).simulated]
    for setting, default in ((dtype, DEFAULT_DTYPE), (memory_format, DEFAULT_MEMORY_FORMAT)):
        if setting != default and simulated:
            raise UserError(f"the sim model covers {default} only, so {simulated[0]} cannot be searched in {setting}; "
                            f"search {setting} on a real device (cuda, a GPU name, cpu) or {default} on sim: devices.")
    if request.address not in (None, "auto"):
        _check_reachable(request.address)
    return dataclasses.replace(request, devices=devices, batches=batches, dtype=dtype, memory_format=memory_format)


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
