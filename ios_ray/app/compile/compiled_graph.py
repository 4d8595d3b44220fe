"""What the torch.compile backend returns for one graph: :class:`CompiledGraph`, which runs each call with the
schedule of its setting, or the graph as Dynamo handed it over where there is none.

A call is bound to the model's values it was given: Dynamo passes parameters and buffers as arguments at every
call, so a graph compiled once may run with another module's weights (a layer class whose ``forward`` Dynamo
compiled once and every instance calls) or with weights changed since. What runs was imported from a snapshot of
them (batch-norms folded), so each call compares the values it is given with those of its binding: the same tensors
(by identity) at the same versions (which every in-place change increases: an optimizer step, fused ones included
(:func:`~ios_ray.runtime.weights.follow_optimizer_steps`), ``load_state_dict``, a buffer filled by hand), and the
same numbers. Another set of values gets a binding of its own (the most recent
:data:`BINDINGS` are kept, each an import of the graph); changed values replace the binding.
``follow_weights=False`` skips the comparison, for a server whose weights never change.

Per binding and setting (device, batch size, dtype), the schedule is looked up once
(:class:`~ios_ray.app.compile.graph_schedules.GraphSchedules`), and one line says which schedule runs it and why (unless
``progress=False``; also the log ``ios_ray.backend`` at INFO); on a miss, ``on_miss="fallback"`` runs the fallback with
one warning per graph and setting, naming the search that would make the schedule, and ``on_miss="search"``
searches that setting on this machine (``ios_ray.search``, progress shown), writes the schedule into the schedules
folder and the latencies into the store, and runs it. Schedules run through the runtime's
:class:`~ios_ray.runtime.ScheduleRunner` (on a GPU, one CUDA graph replayed per input shape, its output copied out
of the graph's memory, so no output is overwritten by the next call). ``runs`` counts what ran, per call.
"""

from __future__ import annotations

import collections
import logging
import threading
import warnings
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable, Mapping, Sequence

import torch

from ios_ray.app.compile.graph_schedules import Found, GraphSchedules, device_label
from ios_ray.runtime.accuracy import relative_error
from ios_ray.dtypes import dtype_name, example_input
from ios_ray.errors import UserError, first_line
from ios_ray.frontend import Imported, import_module
from ios_ray.frontend.dynamo import GraphCall
from ios_ray.ir import Graph
from ios_ray.runtime import Program, Programs, ScheduleRunner
from ios_ray.runtime.weights import follow_optimizer_steps

log = logging.getLogger("ios_ray.backend")

#: How many sets of model values (bindings) a graph keeps imported at once; the least recently used goes first.
BINDINGS = 8
#: How far the import of a graph fixed at one batch size may stray from it there: a wrong import (a batch size
#: taken for a channel count) is off by the size of the output itself.
FIXED_BATCH_TOLERANCE = 1e-2
#: ``runs`` key of the calls that ran the fallback.
FALLBACK = "fallback"
_version = attrgetter("_version")

Setting = tuple[int, torch.dtype, torch.device]


@dataclass(frozen=True)
class Choice:
    """What runs one setting of a binding: a schedule's runner and where the schedule came from."""

    runner: ScheduleRunner
    origin: str


@dataclass
class Binding:
    """A graph holding one set of model values, imported (named after the graph it imports to), with what runs
    each setting (None: the fallback)."""

    call: GraphCall
    imported: Imported
    name: str
    held: tuple[Any, ...]
    versions: tuple[int, ...]
    chosen: dict[Setting, Choice | None] = field(default_factory=dict)
    programs: Programs | None = None

    @classmethod
    def of(cls, call: GraphCall, name: str, shape: Sequence[int]) -> Binding:
        """Import ``call`` (a batch-1 input of per-sample ``shape``) as it holds its values now; its name is ``name``
        and the start of its graph's fingerprint."""
        held = tuple(call.held())
        x = example_input(call, shape, call.batch or 1)
        imported = import_module(call, x, name)
        programs = Programs(imported)
        if call.batch is not None:
            programs.keep(_check_fixed_batch(call, imported, x, name))
        return cls(call, imported, f"{name}.{imported.graph.fingerprint[:12]}", held, _versions(held),
                   programs=programs)

    @property
    def graph(self) -> Graph:
        """The graph the binding imports to."""
        return self.imported.graph

    def holds(self, values: Sequence[Any]) -> bool:
        """Whether ``values`` are this binding's model values as they were imported."""
        return len(values) == len(self.held) and all(
            a is b or (not isinstance(a, torch.Tensor) and a == b) for a, b in zip(values, self.held)
        ) and _versions(values) == self.versions


