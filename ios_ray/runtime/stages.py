"""Compiling one stage into the callable that the runtime executes and the profiler times.

``compile_stage(program, stage, device)`` returns a :class:`CompiledStage`: called on an env (source id, i.e.
unit id or ``"@input"``, to tensor) it returns the outputs of the stage's units. Variants:

* a ``concurrent`` stage of one group runs inline, on the caller's thread and CUDA stream;
* a ``concurrent`` stage of several groups runs each group at once: on CUDA on its own side stream
  (:mod:`~ios_ray.runtime.streams`), on CPU on a persistent worker thread (:mod:`~ios_ray.runtime.workers`);
* a ``merge`` stage runs its convs as one merged conv (:mod:`~ios_ray.runtime.merge`), inline.

Units inside a group run one after another, each its program callable (a group's code, written once:
:func:`~ios_ray.runtime.codegen.group_code`), so outputs equal sequential execution.
Where the threads or streams come from is a *lanes* object (a :class:`WorkerPool` or a :class:`StreamPool`)
that the caller owns and shares between the stages it compiles; without one, a stage gets lanes of its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Protocol

import torch

from ios_ray.errors import InternalError
from ios_ray.ir import Value
from ios_ray.runtime.codegen import GroupCode, StageStep, group_code
from ios_ray.runtime.kernels import unfused
from ios_ray.runtime.merge import MergedConv, merge_convs
from ios_ray.runtime.program import Env, Program
from ios_ray.runtime.streams import StreamPool
from ios_ray.runtime.workers import WorkerPool
from ios_ray.stage import Stage

Lanes = WorkerPool | StreamPool


class CompiledStage(Protocol):
    """A stage ready to run: :meth:`run` on its inputs returns its units' outputs; calling it on an env, the same
    by name."""

    @property
    def stage(self) -> Stage:
        """The stage this was compiled from."""

    @property
    def inputs(self) -> tuple[str, ...]:
        """The sources (unit ids or ``"@input"``) the stage reads from outside itself."""

    def run(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run the stage on the values of :attr:`inputs` (in order); the outputs of ``stage.units`` (in order)."""

    def __call__(self, env: Mapping[str, torch.Tensor]) -> Env:
        """Run the stage on the outputs in ``env`` (every id in :attr:`inputs` must be there)."""


class _Launcher(Protocol):
    def run(self, groups: tuple["GroupRun", ...], env: Mapping[str, torch.Tensor]) -> Env: ...


def _by_name(units: tuple[str, ...], inputs: tuple[str, ...], code: GroupCode, env: Mapping[str, torch.Tensor]
             ) -> Env:
    """``code`` (a group's or a stage's: ``inputs`` in, ``units``' outputs out) run on the outputs in ``env``; its
    units' outputs by id."""
    return dict(zip(units, code(*[env[source] for source in inputs])))


@dataclass(frozen=True)
class GroupRun:
    """The units of one group, run one after another (its :attr:`code`, one line per unit: :mod:`.codegen`);
    ``inputs`` are the sources it reads from outside itself."""

    units: tuple[str, ...]
    inputs: tuple[str, ...]
    code: GroupCode

    def __call__(self, env: Mapping[str, torch.Tensor]) -> Env:
        """Run the group's units in order and return all their outputs."""
        return _by_name(self.units, self.inputs, self.code, env)

    @staticmethod
    def of(program: Program, units: tuple[str, ...], traced: bool = False) -> "GroupRun":
        """The group of these units (in execution order), each its program callable, or where ``traced`` its
        callable as a region traces it (:attr:`~ios_ray.runtime.program.Program.traced_fns`)."""
        inside = set(units)
        sources = (s for u in units for s in program.graph.unit(u).sources if s not in inside)
        inputs = tuple(dict.fromkeys(sources))
        fns = program.traced_fns if traced else program.fns
        return GroupRun(units, inputs, group_code(program.graph, fns, units, inputs))


