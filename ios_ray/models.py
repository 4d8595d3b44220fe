"""Resolving a model spec: a zoo name, ``torchvision:NAME``, ``timm:NAME``, ``smp:ARCH[/ENCODER]``,
``ultralytics:NAME`` (:mod:`ios_ray.libraries`), or ``package.module:factory`` for any nn.Module."""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
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
        raise _unknown(spec)
    library, _, name = spec.partition(":")
    if library in LIBRARIES:
        build, shape = library_model(library, name)
        return spec, _checked(build, spec), shape or DEFAULT_INPUT_SHAPE
    module_name, factory_name = library, name
    if _is_file(module_name):
        raise UserError(f"model {spec!r} names a file; name its module instead, as Python imports it from the "
                        f"current folder or PYTHONPATH: {_module_of(module_name)}:{factory_name}.")
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


def _unknown(spec: str) -> UserError:
    """The error for a spec without a colon that names no zoo model, saying what it most likely meant: a file or a
    module without the factory that builds the model in it, a library or its model's path, a factory joined to its
    module by a dot, a zoo name misspelt, or a library's model."""
    from ios_ray.zoo import ZOO

    if _is_file(spec):
        module = _module_of(spec)
        return UserError(f"model {spec!r} names a file; give its module, as Python imports it from the current folder "
                         f"or PYTHONPATH, and the function or class in it that builds the model: "
                         f"{_factory_hint(module, Path(spec))}.")
    if spec in LIBRARIES:
        return UserError(f"model {spec!r} names a library; add the model's name: {spec}:NAME.")
    head, _, tail = spec.rpartition(".")
    if head.split(".")[0] in LIBRARIES:
        return UserError(f"model {spec!r} names a library's model by its path; give the library and the model's name: "
                         f"{head.split('.')[0]}:{tail}.")
    _importable_from_here()
    if head and _module_file(head) is not None:
        return UserError(f"model {spec!r} joins the module and its factory with a dot; join them with a colon: "
                         f"{head}:{tail}.")
    found = _module_file(spec)
    if found is not None:
        return UserError(f"model {spec!r} names a module; add the function or class in it that builds the model: "
                         f"{_factory_hint(spec, found)}.")
    zoo = ", ".join(sorted(ZOO))
    close = difflib.get_close_matches(spec, list(ZOO), n=1, cutoff=0.8)
    if close:
        return UserError(f"unknown model {spec!r} (did you mean {close[0]}?); the zoo has {zoo}, a library's model "
                         "takes its library's name (torchvision:NAME, timm:NAME, smp:ARCH, ultralytics:NAME) and a "
                         "model of your own package.module:factory.")
    return UserError(f"unknown model {spec!r}; the zoo has {zoo}, a library's model takes its library's name, as "
                     f"torchvision:{spec} or timm:{spec} (also smp:ARCH and ultralytics:NAME), and a model of your own "
                     "package.module:factory.")


def _is_file(text: str) -> bool:
    """Whether a spec's module part is spelt as a file path."""
    return text.endswith(".py") or "/" in text or os.sep in text


def _module_of(path: str) -> str:
    """The dotted module a relative file path names (``nets/my_model.py``: ``nets.my_model``)."""
    return path.removesuffix(".py").lstrip("./").replace(os.sep, ".").replace("/", ".")


def _module_file(name: str) -> Path | None:
    """The source file of the module ``name`` where Python would import one from here (None: no such module, or
    one without a source file), found without running it (a dotted name's packages are imported)."""
    try:
        found = importlib.util.find_spec(name)
    except Exception:  # noqa: BLE001 - a package that fails to import names no module here, and this is an error's hint
        return None
    origin = found.origin if found is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def _factory_hint(module: str, path: Path) -> str:
    """``module:NAME`` with the one function or class the file defines at its top level, else ``module:FACTORY``
    followed by the first few it defines."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return f"{module}:FACTORY"
    names = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
             and not node.name.startswith("_")]
    if len(names) == 1:
        return f"{module}:{names[0]}"
    listed = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return f"{module}:FACTORY ({path.name} defines {listed})" if names else f"{module}:FACTORY"


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
