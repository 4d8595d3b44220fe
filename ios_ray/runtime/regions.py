"""Regions: code that runs on one thread and stream, compiled by Inductor into one function (the ``inductor``
kernels, :mod:`~ios_ray.runtime.kernels`).

Inside a stage of one group, and between such stages, nothing runs at once: there a fusing compiler's code is what
runs fastest (elementwise ops fused into one loop, no tensor written between them that nothing else reads). So a
pass with ``inductor`` kernels cuts its stages at every stage of several groups: each run of the others (one-group
and merge stages) is one :class:`Region` (:func:`region_steps`), and each group of a stage of several groups is one
too (:func:`in_regions`), run at once with the stage's other groups, each on its worker thread or side stream as with
other kernels; where either holds a single unit, that unit runs as it is (:data:`LEAST_UNITS`), as ``fused`` kernels
run it. The schedule decides where the regions end. A region traces its units as torch's own ops on the same weights
(the program's ``traced_fns``: a fused call would hide the convolution from Inductor, which fuses around it itself).
A stage alone, as the profiler times it, is not compiled: it runs the fused calls.

Passes over one program share their regions (:attr:`~ios_ray.runtime.program.Program.regions`): where two run the
same group, or the same run of stages returning the same values (the candidates of a search's check, the schedules
of two batch sizes), they call one region, compiled once.

A region is compiled per input signature (shapes, strides, dtype and device of its inputs), at the first call with
it: that call runs the region's code as it is (so every lazily made tensor is real), then the code is traced with
fake tensors (``make_fx``: a trace that would have to read a tensor's value, which it would freeze into the code,
stops instead) and compiled by Inductor (``compile_fx``) with its weights frozen (constants of the code: Inductor
packs a conv's weight for oneDNN once and folds what it can, as ``torch.compile`` does with freezing; not in float64
on a CPU, which oneDNN lacks); later calls with the signature run the compiled function. Each signature's function
holds its own packed weights. The first call returns what the compiled function returns, as every later call does:
a region after it sees inputs laid out as they will always be, so one call compiles every region of a pass.
On a GPU the first call is the capture's warm-up, so nothing compiles inside a capture. Within
:func:`tracing_ahead` a first call runs the code and traces it without compiling: the traces of several passes then
compile side by side (:mod:`~ios_ray.runtime.ahead`), or each at its region's next first call (the traced pass
returns its code's outputs: where compiled code laid its outputs out otherwise, a region after it would compile
again, at its first call, for the strides it then sees; Inductor keeps a graph's output strides). A region that
cannot be traced or compiled (a value read, no C++ compiler, an op Inductor lacks) runs its code as it is, with one
warning saying why: slower, never wrong.

A region is compiled as Dynamo hands a graph to Inductor (fake inputs of static shape in a tracing context), so
that Inductor's on-disk cache of compiled graphs (the FX graph cache) serves a region compiled before, in this
process or another, whatever its weights: frozen weights are read from the region's own graph, packed by its own
compile, and the cache keys them by shape and dtype only. Inductor refuses to cache code whose frozen weights are
oneDNN tensors (a CPU's packed convs and linears, in float32 and bfloat16), though it reads those from the graph as it
reads any other: while a region compiles they are keyed as other frozen weights are
(:func:`_packed_weights_keyed_as_frozen`). Figures in bench/RESULTS.md, "Inductor's FX graph cache and regions".
"""

from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterator, MutableMapping, Sequence
from unittest import mock

import torch

from ios_ray.errors import first_line
from ios_ray.runtime.codegen import GroupCode, StageStep, steps_code
from ios_ray.runtime.program import Program
from ios_ray.runtime.stages import CompiledStage, GroupRun, ParallelStage, stage_step, traced_step

#: Held while a region compiles: the groups of a stage run on worker threads, and Inductor compiles one at a time.
_ONE_COMPILE_AT_A_TIME = threading.Lock()

