"""Searching ahead of time the graphs torch.compile will hand the ios_ray backend: :func:`search_graphs`, behind
``ios_ray.search(model, ..., torch_compile=True)`` and ``ios-ray search --torch-compile``.

For each batch size the model is compiled with a backend that records each graph Dynamo hands over
(:class:`Recorder`, ``dynamic=False``, as a first compile is) and runs it as it is, on a seeded input; each graph
that can run a schedule is then searched as a model of its own (:func:`ios_ray.search`), so that its latencies land
in the store and its schedule in ``out``, where ``torch.compile(model, backend="ios_ray")`` finds it by the
fingerprint of its graph and measures nothing.

A model may compile to other graphs once it has run: Ultralytics' detection head caches its anchors on its first
call, and the graph break that computing them causes is what splits a first compile into one graph per module
forward; a model compiled after it ran (as a user does who checks it eagerly first) is one graph. So
:func:`record_graphs` records what a first compile runs on its first and second call (the second recompiles what the
first call's changes invalidated) and what a compile of the model after it ran runs, each distinct graph once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.fx as fx
from torch import nn

from ios_ray.app.search.outcome import SearchOutcome
from ios_ray.dtypes import example_input
from ios_ray.errors import UserError, first_line
from ios_ray.frontend import in_eval_mode
from ios_ray.frontend.dynamo import GraphCall, Unschedulable, graph_call, graph_name
from ios_ray.models import DEFAULT_INPUT_SHAPE, resolve_model
from ios_ray.schedule import Schedule


@dataclass(frozen=True)
class CompiledSearchResult:
    """What a search of a model's torch.compile graphs found: one search result per graph that runs a schedule,
    and ``skipped``: ``"graph: why"`` for each that runs as Dynamo hands it over."""

    model: str
    graphs: tuple[Any, ...]
    skipped: tuple[str, ...]

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """Every graph's schedule for every (device, batch)."""
        return tuple(s for graph in self.graphs for s in graph.schedules)

    def __iter__(self) -> Iterator[SearchOutcome]:
        return (outcome for graph in self.graphs for outcome in graph)

    def save(self, out: str | Path) -> list[Path]:
        """Write every graph's schedules under ``out`` (as :meth:`SearchResult.save` does)."""
        return [path for graph in self.graphs for path in graph.save(out)]

    def __repr__(self) -> str:
        lines = [f"CompiledSearchResult({self.model!r}: {len(self.graphs)} graph(s) searched, {len(self.skipped)} "
                 "left as Dynamo hands them over):"]
        lines += ["  " + line for graph in self.graphs for line in repr(graph).splitlines()]
        lines += [f"  not scheduled: {why}" for why in self.skipped]
        return "\n".join(lines)


class Recorder:
    """A backend that keeps each graph Dynamo hands over as a :class:`GraphCall` named after where it comes from
    (or, in ``skipped``, why it cannot be one) and runs it as it is."""

    __name__ = "ios_ray_recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, GraphCall, tuple[int, ...]]] = []
        self.skipped: list[str] = []
        self._seen: set[tuple[str, tuple[Any, ...]]] = set()

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], **_: Any) -> Callable[..., Any]:
        """Record one graph (once: a graph handed over again by another compile is not); run it as it is."""
        seen = (gm.code, tuple(_signature(v) for v in example_inputs))
        if seen in self._seen:
            return gm.forward
        self._seen.add(seen)
        name = f"graph{len(self.calls) + len(self.skipped)} ({graph_name(gm)})"
        try:
            call = graph_call(gm, example_inputs)
        except Unschedulable as reason:
            self.skipped.append(f"{name}: {reason}")
            return gm.forward
        self.calls.append((name, call, tuple(example_inputs[call.input_position].shape[1:])))
        return gm.forward


def record_graphs(model: nn.Module, x: torch.Tensor) -> Recorder:
    """The graphs torch.compile hands a backend for ``model`` called on ``x`` (without gradients): a first compile's
    on its first two calls, and a compile's of the model after it ran (see the module docstring)."""
    recorder = Recorder()
    with torch.no_grad():
        first = torch.compile(model, backend=recorder, dynamic=False)
        first(x)
        first(x)
        # another backend object, so that Dynamo compiles afresh rather than reuse the first compile's code
        torch.compile(model, backend=lambda gm, inputs, **kw: recorder(gm, inputs, **kw), dynamic=False)(x)
    return recorder


def _signature(value: Any) -> Any:
    """What tells two example inputs of one graph code apart: a tensor's shape and dtype, else the value."""
    return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else repr(value)


def search_graphs(
    model: nn.Module | str, batches: Sequence[int], input_shape: Sequence[int] | None, name: str | None,
    search: Callable[..., Any], options: Mapping[str, Any],
) -> CompiledSearchResult:
    """Search every graph torch.compile hands the backend for ``model`` at each batch size, with ``search`` (that
    is, ``ios_ray.search``) and its ``options``."""
    module, shape, model_name = _module(model, input_shape, name)
    graphs, skipped = [], []
    for batch in batches:
        with in_eval_mode(module):
            recorder = record_graphs(module, example_input(module, shape, batch))
        skipped += [why for why in recorder.skipped if why not in skipped]
        for graph, call, graph_shape in recorder.calls:
            try:
                graphs.append(search(call, batches=[batch], input_shape=graph_shape, name=f"{model_name}.{graph.split()[0]}",
                                     **options))
            except UserError as error:  # the graph does not import: it runs as Dynamo hands it over
                skipped.append(f"{graph}: {first_line(error)}")
    if not graphs:
        raise UserError(f"torch.compile hands the ios_ray backend no graph of {model_name} that a schedule can run "
                        f"({'; '.join(skipped) or 'it compiled none'}).")
    return CompiledSearchResult(model_name, tuple(graphs), tuple(skipped))


def _module(model: nn.Module | str, input_shape: Sequence[int] | None, name: str | None
            ) -> tuple[nn.Module, tuple[int, ...], str]:
    """The module to compile (a spec built, or the object), its per-sample input shape and its name."""
    if isinstance(model, str):
        spec = resolve_model(model, input_shape)
        return spec.build().eval(), tuple(spec.input_shape), name or spec.name
    if not isinstance(model, nn.Module):
        raise UserError(f"torch_compile=True searches an nn.Module or a model spec, not a {type(model).__name__}.")
    shape: Sequence[int] = input_shape if input_shape else getattr(model, "input_shape", DEFAULT_INPUT_SHAPE)
    return model, tuple(shape), name or type(model).__name__
