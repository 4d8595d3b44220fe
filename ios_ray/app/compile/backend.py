"""The torch.compile backend: ``torch.compile(model, backend="ios_ray")``, or ``backend=ios_ray.backend(**options)``.

Dynamo hands a backend one fx graph per graph break, with the model's parameters among its inputs. Each graph is
wrapped into a module of one input batch holding those parameters (:func:`~ios_ray.frontend.dynamo.graph_call`),
imported through the same pipeline as any model, and run with the schedule of each call's setting
(:class:`~ios_ray.app.compile.compiled_graph.CompiledGraph`; where it is found: :mod:`ios_ray.app.compile.graph_schedules`). A
graph that cannot be one module of one input batch runs as its fallback, with one warning saying why.

Options are checked when :func:`backend` is called, so a bad one is one sentence before Dynamo runs. An error while a
graph compiles is a :class:`CompileError`: a :class:`~ios_ray.errors.UserError` that Dynamo passes on as it is (it
is also Dynamo's ``ShortenTraceback``), its traceback cut to the backend's frame and its message one sentence
naming the graph.
"""

from __future__ import annotations

import collections
import inspect
import types
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch.fx as fx
from torch._dynamo.exc import ShortenTraceback

from ios_ray.app.compile.compiled_graph import FALLBACK, CompiledGraph
from ios_ray.app.compile.graph_schedules import GraphSchedules
from ios_ray.errors import UserError
from ios_ray.app.search.options import SearchOptions, api_parameters
from ios_ray.frontend.dynamo import Unschedulable, graph_call, graph_name
from ios_ray.schedule import Schedule
from ios_ray.scheduler import SearchParams
from ios_ray.store import DEFAULT_STORE_PATH

#: What a graph without a schedule for a call's setting runs (``on_miss``): its fallback, or a search first.
ON_MISS = ("fallback", "search")
#: What the fallback is: the graph as Dynamo handed it over, or Inductor's code for it.
FALLBACKS = ("eager", "inductor")
#: Search options that the backend sets itself for a graph (its device, batch, shape, dtype, name and files).
_SET_PER_GRAPH = ("model", "devices", "batches", "input_shape", "name", "dtype", "memory_format", "store", "out")


class CompileError(UserError, ShortenTraceback):
    """A graph the backend cannot compile, in one sentence; Dynamo raises it as it is, cut to the backend's frame."""

    def __init__(self, message: str, frame: types.FrameType | None = None) -> None:
        ShortenTraceback.__init__(self, message, first_useful_frame=frame)
        self.message = message

    def __str__(self) -> str:
        return self.message  # Dynamo appends its hints to the arguments; the sentence is the message


@dataclass(frozen=True)
class BackendOptions:
    """Every option of the backend and its default (see :func:`backend`)."""

    schedules: str | Path | Sequence[Schedule] | None = "schedules"
    store: str | Path | None = DEFAULT_STORE_PATH
    on_miss: str = "fallback"
    fallback: str = "eager"
    follow_weights: bool = True
    cuda_graph: bool | None = None
    search: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> BackendOptions:
        """The options given by name (a search option such as ``r`` goes to ``search``); UserError naming a bad
        one."""
        own = {f.name for f in fields(cls)} - {"search"}
        searchable = _search_options() if set(options) - own else set()
        unknown = sorted(set(options) - own - searchable)
        if unknown:
            raise UserError(f"ios_ray.backend has no option {unknown[0]!r}; its options are {', '.join(sorted(own))} "
                            f"and the search options of ios_ray.search ({', '.join(sorted(searchable))}).")
        parsed = cls(**{k: v for k, v in options.items() if k in own},
                     search={k: v for k, v in options.items() if k not in own})
        parsed.check()
        SearchOptions(**{k: v for k, v in parsed.search.items() if k != "progress"})  # UserError naming a bad one
        return parsed

    def check(self) -> None:
        """UserError naming the first option whose value is not one it takes."""
        if self.on_miss not in ON_MISS:
            raise UserError(f"on_miss must be one of {', '.join(ON_MISS)}, not {self.on_miss!r}.")
        if self.fallback not in FALLBACKS:
            raise UserError(f"fallback must be one of {', '.join(FALLBACKS)}, not {self.fallback!r}.")
        if self.on_miss == "search" and self.store is None:
            raise UserError("on_miss='search' stores what it measures, so it needs a store; give store=PATH.")
        if self.schedules is not None and not isinstance(self.schedules, (str, Path)):
            odd = [s for s in self.schedules if not isinstance(s, Schedule)] \
                if isinstance(self.schedules, (list, tuple)) else [self.schedules]
            if odd:
                raise UserError(f"schedules must be a folder or a list of Schedule objects, not {odd[0]!r}.")
        if self.store is not None and not isinstance(self.store, (str, Path)):
            raise UserError(f"store must be a path (str or Path) or None, not {self.store!r}.")
        if not isinstance(self.follow_weights, bool):
            raise UserError(f"follow_weights must be True or False, not {self.follow_weights!r}.")
        if self.cuda_graph not in (None, True, False):
            raise UserError(f"cuda_graph must be None, True or False, not {self.cuda_graph!r}.")


@dataclass
class FallbackGraph:
    """A graph that runs as its fallback because it cannot be one module of one input batch (``reason`` says why):
    callable as Dynamo calls it, and, as a :class:`CompiledGraph`, named, with ``runs`` counting its calls."""

    name: str
    reason: str
    fallback: Callable[..., Any]
    runs: collections.Counter[str] = field(default_factory=collections.Counter)
    graph: None = None  # no imported graph

    def __call__(self, *args: Any) -> Any:
        self.runs[FALLBACK] += 1
        return self.fallback(*args)

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