class CompiledGraph:
    """One graph as the ios_ray backend compiled it: callable as Dynamo calls it (``*args`` in, a tuple out)."""

    def __init__(
        self, call: GraphCall, name: str, schedules: GraphSchedules, fallback: Callable[..., Any], on_miss: str,
        search_options: Mapping[str, Any], follow_weights: bool = True, cuda_graph: bool | None = None,
    ) -> None:
        self.call = call
        self.name = name
        self.schedules = schedules
        self.fallback = fallback
        self.on_miss = on_miss
        self.search_options = dict(search_options)
        self.follow_weights = follow_weights
        self.cuda_graph = cuda_graph
        if follow_weights:
            follow_optimizer_steps()  # a fused optimizer step writes parameters without increasing their versions
        self.runs: collections.Counter[str] = collections.Counter()
        self.searches = 0
        self.unimported: str | None = None
        self._input = call.input_position
        self._held = call.held_positions
        self._bindings: collections.OrderedDict[tuple[Any, ...], Binding] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._warned: set[tuple[str, Setting]] = set()

    @property
    def graph(self) -> Graph | None:
        """The graph of the values most recently run (None before the first call, or where it does not import)."""
        return next(reversed(self._bindings.values())).graph if self._bindings else None

    def __call__(self, *args: Any) -> Any:
        """Run one call: the schedule of its setting where there is one, else the fallback."""
        x = args[self._input]
        with self._lock:  # calls from several threads: one chooses (and imports) at a time
            binding = self._binding(args, x) if self.unimported is None else None
            choice = self._choice(binding, x) if binding is not None else None
        if choice is None:
            self.runs[FALLBACK] += 1
            return self.fallback(*args)
        self.runs[choice.origin] += 1
        return self.call.finish(binding.imported.output.pack(choice.runner(x)), args)  # type: ignore[union-attr]

    def _binding(self, args: Sequence[Any], x: torch.Tensor) -> Binding | None:
        """The binding of this call's model values and per-sample shape: kept, else imported now (None, with a
        warning, where the graph does not import: it then always runs its fallback)."""
        held = [args[i] for i in self._held]
        key = _key(held, tuple(x.shape[1:]))
        binding = self._bindings.get(key)
        if binding is not None and (not self.follow_weights or binding.holds(held)):
            self._bindings.move_to_end(key)
            return binding
        try:
            binding = Binding.of(self.call.holding(args), self.name, tuple(x.shape[1:]))
        except Exception as error:  # noqa: BLE001 - the graph still runs, as Dynamo handed it over
            self.unimported = first_line(error) if isinstance(error, UserError) else \
                f"{type(error).__name__}: {first_line(error)} (an error of ios-ray's; please report it)"
            warnings.warn(f"ios_ray: {self.name} runs as Dynamo handed it over, since it does not import: "
                          f"{self.unimported}", stacklevel=3)
            return None
        self._bindings[key] = binding
        self._bindings.move_to_end(key)
        while len(self._bindings) > BINDINGS:
            self._bindings.popitem(last=False)
        return binding

    def _choice(self, binding: Binding, x: torch.Tensor) -> Choice | None:
        """What runs ``x``'s setting for this binding, chosen on its first call."""
        setting = (x.shape[0], x.dtype, x.device)
        if setting in binding.chosen:
            return binding.chosen[setting]
        found = self._find(binding, x)
        choice = None
        if found is not None:
            assert binding.programs is not None, "a binding is made with its programs"
            program = binding.programs(x.device, found.schedule.kernels)
            choice = Choice(ScheduleRunner(program, found.schedule, x.device, self.cuda_graph), found.origin)
            line = (f"ios_ray: {binding.name} batch {x.shape[0]} {dtype_name(x.dtype)} on {x.device} runs the schedule "
                    f"of {found.origin} ({_why(found)})")
            log.info(line)
            if self.search_options.get("progress", True) is not False:
                print(line, flush=True)
        binding.chosen[setting] = choice
        return choice

    def _find(self, binding: Binding, x: torch.Tensor) -> Found | None:
        """The schedule for ``x``'s setting: found, else searched (``on_miss="search"``) or None (with a warning)."""
        found = self.schedules.find(binding.graph, binding.name, x.device, x.shape[0], x.dtype, binding.call)
        if found is not None:
            return found
        if self.on_miss == "search":
            return self._search(binding, x)
        self._warn(binding, x)
        return None

    def _search(self, binding: Binding, x: torch.Tensor) -> Found:
        """Search the setting of ``x`` on this machine, store it, and take its schedule."""
        from ios_ray.app.search.api import search

        label = device_label(x.device)
        options = {"store": self.schedules.store, "out": self.schedules.folder, **self.search_options}
        result = search(binding.call, [label], [int(x.shape[0])], name=binding.name, input_shape=tuple(x.shape[1:]),
                        dtype=dtype_name(x.dtype), memory_format=binding.graph.memory_format, **options)
        self.searches += 1
        [outcome] = result.outcomes  # type: ignore[union-attr]  # a search without torch_compile: a SearchResult
        where = str(outcome.path) if outcome.path is not None else f"a search on {label}"
        self.schedules.add(outcome.schedule, where)
        return Found(outcome.schedule, where)

    def _warn(self, binding: Binding, x: torch.Tensor) -> None:
        """Say once per graph and setting that no schedule was found, and what would search it."""
        setting = (x.shape[0], x.dtype, x.device)
        if (binding.name, setting) in self._warned:
            return
        self._warned.add((binding.name, setting))
        label, batch, dtype = device_label(x.device), int(x.shape[0]), dtype_name(x.dtype)
        dtype_option = "" if dtype == "float32" else f", dtype={dtype!r}"
        out = str(self.schedules.folder or "schedules")
        warnings.warn(
            f"ios_ray: no schedule for graph {binding.name} ({len(binding.graph.units)} units) on {label} at batch "
            f"{batch} in {dtype} in {self.schedules.describe()}, so it runs as Dynamo handed it over; search it "
            f"ahead of time with ios_ray.search(model, [{label!r}], [{batch}], torch_compile=True{dtype_option}, "
            f"out={out!r}) or ios-ray search --model SPEC --torch-compile, or compile with "
            "backend=ios_ray.backend(on_miss='search').", stacklevel=2)


