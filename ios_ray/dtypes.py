"""The floating-point types a model is searched and deployed in: their names, and the type and device a module has.

A schedule is made for one dtype (``float32``, ``float16`` or ``bfloat16``): a stage at half precision runs other
kernels, at other speeds, than at float32, so latencies are stored per dtype and a schedule file records its own.
A model object is searched in the dtype of its parameters unless told otherwise (a model held in float16 on a GPU
is searched in float16); a model spec is built in float32. A model is imported in the dtype it is searched in, on
the driver and on every actor: its graph can depend on it (timm's EdgeNeXt casts a positional encoding to its
weights' dtype, and the trace keeps that dtype).
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn

from ios_ray.errors import UserError

#: The dtypes a schedule can be made for, by their names in schedule files and the store.
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_DTYPE = "float32"
#: Other spellings users type for them.
_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}


def dtype_name(value: str | torch.dtype) -> str:
    """The canonical name (``float32``, ``float16``, ``bfloat16``) of a dtype given by name, alias or torch dtype;
    UserError for any other."""
    if isinstance(value, torch.dtype):
        name = next((n for n, t in DTYPES.items() if t == value), None)
    else:
        name = str(value).lower().removeprefix("torch.")
        name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)}, not {str(value)!r}.")
    return name


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


def converted(module: nn.Module, dtype: str) -> nn.Module:
    """The module itself where its floating parameters are all in ``dtype`` already, else a copy converted to it."""
    wanted = torch_dtype(dtype)
    if all(p.dtype == wanted for p in module.parameters() if p.is_floating_point()):
        return module
    return copy.deepcopy(module).to(wanted)


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
