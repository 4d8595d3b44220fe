"""Straight-line Python for running units, written once per group and per pass (as ``fx.GraphModule`` writes a
graph's code), so that a unit costs one call of its callable and no lookups.

* :func:`group_code`: a function of a group's inputs that runs its units in order, one line each, and returns their
  outputs: ``v2 = f0([v0]); v3 = f1([v2 + v1])``.
* :func:`pass_code`: a whole forward pass through compiled stages: the input entered, each stage's code called on
  its inputs (a one-group stage's is its group's code), each value dropped right after its last reader
  (:func:`~ios_ray.lifetimes.release_plan`), the output left.
* :func:`steps_code`: consecutive stages as one function of their inputs returning the outputs named (the code of a
  :class:`~ios_ray.runtime.regions.Region`).

A unit input that sums or concatenates outputs is computed in the line that reads it, as
:meth:`~ios_ray.runtime.program.Program.value` computes it: each part summed left to right, the parts concatenated in
dimension 1.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from ios_ray.ir import GRAPH_INPUT, Graph, Value

#: A group's or a stage's code: its inputs (positional, in its order) to its units' outputs (in its order).
GroupCode = Callable[..., tuple[torch.Tensor, ...]]
#: A stage as a pass runs it: its units (the order of its outputs), its inputs, its code.
StageStep = tuple[Sequence[str], Sequence[str], GroupCode]


class _Source:
    """The Python text of one function: its variables (one per value), the objects it calls, its lines."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.scope: dict[str, Any] = {"cat": torch.cat}
        self.lines: list[str] = []

    def variable(self, source: str) -> str:
        """The variable holding a unit's output (or the graph input), named at its first use."""
        return self.names.setdefault(source, f"v{len(self.names)}")

    def callee(self, fn: Any, prefix: str = "f") -> str:
        """The name the code calls ``fn`` by."""
        name = f"{prefix}{len(self.scope)}"
        self.scope[name] = fn
        return name

    def value(self, value: Value) -> str:
        """The expression of a unit input."""
        parts = [" + ".join(self.variable(s) for s in part) for part in value.parts]
        return parts[0] if len(parts) == 1 else f"cat([{', '.join(parts)}], 1)"

    def stage_call(self, step: StageStep) -> None:
        """The line that calls a stage's (or a region's) code on its inputs and names its units' outputs."""
        units, inputs, code = step
        outputs = "".join(self.variable(u) + ", " for u in units)
        self.lines.append(f"{outputs}= {self.callee(code, 'stage')}({', '.join(map(self.variable, inputs))})")

    def function(self, name: str, args: Sequence[str]) -> Callable[..., Any]:
        """The lines as the body of a function ``name(*args)``, compiled."""
        text = "\n".join([f"def {name}({', '.join(args)}):", *(f"    {line}" for line in self.lines)])
        namespace = dict(self.scope)
        exec(compile(text, f"<ios-ray {name}>", "exec"), namespace)  # noqa: S102  # our own text, built above
        function = namespace.pop(name)  # its globals do not hold it: no cycle keeps a dropped pass (and its weights)
        function.source = text  # for a reader, as fx.GraphModule keeps its code
        return function


def group_code(graph: Graph, fns: Mapping[str, Callable[[list[torch.Tensor]], torch.Tensor]], units: Sequence[str],
               inputs: Sequence[str]) -> GroupCode:
    """The code of ``units`` run in order (each its callable in ``fns``) on the outputs named ``inputs``, returning
    the units' outputs in order."""
    source = _Source()
    args = [source.variable(s) for s in inputs]
    for unit_id in units:
        unit = graph.unit(unit_id)
        reads = ", ".join(source.value(v) for v in unit.inputs)
        source.lines.append(f"{source.variable(unit_id)} = {source.callee(fns[unit_id])}([{reads}])")
    source.lines.append(f"return ({''.join(source.variable(u) + ', ' for u in units)})")
    return source.function("group", args)


def steps_code(steps: Sequence[StageStep], inputs: Sequence[str], outputs: Sequence[str]) -> GroupCode:
    """The code of ``steps`` run in order on the outputs named ``inputs``, returning those named ``outputs``."""
    source = _Source()
    args = [source.variable(s) for s in inputs]
    for step in steps:
        source.stage_call(step)
    source.lines.append(f"return ({''.join(source.variable(u) + ', ' for u in outputs)})")
    return source.function("steps", args)


def pass_code(graph: Graph, enter: Callable[[torch.Tensor], torch.Tensor],
              leave: Callable[[torch.Tensor], torch.Tensor], stages: Sequence[StageStep],
              releases: Sequence[tuple[str, ...]]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A forward pass: ``enter`` the input, run each stage's code on its inputs in order, dropping after each the
    values ``releases`` names, and ``leave`` the graph's output."""
    source = _Source()
    source.lines.append(f"{source.variable(GRAPH_INPUT)} = {source.callee(enter, 'enter')}(x)")
    for step, released in zip(stages, releases):
        source.stage_call(step)
        source.lines.extend(f"{source.variable(s)} = None" for s in released)
    source.lines.append(f"return {source.callee(leave, 'leave')}({source.value(graph.output)})")
    return source.function("forward", ["x"])
