"""Resolving a model spec: a zoo name, ``torchvision:NAME``, ``timm:NAME``, ``smp:ARCH[/ENCODER]``,
``ultralytics:NAME`` (:mod:`ios_ray.libraries`), or ``package.module:factory`` for any nn.Module."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

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
    ``package.module:factory`` (the factory's ``input_shape`` attribute, else 3x224x224); ``input_shape``, if given,
    is the per-sample input shape instead."""
    model = _resolve(spec)
    if input_shape is None:
        return model
    if not input_shape or any(not isinstance(n, int) or n < 1 for n in input_shape):
        raise UserError(f"input_shape must be positive sizes such as (3, 224, 224), not {tuple(input_shape)}.")
    return dataclasses.replace(model, input_shape=tuple(input_shape))


def _resolve(spec: str) -> ModelSpec:
    from ios_ray.zoo import ZOO

    if spec in ZOO:
        entry = ZOO[spec]
        return ModelSpec(entry.name, entry.build, tuple(entry.input_shape))
    if ":" not in spec:
        raise UserError(f"unknown model {spec!r}; choose one of {', '.join(sorted(ZOO))}, or give torchvision:NAME, "
                        "timm:NAME, smp:ARCH, ultralytics:NAME or package.module:factory.")
    library, _, name = spec.partition(":")
    if library in LIBRARIES:
        build, shape = library_model(library, name)
        return ModelSpec(spec, _checked(build, spec), shape or DEFAULT_INPUT_SHAPE)
    module_name, factory_name = library, name
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
    shape = tuple(getattr(factory, "input_shape", DEFAULT_INPUT_SHAPE))
    return ModelSpec(spec, _checked(factory, spec), shape)


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
