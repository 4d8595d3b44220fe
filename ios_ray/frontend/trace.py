"""Tracing a module with torch.fx, and running the traced graph once to learn its shapes and its size values.

:func:`trace` names the submodule that failed when tracing fails. :func:`propagate` runs the graph on the example
input: every tensor node gets its ``tensor_meta`` (shape, dtype), as with torch.fx's ``ShapeProp``, and every other
node (a size, a shape, a flag) its Python ``value``, which :mod:`~ios_ray.frontend.sizes` folds into literals.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from ios_ray.errors import UserError, first_line


class _StackTracer(fx.Tracer):
    """An fx tracer that remembers which submodule it was inside when tracing failed."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.failed_in: str | None = None

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        path = self.path_of_module(m)
        self.stack.append(path)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            self.failed_in = self.failed_in or path
            raise
        finally:
            self.stack.pop()


def trace(module: nn.Module) -> fx.GraphModule:
    """Symbolically trace a module; failure raises UserError naming the submodule that could not be traced."""
    tracer = _StackTracer()
    try:
        graph = tracer.trace(module)
    except Exception as exc:  # noqa: BLE001 - fx raises many kinds; all become one sentence
        where = f"submodule {tracer.failed_in!r} ({type(module.get_submodule(tracer.failed_in)).__name__})" \
            if tracer.failed_in else f"module {type(module).__name__}"
        raise UserError(f"torch.fx cannot trace {where}: {first_line(exc)}") from exc
    return fx.GraphModule(tracer.root, graph)


class _ValueProp(ShapeProp):
    """ShapeProp that also keeps the value of every node whose result holds no tensor (``node.meta['value']``)."""

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if "tensor_meta" not in n.meta:
            n.meta["value"] = result
        return result


def propagate(gm: fx.GraphModule, example_input: torch.Tensor, name: str) -> None:
    """Run ``gm`` on the example input, recording shapes and size values in the nodes' meta."""
    with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints a traceback on failure
        try:
            _ValueProp(gm).propagate(example_input)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's forward is reported in one line
            cause = exc.__cause__ or exc  # ShapeProp wraps the model's own error
            raise UserError(f"running {name} on an input of shape {tuple(example_input.shape)} failed: "
                            f"{type(cause).__name__}: {first_line(cause)}") from cause
