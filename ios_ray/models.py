"""Resolving a model spec: a zoo name or ``package.module:factory`` for any fx-traceable nn.Module."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from torch import nn

from ios_ray.errors import UserError, first_line

DEFAULT_INPUT_SHAPE = (3, 224, 224)


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model and the per-sample input shape it expects."""

    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]


def resolve_model(spec: str) -> ModelSpec:
    """A zoo model by name, or ``package.module:factory`` (the factory's ``input_shape`` attribute, else 3x224x224)."""
    from ios_ray.zoo import ZOO

    if spec in ZOO:
        entry = ZOO[spec]
        return ModelSpec(entry.name, entry.build, tuple(entry.input_shape))
    if ":" not in spec:
        raise UserError(f"unknown model {spec!r}; choose one of {', '.join(sorted(ZOO))} or give package.module:factory.")
    module_name, _, factory_name = spec.partition(":")
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
