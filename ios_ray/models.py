"""Resolving a model spec: a zoo name, ``torchvision:NAME``, ``timm:NAME``, ``smp:ARCH[/ENCODER]``,
``ultralytics:NAME`` (:mod:`ios_ray.libraries`), or ``package.module:factory`` for any nn.Module."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from ios_ray.errors import UserError, first_line
from ios_ray.libraries import LIBRARIES, library_model

DEFAULT_INPUT_SHAPE = (3, 224, 224)


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model and the per-sample input shape it expects."""

    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]


def resolve_model(spec: str, input_shape: Sequence[int] | None = None) -> ModelSpec:
    """A zoo model by name, a library's model (``timm:NAME``... at the library's input size), or
    ``package.module:factory`` (the ``input_shape`` attribute of the factory, else of the module it returns, as for a
    model object, else 3x224x224); ``input_shape``, if given, is the per-sample input shape instead."""
    name, build, own = _resolve(spec)
    if input_shape is not None:
        return ModelSpec(name, build, _checked_shape(input_shape, "input_shape"))
    if own is not None:
        return ModelSpec(name, build, own)
    with torch.random.fork_rng(devices=[]):  # built to read its attribute: the caller's random state stays as it was
        shape = getattr(build(), "input_shape", DEFAULT_INPUT_SHAPE)
    return ModelSpec(name, build, _checked_shape(shape, f"the input_shape of the module {spec!r} builds"))


def _checked_shape(shape: object, what: str) -> tuple[int, ...]:
    """A per-sample input shape as a tuple; UserError naming ``what`` where it is not positive sizes."""
    sizes = tuple(shape) if isinstance(shape, (tuple, list, torch.Size)) else ()
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise UserError(f"{what} must be positive sizes such as (3, 224, 224), not {shape!r}.")
    return sizes


def _resolve(spec: str) -> tuple[str, Callable[[], nn.Module], tuple[int, ...] | None]:
    """A spec's name, builder and input shape (None: a factory that does not say; the module it builds may)."""
    from ios_ray.zoo import ZOO

    if spec in ZOO:
        entry = ZOO[spec]
        return entry.name, entry.build, tuple(entry.input_shape)
    if ":" not in spec:
        raise UserError(f"unknown model {spec!r}; choose one of {', '.join(sorted(ZOO))}, or give torchvision:NAME, "
                        "timm:NAME, smp:ARCH, ultralytics:NAME or package.module:factory.")
    library, _, name = spec.partition(":")
    if library in LIBRARIES:
        build, shape = library_model(library, name)
        return spec, _checked(build, spec), shape or DEFAULT_INPUT_SHAPE
    module_name, factory_name = library, name
    if module_name.endswith(".py") or "/" in module_name:
        dotted = module_name.removesuffix(".py").lstrip("./").replace("/", ".")
        raise UserError(f"model {spec!r} names a file; name its module instead, as Python imports it from the "
                        f"current folder or PYTHONPATH: {dotted}:{factory_name}.")
    _importable_from_here()
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load model factory {spec!r}: {exc}.") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module failed while being imported
        raise UserError(f"importing the module of model {spec!r} failed: {type(exc).__name__}: {first_line(exc)}.") \
            from exc
    if not callable(factory):
        raise UserError(f"{spec!r} is not a callable factory of an nn.Module.")
    shape = getattr(factory, "input_shape", None)
    return spec, _checked(factory, spec), None if shape is None else \
        _checked_shape(shape, f"the input_shape of the factory {spec!r}")


def _importable_from_here() -> None:
    """Let ``package.module:factory`` name code in the working directory, as ``python -m`` does (a console script's
    ``sys.path`` starts at its own folder instead)."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def _checked(factory: Callable[[], object], spec: str) -> Callable[[], nn.Module]:
    """The factory, with whatever it raises or returns other than an nn.Module turned into one sentence."""
    def build() -> nn.Module:
        try:
            module = factory()
        except Exception as exc:  # noqa: BLE001 - any failure of the user's factory is reported in one line
            raise UserError(f"building model {spec!r} failed: {type(exc).__name__}: {first_line(exc)}.") from exc
        if not isinstance(module, nn.Module):
            raise UserError(f"{spec!r} returned a {type(module).__name__}, not an nn.Module.")
        return module
    return build
