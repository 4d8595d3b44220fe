"""The floating-point types and memory formats a model is searched and deployed in: their names, and a module's.

A schedule is made for one dtype (``float32``, ``float16`` or ``bfloat16``): a stage at half precision runs other
kernels, at other speeds, than at float32, so latencies are stored per dtype and a schedule file records its own.
A model object is searched in the dtype of its parameters unless told otherwise (a model held in float16 on a GPU
is searched in float16); a model spec is built in float32. A model is imported in the dtype it is searched in, on
the driver and on every actor: its graph can depend on it (timm's EdgeNeXt casts a positional encoding to its
weights' dtype, and the trace keeps that dtype).

A model is also searched in one memory format, ``contiguous`` (NCHW) or ``channels_last`` (NHWC, what
``model.to(memory_format=torch.channels_last)`` gives: convolutions then run other kernels, often much faster ones,
and their outputs stay NHWC). The memory format is part of the imported graph (``Graph.memory_format``), so a
channels-last stage has another stage key than the same stage in NCHW, and its 4-D inputs are measured in NHWC.
A model object is searched in the format of its 4-D parameters unless told otherwise; a model spec in
``contiguous``.
"""

from __future__ import annotations

import copy
from typing import Mapping, Sequence, TypeVar

import torch
from torch import nn

from ios_ray.errors import UserError
from ios_ray.vocabulary import DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, DTYPE_NAMES, MEMORY_FORMAT_NAMES

#: The dtypes a schedule can be made for, by their names in schedule files and the store.
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}
#: Other spellings users type for them.
_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
#: The memory formats a schedule can be made for, by their names in schedule files and graphs.
MEMORY_FORMATS: dict[str, torch.memory_format] = dict(zip(MEMORY_FORMAT_NAMES,
                                                          (torch.contiguous_format, torch.channels_last)))
_FORMAT_ALIASES = {"contiguous_format": "contiguous", "nchw": "contiguous", "nhwc": "channels_last"}


def dtype_name(value: str | torch.dtype) -> str:
    """The canonical name (``float32``, ``float16``, ``bfloat16``) of a dtype given by name, alias or torch dtype;
    UserError for any other."""
    return _canonical(value, DTYPES, _ALIASES, "dtype")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name (or alias)."""
    return DTYPES[dtype_name(name)]


def module_dtype(module: nn.Module) -> str:
    """The name of the floating dtype of a module's parameters (float32 where it has none); UserError where they
    mix or are of a dtype no schedule is made for."""
    found = sorted(str(p.dtype).removeprefix("torch.") for p in module.parameters() if p.is_floating_point())
    if not found:
        return DEFAULT_DTYPE
    if found[0] != found[-1] or found[0] not in DTYPES:
        held = " and ".join(sorted(set(found)))
        raise UserError(f"the model's parameters are {held}, and schedules are made for one of {', '.join(DTYPES)}; "
                        "pass dtype= (the search then measures in it) or convert the model (model.float()...).")
    return found[0]


def autocast_dtype(device_type: str) -> str | None:
    """The dtype ``torch.autocast`` runs ops on ``device_type`` in (``bfloat16``), None where it is off."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")


def memory_format_name(value: str | torch.memory_format) -> str:
    """The canonical name (``contiguous``, ``channels_last``) of a memory format given by name, alias or torch
    memory format; UserError for any other."""
    return _canonical(value, MEMORY_FORMATS, _FORMAT_ALIASES, "memory format")


def _canonical(value: object, table: Mapping[str, object], aliases: Mapping[str, str], what: str) -> str:
    """The name ``table`` holds ``value`` under (a torch object, a name in any case, an alias); UserError naming
    ``what`` for any other."""
    if isinstance(value, str):
        name = value.lower().removeprefix("torch.")
        name = aliases.get(name, name)
    else:
        name = next((n for n, known in table.items() if known == value), str(value))
    if name not in table:
        raise UserError(f"{what} must be one of {', '.join(table)}, not {str(value)!r}.")
    return name


def module_memory_format(module: nn.Module) -> str:
    """The memory format of a module's 4-D floating parameters (``contiguous`` where it has none, or only ones that
    are both, such as 1x1 conv weights); UserError where some are NCHW and others NHWC."""
    found = set()
    for p in module.parameters():
        if p.dim() == 4 and p.is_floating_point():
            nchw, nhwc = p.is_contiguous(), p.is_contiguous(memory_format=torch.channels_last)
            if nchw != nhwc:
                found.add(DEFAULT_MEMORY_FORMAT if nchw else "channels_last")
    if len(found) > 1:
        raise UserError("the model's 4-D parameters are partly contiguous (NCHW) and partly channels_last (NHWC); "
                        "convert the whole model (model.to(memory_format=torch.channels_last), or back with "
                        "torch.contiguous_format), or pass memory_format=.")
    return found.pop() if found else DEFAULT_MEMORY_FORMAT


def in_memory_format(tensor: torch.Tensor, memory_format: str) -> torch.Tensor:
    """A 4-D tensor laid out in ``memory_format`` (itself where it is already); any other tensor as it is."""
    if tensor.dim() != 4:
        return tensor
    return tensor.contiguous(memory_format=MEMORY_FORMATS[memory_format])


def is_in_memory_format(tensor: torch.Tensor, memory_format: str) -> bool:
    """Whether a 4-D tensor is laid out in ``memory_format`` (a view of one is not, unless it is one itself)."""
    return tensor.is_contiguous(memory_format=MEMORY_FORMATS[memory_format])


def to_memory_format(module: nn.Module, memory_format: str) -> nn.Module:
    """The module, its 4-D parameters and buffers laid out in ``memory_format`` in place. (``module.to(memory_format=
    torch.channels_last)`` does the same, but refuses a module that also holds a 5-D tensor, as timm's lambda layers
    do.)"""
    return module._apply(lambda tensor: in_memory_format(tensor, memory_format))


def converted(module: nn.Module, dtype: str, memory_format: str = DEFAULT_MEMORY_FORMAT) -> nn.Module:
    """The module itself where its floating parameters are in ``dtype`` and ``memory_format`` already, else a copy
    converted to both."""
    wanted = torch_dtype(dtype)
    if all(p.dtype == wanted and (p.dim() != 4 or is_in_memory_format(p, memory_format))
           for p in module.parameters() if p.is_floating_point()):
        return module
    return to_memory_format(copied(module).to(wanted), memory_format)


_M = TypeVar("_M", bound=nn.Module)


def copied(module: _M) -> _M:
    """A deep copy of a module. A tensor attribute computed with autograd history (the ``weight`` that a layer pruned
    with ``torch.nn.utils.prune`` computes from its parameters before each forward), which ``copy.deepcopy`` refuses,
    is copied detached."""
    memo: dict[int, object] = {id(t): t.detach().clone() for m in module.modules() for t in vars(m).values()
                               if isinstance(t, torch.Tensor) and not t.is_leaf}
    return copy.deepcopy(module, memo)


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (the CPU where it has none)."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def example_input(module: nn.Module, shape: Sequence[int], batch: int = 1) -> torch.Tensor:
    """A seeded random input of ``batch`` samples of ``shape``, on the module's device and in the dtype of its first
    floating parameter (float32 where it has none); the global random state is left alone."""
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    x = torch.randn(batch, *shape, generator=torch.Generator().manual_seed(0))
    return x.to(device=module_device(module), dtype=dtype)