def _why(found: Found) -> str:
    """Why a graph runs the schedule it found: the decision of the search that kept it, else where it comes from."""
    check = found.schedule.end_to_end
    if check is not None:
        return check.decision
    if found.origin == "its one schedule":
        return "one unit per block: nothing to choose"
    if found.schedule.source == "simulated":
        return f"planned for {found.schedule.device}, simulated"
    if found.origin.startswith("the DP over"):
        return "the IOS schedule over the stored latencies, not timed end to end"
    return "kept IOS: not checked end to end"


def _check_fixed_batch(call: GraphCall, imported: Imported, x: torch.Tensor, name: str) -> Program:
    """The program of the import of a graph Dynamo fixed at ``x``'s batch size, on ``x``'s device; UserError where it
    does not compute the graph at that batch (a size Dynamo wrote as a number that
    :func:`~ios_ray.frontend.dynamo.batch_read_back` does not read back)."""
    program = Program.from_imported(imported, x.device)
    with torch.no_grad():
        expected = torch.cat([t.reshape(-1) for t in call(x) if isinstance(t, torch.Tensor)])
        got = imported.output.pack(program.run(x))
        got = torch.cat([t.reshape(-1) for t in got if isinstance(t, torch.Tensor)])
    if got.shape != expected.shape or relative_error(got, expected) > FIXED_BATCH_TOLERANCE:
        raise UserError(f"{name} was compiled for batch {x.shape[0]} only (dynamic=False, or a first compile) and "
                        "holds a size read from its input as a number that its import cannot follow; compile with "
                        "dynamic=True")
    return program


def _key(held: Sequence[Any], shape: tuple[int, ...]) -> tuple[Any, ...]:
    """A binding's key: the identities of the tensors (and the values of the numbers) a call holds, and its shape."""
    return (*(id(v) if isinstance(v, torch.Tensor) else v for v in held), shape)


def _versions(values: Sequence[Any]) -> tuple[int, ...]:
    """The version counters of the tensors among ``values``."""
    return tuple(map(_version, (v for v in values if isinstance(v, torch.Tensor))))
