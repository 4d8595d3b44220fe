"""A graph bound to torch: one callable per unit, and sequential execution in topological order.

:class:`Program` is the executable form of an :class:`~ios_ray.frontend.Imported` graph on one device: each unit's
callable comes from :func:`~ios_ray.runtime.units.bind_unit` (convs with their batch-norms folded in, pools and
opaque units calling the original fx code...), and a unit input that is a sum or concat is evaluated here.
Stage execution (``ios_ray.runtime.stages``) and the profiler call the very same unit callables. Binding to the
CPU keeps freed memory in the process (:mod:`~ios_ray.runtime.allocator`), for measurement and deployment alike.
"""

from __future__ import annotations

from typing import Mapping

import torch

from ios_ray.dtypes import copied
from ios_ray.frontend import Imported
from ios_ray.ir import GRAPH_INPUT, Graph, Value
from ios_ray.runtime.allocator import keep_freed_memory
from ios_ray.runtime.units import UnitFn, bind_unit

Env = dict[str, torch.Tensor]


class Program:
    """A graph bound to torch callables on one device; :meth:`run` executes it unit by unit."""

    def __init__(self, graph: Graph, fns: Mapping[str, UnitFn], device: torch.device) -> None:
        self.graph = graph
        self.fns = dict(fns)
        self.device = device

    @staticmethod
    def from_imported(imported: Imported, device: torch.device | str = "cpu") -> "Program":
        """Bind an imported graph to its module's weights, copied onto ``device``."""
        device = torch.device(device)
        if device.type == "cpu":
            keep_freed_memory()
        module = copied(imported.module).to(device).eval()
        constants = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in imported.constants.items()}
        nodes = {n.name: n for n in module.graph.nodes}
        fns = {u.id: bind_unit(u, module, nodes, constants) for u in imported.graph.units}
        return Program(imported.graph, fns, device)

    def value(self, value: Value, env: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Evaluate a unit input: the channel concat of parts, each the sum of the named outputs."""
        parts = [_sum([env[s] for s in part]) for part in value.parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def run_unit(self, unit_id: str, env: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Run one unit on the outputs in ``env`` and return its output."""
        unit = self.graph.unit(unit_id)
        return self.fns[unit_id]([self.value(v, env) for v in unit.inputs])

    @torch.no_grad()
    def run(self, x: torch.Tensor) -> torch.Tensor:
        """Sequential execution: every unit in topological order."""
        env: Env = {GRAPH_INPUT: x}
        for unit in self.graph.units:
            env[unit.id] = self.run_unit(unit.id, env)
        return self.value(self.graph.output, env)


def _sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return total
