"""A graph bound to torch: one callable per unit, and sequential execution in topological order.

:class:`Program` is the executable form of an :class:`~ios_ray.frontend.Imported` graph on one device with one set
of kernels: each unit's callable comes from :func:`~ios_ray.runtime.units.bind_unit` (convs with their batch-norms
folded in, run as the kernels run them; pools and opaque units calling the original fx code...), and a unit input
that is a sum or concat is evaluated here. A pass enters the program with :meth:`Program.enter` (its input laid out
as the kernels hold activations) and leaves it with :meth:`Program.leave` (its output in the graph's format).
Stage execution (``ios_ray.runtime.stages``) and the profiler call the very same unit callables. Binding to the
CPU keeps freed memory in the process (:mod:`~ios_ray.runtime.allocator`), for measurement and deployment alike.
"""

from __future__ import annotations

import weakref
from typing import Any, Hashable, Mapping

import torch

from ios_ray.dtypes import copied, in_memory_format
from ios_ray.frontend import Imported
from ios_ray.ir import GRAPH_INPUT, Graph, Shape, Unit, Value
from ios_ray.runtime.allocator import keep_freed_memory
from ios_ray.runtime.kernels import activation_layout, conv_binder, in_layout, linear_binder, unfused
from ios_ray.runtime.units import FoldedConv, UnitFn, bind_unit
from ios_ray.vocabulary import EAGER_KERNELS, INDUCTOR_KERNELS

Env = dict[str, torch.Tensor]


class Program:
    """A graph bound to torch callables on one device, run with one set of kernels (:mod:`~ios_ray.runtime.kernels`);
    :meth:`run` executes it unit by unit."""

    def __init__(self, graph: Graph, fns: Mapping[str, UnitFn], device: torch.device,
                 kernels: str = EAGER_KERNELS) -> None:
        self.graph = graph
        self.fns = dict(fns)
        #: Each unit's callable as a region traces it (:func:`~ios_ray.runtime.kernels.unfused`: torch's own ops on
        #: the same weights, for Inductor to fuse; with other kernels than ``inductor`` nothing is traced).
        self.traced_fns = {unit_id: unfused(fn) for unit_id, fn in self.fns.items()} \
            if kernels == INDUCTOR_KERNELS else self.fns
        self.device = device
        self.kernels = kernels
        #: The memory format of the program's 4-D activations (the graph's for eager kernels, else channels-last).
        self.layout = activation_layout(kernels, graph.memory_format)
        #: With ``inductor`` kernels, the regions of every pass over the program, by what decides their code
        #: (:func:`~ios_ray.runtime.regions.regions`): a region two passes share (candidates of a search's check,
        #: schedules of two batch sizes) is compiled once; it is dropped with the last pass that runs it.
        self.regions: weakref.WeakValueDictionary[Hashable, Any] = weakref.WeakValueDictionary()

    @staticmethod
    def from_imported(imported: Imported, device: torch.device | str = "cpu", kernels: str = EAGER_KERNELS
                      ) -> "Program":
        """Bind an imported graph to its module's weights, copied onto ``device``, for ``kernels``."""
        device = torch.device(device)
        if device.type == "cpu":
            keep_freed_memory()
        module = copied(imported.module).to(device).eval()
        constants = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in imported.constants.items()}
        nodes = {n.name: n for n in module.graph.nodes}
        graph, conv, linear = imported.graph, conv_binder(kernels, device), linear_binder(kernels, device)
        layout = activation_layout(kernels, graph.memory_format)
        fns = {u.id: in_layout(u, bind_unit(u, module, nodes, constants, _input_shape(graph, u), conv, linear),
                               layout, graph.memory_format) for u in graph.units}
        return Program(graph, fns, device, kernels)

    def bind_conv(self, conv: FoldedConv, input_shape: Shape) -> UnitFn:
        """A folded conv (a merged one, say) as the program's kernels run it outside a region, given its per-sample
        input shape."""
        return conv_binder(self.kernels, self.device)(conv, input_shape)

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """The graph's input as the program's units take it (channels-last but for eager kernels)."""
        return x if self.layout == self.graph.memory_format else in_memory_format(x, self.layout)

    def leave(self, y: torch.Tensor) -> torch.Tensor:
        """The graph's output in the graph's memory format, as the model returns it."""
        return y if self.layout == self.graph.memory_format else in_memory_format(y, self.graph.memory_format)

    def value(self, value: Value, env: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Evaluate a unit input: the channel concat of parts, each the sum of the named outputs."""
        if len(value.parts) == 1 and len(value.parts[0]) == 1:  # a unit's output as it is: most inputs
            return env[value.parts[0][0]]
        parts = [_sum([env[s] for s in part]) for part in value.parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def run_unit(self, unit_id: str, env: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Run one unit on the outputs in ``env`` and return its output."""
        unit = self.graph.unit(unit_id)
        return self.fns[unit_id]([self.value(v, env) for v in unit.inputs])

    @torch.no_grad()
    def run(self, x: torch.Tensor) -> torch.Tensor:
        """Sequential execution: every unit in topological order."""
        env: Env = {GRAPH_INPUT: self.enter(x)}
        for unit in self.graph.units:
            env[unit.id] = self.run_unit(unit.id, env)
        return self.leave(self.value(self.graph.output, env))


class Programs:
    """The programs of one import, each bound on first use per (device, kernels) and kept."""

    def __init__(self, imported: Imported) -> None:
        self.imported = imported
        self._bound: dict[tuple[torch.device, str], Program] = {}

    def __call__(self, device: torch.device | str, kernels: str = EAGER_KERNELS) -> Program:
        """The import's program on ``device`` for ``kernels``."""
        key = (torch.device(device), kernels)
        program = self._bound.get(key)
        if program is None:
            program = self._bound[key] = Program.from_imported(self.imported, key[0], kernels)
        return program

    def keep(self, program: Program) -> None:
        """Keep a program of this import bound elsewhere, to be handed out for its device and kernels."""
        self._bound[program.device, program.kernels] = program


def _sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return total


def _input_shape(graph: Graph, unit: Unit) -> Shape:
    """The per-sample shape of a unit's first input (a conv's), or () for a unit without inputs."""
    return graph.value_shape(unit.inputs[0]) if unit.inputs else ()