#: The fewest units a region holds: a lone unit runs as it is (its compile would cost a second or more, in every
#: deployment and every candidate of a search's check, and fuse nothing its own call does not).
LEAST_UNITS = 2

#: A region's inputs as they decide its compiled code: shape, strides, dtype and device of each.
Signature = tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device], ...]


def signature(inputs: Sequence[torch.Tensor]) -> Signature:
    """What a region's compiled code is specialised to: each input's shape, strides, dtype and device."""
    return tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in inputs)


@dataclass(frozen=True)
class Trace:
    """A region's code traced for one input signature by a pass run ahead (:func:`tracing_ahead`), with the number of
    torch threads of the thread that called it (its C++ code is specialised to it): compiled by :meth:`compile`."""

    region: "Region"
    signature: Signature
    graph: torch.fx.GraphModule
    threads: int

    def compile(self) -> None:
        """Compile the region for this signature now (from Inductor's cache where a compile worker put it there), on
        the calling thread as if on the region's own: its first call with the signature then runs compiled code."""
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            self.region.compiled[self.signature] = self.region._compiled(placeholders(self.signature))
        finally:
            torch.set_num_threads(threads)


_traces: list[Trace] | None = None


@contextlib.contextmanager
def tracing_ahead() -> Iterator[list[Trace]]:
    """Within it, a region's first call with a new signature runs its code as it is and traces it, instead of
    compiling it: the traces made, in order, to compile side by side (:mod:`~ios_ray.runtime.ahead`). A region left
    uncompiled compiles its trace at its next first call."""
    global _traces
    before, _traces = _traces, []
    try:
        yield _traces
    finally:
        _traces = before


def placeholders(key: Signature) -> list[torch.Tensor]:
    """Tensors of a signature, their values unset: what a region's compile needs of its inputs."""
    return [torch.empty_strided(shape, strides, dtype=dtype, device=device) for shape, strides, dtype, device in key]