class IosRayBackend:
    """The backend with its options: called by Dynamo with each graph and its example inputs; ``graphs`` lists what
    it compiled (a :class:`CompiledGraph`, or a :class:`FallbackGraph` saying why a graph runs as its fallback)."""

    __name__ = "ios_ray"

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        params = SearchParams(**{k: options.search[k] for k in ("r", "s") if k in options.search})
        self.schedules = GraphSchedules(options.schedules, options.store, params, options.search.get("memory_budget"))
        self.graphs: list[CompiledGraph | FallbackGraph] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], **dynamo: Any) -> Callable[..., Any]:
        """Compile one graph Dynamo hands over (``mode`` and ``options`` as torch.compile passes them)."""
        frame = inspect.currentframe()
        if dynamo.get("mode") not in (None, "default"):
            raise CompileError(f"the ios_ray backend runs its own CUDA graphs, so torch.compile's mode="
                               f"{dynamo['mode']!r} is not taken; leave mode out.", frame)
        if dynamo.get("options"):
            backend = IosRayBackend(_parse({**_given(self.options), **dynamo["options"]}, frame))
            return backend(gm, example_inputs)
        name = graph_name(gm)
        fallback = self._fallback(gm, example_inputs)
        try:
            call = graph_call(gm, example_inputs)
        except Unschedulable as reason:
            self.graphs.append(FallbackGraph(name, str(reason), fallback))
            warnings.warn(f"ios_ray: {name} runs as {self.options.fallback} code: {reason}.", stacklevel=2)
            return self.graphs[-1]
        compiled = CompiledGraph(call, name, self.schedules, fallback, self.options.on_miss, self.options.search,
                                 self.options.follow_weights, self.options.cuda_graph)
        self.graphs.append(compiled)
        return compiled

    def _fallback(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """What runs the graph where no schedule does: its own code, or Inductor's."""
        if self.options.fallback == "inductor":
            from torch._inductor import compile_fx

            return compile_fx.compile_fx(gm, list(example_inputs))  # type: ignore[return-value]  # given a module
        return gm.forward


def backend(**options: Any) -> IosRayBackend:
    """The ios_ray torch.compile backend with options: ``torch.compile(model, backend=ios_ray.backend(...))``.

    In one step, search and compile: ``torch.compile(model, backend=ios_ray.backend(on_miss="search"))``: each graph's
    first call on a device, batch size and dtype searches it on this machine (minutes on a large model), stores the
    latencies and writes the schedule, then runs it; the next compile, here or in another process, only looks it up.
    Each graph prints one line of which schedule it runs and why (``progress=False``: none). With the defaults
    (``backend="ios_ray"``) a graph nobody searched runs as Dynamo handed it over, with one warning naming that
    call.

    Args:
        schedules: a folder of schedule files (``ios-ray search --out``; default ``schedules``) or a list of
            :class:`~ios_ray.schedule.Schedule` objects.
        store: the latency store (default ``ios_store/latency.duckdb``): a graph whose every needed stage it holds
            for this machine's device gets the DP's schedule without measuring; ``None``: none.
        on_miss: ``"fallback"`` (default) runs a graph without a schedule as its fallback, with one warning per
            graph and setting naming the search that would make it; ``"search"`` searches it on this machine first.
        fallback: ``"eager"`` (default: the graph as Dynamo handed it over) or ``"inductor"``.
        follow_weights: compare each call's weights with those imported (False: a server whose weights never change).
        cuda_graph: replay each schedule as one CUDA graph on a GPU (default: on a GPU).
        **search_options: ``ios_ray.search``'s options for ``on_miss="search"`` (``r``, ``s``, ``check_rounds``...);
            ``progress=False`` also silences the line each graph prints, and ``memory_budget`` also keeps the
            store's DP schedule within it (as a search keeps its own).

    Returns:
        The backend; its ``graphs`` list what each graph runs and its ``runs`` counter.

    Raises:
        UserError: an option it does not take, named.

    Example::

        fast = torch.compile(model, backend=ios_ray.backend(on_miss="search"))
        fast(x)   # searches each graph at this setting, then runs its schedule; later calls only run it
    """
    return IosRayBackend(BackendOptions.parse(options))


def ios_ray(gm: fx.GraphModule, example_inputs: Sequence[Any], **dynamo: Any) -> Callable[..., Any]:
    """The backend registered as ``"ios_ray"`` (entry point group ``torch_dynamo_backends``), with default options;
    torch.compile's ``options={...}`` give it others."""
    return IosRayBackend(BackendOptions())(gm, example_inputs, **dynamo)


def _search_options() -> set[str]:
    """The options of ``ios_ray.search`` a backend passes on to a search of a graph, ``progress`` among them."""
    return {p.name for p in api_parameters()} - set(_SET_PER_GRAPH) | {"progress"}


def _parse(options: Mapping[str, Any], frame: types.FrameType | None) -> BackendOptions:
    """The options of torch.compile's ``options={...}``; CompileError naming a bad one."""
    try:
        return BackendOptions.parse(options)
    except UserError as error:
        raise CompileError(str(error), frame) from None


def _given(options: BackendOptions) -> dict[str, Any]:
    """The options as :func:`backend` takes them."""
    own = {f.name: getattr(options, f.name) for f in fields(options) if f.name != "search"}
    return {**own, **options.search}