@dataclass(frozen=True)
class InlineStage:
    """A one-group concurrent stage: runs on the caller's thread and stream."""

    stage: Stage
    group: GroupRun

    @property
    def inputs(self) -> tuple[str, ...]:
        """The sources the stage reads."""
        return self.group.inputs

    def run(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run the stage's only group."""
        return self.group.code(*values)

    def __call__(self, env: Mapping[str, torch.Tensor]) -> Env:
        """Run the stage on the outputs in ``env``."""
        return _by_name(self.stage.units, self.inputs, self.run, env)


@dataclass(frozen=True)
class ParallelStage:
    """A concurrent stage of several groups, each on its own worker thread (CPU) or side stream (CUDA)."""

    stage: Stage
    groups: tuple[GroupRun, ...]
    launcher: _Launcher

    @property
    def inputs(self) -> tuple[str, ...]:
        """The sources the stage reads."""
        return tuple(dict.fromkeys(s for g in self.groups for s in g.inputs))

    def run(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run every group at once and return all their outputs."""
        outputs = self.launcher.run(self.groups, dict(zip(self.inputs, values)))
        return tuple(outputs[unit_id] for unit_id in self.stage.units)

    def __call__(self, env: Mapping[str, torch.Tensor]) -> Env:
        """Run the stage on the outputs in ``env``."""
        return _by_name(self.stage.units, self.inputs, self.run, env)


@dataclass(frozen=True)
class MergeStage:
    """A merge stage: its convs run as one merged conv on their shared input."""

    stage: Stage
    program: Program
    input: Value
    merged: MergedConv

    @property
    def inputs(self) -> tuple[str, ...]:
        """The sources the stage reads."""
        return self.input.sources

    def run(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run the merged conv on the shared input; one output slice per unit."""
        outputs = self.merged(self.program.value(self.input, dict(zip(self.inputs, values))))
        return tuple(outputs[unit_id] for unit_id in self.stage.units)

    def __call__(self, env: Mapping[str, torch.Tensor]) -> Env:
        """Run the stage on the outputs in ``env``."""
        return _by_name(self.stage.units, self.inputs, self.run, env)


def stage_step(compiled: CompiledStage) -> StageStep:
    """A compiled stage as a pass calls it: its units (its outputs' order), its inputs, its :meth:`run`."""
    return compiled.stage.units, compiled.inputs, compiled.run


def traced_step(program: Program, compiled: CompiledStage) -> StageStep:
    """A stage of ``program`` as a region traces it: its step with each unit (a merge stage's merged conv) as torch's
    own ops on the same weights (:func:`~ios_ray.runtime.kernels.unfused`); a stage of several groups as it is."""
    if isinstance(compiled, MergeStage):
        merged = MergedConv(unfused(compiled.merged.conv), compiled.merged.splits)
        return stage_step(dataclasses.replace(compiled, merged=merged))
    if isinstance(compiled, InlineStage):
        group = GroupRun.of(program, compiled.group.units, traced=True)
        return stage_step(dataclasses.replace(compiled, group=group))
    return stage_step(compiled)


def resolve_device(device: torch.device | str) -> torch.device:
    """The device with its index filled in for CUDA (``cuda`` is the current GPU), so devices compare reliably."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def make_lanes(device: torch.device) -> Lanes:
    """Fresh lanes for a device: side streams on CUDA, worker threads elsewhere."""
    return StreamPool(device) if device.type == "cuda" else WorkerPool()


def compile_stage(program: Program, stage: Stage, device: torch.device, lanes: Lanes | None = None) -> CompiledStage:
    """Compile a stage of ``program`` (bound to ``device``) into its callable; ``lanes`` are shared if given."""
    device = resolve_device(device)
    if device != resolve_device(program.device):
        raise ValueError(f"the program is bound to {program.device}, not {device}; build it for {device}")
    if stage.strategy == "merge":
        if any(len(g) != 1 for g in stage.groups):
            raise InternalError(f"merge stage {[list(g) for g in stage.groups]} must have one conv per group "
                                "(check_schedule refuses such a schedule file).")
        units = stage.units
        return MergeStage(stage, program, program.graph.unit(units[0]).inputs[0], merge_convs(program, units))
    groups = tuple(GroupRun.of(program, tuple(g)) for g in stage.groups)
    if len(groups) == 1:
        return InlineStage(stage, groups[0])
    lanes = lanes if lanes is not None else make_lanes(device)
    launcher = lanes.fork(len(groups)) if isinstance(lanes, StreamPool) else lanes.team(len(groups))
    return ParallelStage(stage, groups, launcher)