@dataclass
class Region:
    """Code that runs on one thread and stream (consecutive stages, or a group) as one function of its inputs
    (:attr:`code`, returning what is read after it), compiled by Inductor per input signature at its first call."""

    code: GroupCode
    name: str
    compiled: dict[Signature, GroupCode | None] = field(default_factory=dict, repr=False)
    #: Its code traced ahead (:func:`tracing_ahead`) for signatures not compiled yet.
    traced: dict[Signature, torch.fx.GraphModule] = field(default_factory=dict, repr=False)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The region's outputs: by its compiled function where the signature has one, else by its code (compiling
        it after a first call with a new signature, or tracing it within :func:`tracing_ahead`)."""
        key = signature(inputs)
        if key not in self.compiled:
            outputs = self.code(*inputs)  # lazily made tensors (a unit's meta tensors) are made real, outside the trace
            traces = _traces
            if traces is not None:
                if key not in self.traced:
                    self._trace_ahead(key, inputs, traces)
                return outputs
            self.compiled[key] = self._compiled(inputs)
            if self.compiled[key] is None:
                return outputs
        fn = self.compiled[key]  # also at the first call: later regions see the outputs (strides) of every call
        return tuple(fn(*inputs)) if fn is not None else self.code(*inputs)

    def _trace_ahead(self, key: Signature, inputs: tuple[torch.Tensor, ...], traces: list[Trace]) -> None:
        """Trace the code for these inputs and add the trace to ``traces``; nothing where it cannot be traced (the
        region's compile says why)."""
        try:
            graph = self._traced(inputs)
        except Exception:  # noqa: BLE001  # the compile at the next first call traces again and warns
            return
        self.traced[key] = graph
        traces.append(Trace(self, key, graph, torch.get_num_threads()))

    def _traced(self, inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
        """The code traced with fake tensors for these inputs (a trace that would read a value fails)."""
        from torch.fx.experimental.proxy_tensor import make_fx

        with _ONE_COMPILE_AT_A_TIME, torch.no_grad():
            return make_fx(self.code, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)

    def _compiled(self, inputs: Sequence[torch.Tensor]) -> GroupCode | None:
        """The region's code traced (or its trace made ahead) and compiled for these inputs; None (with a warning)
        where it cannot be."""
        traced = self.traced.pop(signature(inputs), None)
        try:
            traced = traced if traced is not None else self._traced(inputs)
            with _ONE_COMPILE_AT_A_TIME, torch.no_grad(), loaded_modules_forgotten():
                return compile_traced(traced, inputs)
        except Exception as error:  # noqa: BLE001  # any failure leaves the region as it is: slower, never wrong
            warnings.warn(f"ios-ray: {self.name} runs uncompiled ({type(error).__name__}: {first_line(error)})",
                          RuntimeWarning, stacklevel=3)
            return None


def compile_traced(traced: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> GroupCode:
    """A region's trace compiled by Inductor for inputs of these signatures, as Dynamo would hand it over, its weights
    frozen where Inductor can (:func:`freezes`): in this process, or in a compile worker's
    (:mod:`~ios_ray.runtime.ahead`), which so fills the FX graph cache with the entry this process then reads."""
    from torch._inductor import config  # Inductor loads in a second or more: only where a region compiles
    from torch._inductor.compile_fx import compile_fx

    # the thread count its C++ code is specialised to, named, so that the FX graph cache keys by it (torch 2.11 leaves
    # it out of the key where it is left at its default, -1, though the code is specialised to it)
    with config.patch({"freezing": freezes(signature(inputs)), "cpp.threads": torch.get_num_threads()}), \
            _packed_weights_keyed_as_frozen(), _memory_formats_keyed_by_name(), _as_dynamo_would(inputs) as example:
        return compile_fx(traced, example)  # type: ignore[return-value]


@contextlib.contextmanager
def _as_dynamo_would(inputs: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """The inputs a region compiles for, as Dynamo hands them to Inductor: fake tensors of static shape, in a tracing
    context whose fake mode has a shape environment. Inductor consults its on-disk cache of compiled graphs only in
    such a context; inputs not already fake in its mode would be made fake with every size a symbol (and the code
    compiled for any shape)."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True, allow_non_fake_inputs=True)
    with tracing(TracingContext(mode)):
        yield [mode.from_tensor(t, static_shapes=True) for t in inputs]


@contextlib.contextmanager
def _packed_weights_keyed_as_frozen() -> Iterator[None]:
    """Inductor's FX graph cache made to key a frozen weight held as a oneDNN tensor by its shape and dtype, as it keys
    every other frozen weight (whose values a cache hit reads from the graph being compiled), instead of refusing to
    cache the graph. The packing is the compile's own, done before the cache is consulted, and decided by what the key
    holds (the weight's shape and dtype, the op's arguments, the input shapes). A weight small enough for Inductor to
    write into the code is still refused. Where torch names these hooks otherwise, nothing changes."""
    from torch._inductor import codecache
    from torch._inductor.freezing_utils import is_frozen_param
    from torch._inductor.graph import GraphLowering

    def read_from_the_graph(t: torch.Tensor) -> bool:
        return t.is_mkldnn and is_frozen_param(t) and not GraphLowering.can_inline_constant(t)

    pickler = getattr(codecache, "FxGraphCachePickler", None)
    validator = getattr(codecache, "CacheabilityValidator", None)  # in newer torch; in older, _reduce_tensor refuses
    with contextlib.ExitStack() as patches:
        if (reduce_tensor := getattr(pickler, "_reduce_tensor", None)) is not None:
            def keyed(self: object, t: torch.Tensor, reduce_tensor: Callable = reduce_tensor) -> object:
                if read_from_the_graph(t):
                    return (codecache._ident, (("oneDNN frozen weight", tuple(t.shape), t.dtype),))
                return reduce_tensor(self, t)
            patches.enter_context(mock.patch.object(pickler, "_reduce_tensor", keyed))
        if (check_tensor := getattr(validator, "check_tensor", None)) is not None:
            def checked(t: torch.Tensor, check_tensor: Callable = check_tensor) -> None:
                if not read_from_the_graph(t):
                    check_tensor(t)
            patches.enter_context(mock.patch.object(validator, "check_tensor", staticmethod(checked)))
        yield


@contextlib.contextmanager
def _memory_formats_keyed_by_name() -> Iterator[None]:
    """Inductor's FX graph cache made to key a memory format by its name in every process. Pickle names a memory
    format by the first module it finds holding it (as ``torch.<name>`` under a module holding ``torch``): in one
    process one module, in another, which started elsewhere (a compile worker, :mod:`~ios_ray.runtime.ahead`),
    another, and the same region's key then differs between them."""
    before = copyreg.dispatch_table.get(torch.memory_format)
    copyreg.dispatch_table[torch.memory_format] = _reduce_memory_format
    try:
        yield
    finally:
        if before is None:
            del copyreg.dispatch_table[torch.memory_format]
        else:
            copyreg.dispatch_table[torch.memory_format] = before


def _reduce_memory_format(memory_format: torch.memory_format) -> tuple[Callable, tuple[str]]:
    """A memory format pickled as its name (``torch.channels_last``: :func:`memory_format_named`)."""
    return memory_format_named, (str(memory_format),)


def memory_format_named(name: str) -> torch.memory_format:
    """The memory format of this name (as ``str`` gives it: ``torch.channels_last``)."""
    return getattr(torch, name.removeprefix("torch."))


@contextlib.contextmanager
def loaded_modules_forgotten() -> Iterator[None]:
    """Inductor's own references to the modules a compile loads dropped after it: each such module holds its region's
    frozen weights, and Inductor keeps every one for the life of the process (``PyCodeCache.modules``, and
    ``sys.modules``); the compiled function holds what it runs, so a region dropped frees its weights."""
    from torch._inductor.codecache import PyCodeCache

    before = len(PyCodeCache.modules)
    try:
        yield
    finally:
        loaded = PyCodeCache.modules[before:]
        del PyCodeCache.modules[before:]
        for module in loaded:
            if sys.modules.get(module.__name__) is module:
                del sys.modules[module.__name__]


def freezes(key: Signature) -> bool:
    """Whether a region compiles its weights for inputs of this signature as constants, packed and folded once: where
    Inductor can (oneDNN packs no float64 weights on a CPU)."""
    return not any(device.type == "cpu" and dtype == torch.float64 for _, _, dtype, device in key)


def regions(program: Program, stages: Sequence[CompiledStage], releases: Sequence[tuple[str, ...]],
            read_at_end: Sequence[str]) -> tuple[list[StageStep], list[tuple[str, ...]]]:
    """A pass's steps over ``program`` with ``inductor`` kernels, and the values each one's end releases: each stage of
    several groups with its groups in regions (:func:`in_regions`), each run of the others one region
    (:func:`region_steps`), every region tracing the units as torch's own ops (the program's ``traced_fns``).

    The program's :attr:`~ios_ray.runtime.program.Program.regions` hold the regions of other passes over it, by what
    decides their code (a group's units and inputs; a run's stages and what it returns): a pass takes a region found
    there instead of making its own, so that it compiles once, and adds its own."""
    shared = program.regions
    stages = [in_regions(program, s, shared) if isinstance(s, ParallelStage) else s for s in stages]
    together = [not isinstance(s, ParallelStage) for s in stages]
    return region_steps([stage_step(s) for s in stages], together, releases, read_at_end,
                        [s.stage for s in stages], shared, [traced_step(program, s) for s in stages])


def region_steps(steps: Sequence[StageStep], together: Sequence[bool], releases: Sequence[tuple[str, ...]],
                 read_at_end: Sequence[str], keys: Sequence[Hashable] | None = None,
                 shared: MutableMapping[Hashable, Region] | None = None,
                 traced: Sequence[StageStep] | None = None) -> tuple[list[StageStep], list[tuple[str, ...]]]:
    """A pass's steps with each run of consecutive steps that may run ``together`` (one-group and merge stages) as
    one :class:`Region` where it holds :data:`LEAST_UNITS` or more, and the values each new step's end releases.

    A region returns what it computes that a later step or the graph's output (``read_at_end``) reads; what it
    computes and reads itself alone never leaves it. Its code calls the ``traced`` steps (default: the steps; the
    same units, inputs and values), and the steps outside regions run as they are. With ``keys`` (what decides each
    step's code) a run's region is taken from ``shared`` where it holds one of the same steps returning the same
    values, and added otherwise.
    """
    found: list[StageStep] = []
    released: list[tuple[str, ...]] = []
    start = 0
    while start < len(steps):
        if not together[start]:
            found.append(steps[start])
            released.append(releases[start])
            start += 1
            continue
        end = start + 1
        while end < len(steps) and together[end]:
            end += 1
        if sum(len(units) for units, _, _ in steps[start:end]) < LEAST_UNITS:
            found.extend(steps[start:end])
            released.extend(releases[start:end])
        else:
            outputs, inputs, region, inside = _region(traced or steps, start, end, read_at_end, len(found))
            if keys is not None:
                region = _shared(shared, ("run", tuple(keys[start:end]), outputs), region)
            found.append((outputs, inputs, region))
            released.append(tuple(s for r in releases[start:end] for s in r if s not in inside))
        start = end
    return found, released


def _region(steps: Sequence[StageStep], start: int, end: int, read_at_end: Sequence[str], index: int
            ) -> tuple[tuple[str, ...], tuple[str, ...], Region, set[str]]:
    """Steps ``start`` to ``end`` as one region: what it returns, what it reads, the region, and the values that never
    leave it."""
    made = {u for units, _, _ in steps[start:end] for u in units}
    later = {s for _, inputs, _ in steps[end:] for s in inputs} | set(read_at_end)
    outputs = tuple(u for units, _, _ in steps[start:end] for u in units if u in later)
    inputs = tuple(dict.fromkeys(s for _, ins, _ in steps[start:end] for s in ins if s not in made))
    code = steps_code(steps[start:end], inputs, outputs)
    return outputs, inputs, Region(code, f"region {index} (stages {start} to {end - 1})"), made - set(outputs)


def _shared(shared: MutableMapping[Hashable, Region] | None, key: Hashable, region: Region) -> Region:
    """The region ``shared`` holds under ``key``, else ``region``, then held there (where there is a ``shared``)."""
    if shared is None:
        return region
    found = shared.get(key)
    if found is None:
        found = shared[key] = region
    return found


def step_regions(steps: Sequence[StageStep]) -> list[Region]:
    """The regions a pass's steps call, in order: the steps that are regions and, of its stages of several groups,
    the groups that are (what the pass's first call compiles)."""
    found: list[Region] = []
    for _, _, code in steps:
        stage = getattr(code, "__self__", None)  # a stage of several groups steps in as its bound ``run``
        if isinstance(stage, ParallelStage):
            found += [group.code for group in stage.groups if isinstance(group.code, Region)]
        elif isinstance(code, Region):
            found.append(code)
    return found


def in_regions(program: Program, stage: ParallelStage, shared: MutableMapping[Hashable, Region] | None = None
               ) -> ParallelStage:
    """A stage of several groups of ``program`` whose groups of :data:`LEAST_UNITS` or more each run as a
    :class:`Region` tracing its units as torch's own ops, taken from ``shared`` where it holds one of the same units
    and inputs (and added there otherwise); a group of one unit runs as it is."""
    groups = tuple(group if len(group.units) < LEAST_UNITS else
                   dataclasses.replace(group, code=_shared(
                       shared, ("group", group.units, group.inputs),
                       Region(GroupRun.of(program, group.units, traced=True).code,
                              f"the group of {group.units[0]} to {group.units[-1]}")))
                   for group in stage.groups)
    return dataclasses.replace(stage, groups=groups)
