"""Executing a whole schedule: stages in order, groups at once, merged convs, optionally as one CUDA graph.

:class:`ScheduleRunner` compiles every stage once (:func:`~ios_ray.runtime.stages.compile_stage`) with lanes
it owns (persistent worker threads on CPU, side streams on CUDA) and runs them in order. On CUDA consecutive
stages chain through stream events only (no synchronisation in between), and by default the whole forward is
captured into a CUDA graph per input shape (:class:`~ios_ray.runtime.cuda_graph.CapturedForward`).

Memory stays close to sequential execution: the last stage that reads each output is found once, at compile
time, and the output is dropped right after that stage (outputs the graph returns are kept to the end).

A runner is inference-only (it runs without gradients) and serialises its calls with a lock, so it may be
shared between threads; a call's input must live on the runner's device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from ios_ray.lifetimes import release_plan
from ios_ray.runtime.codegen import StageStep, pass_code
from ios_ray.runtime.cuda_graph import CapturedForward
from ios_ray.runtime.program import Program
from ios_ray.runtime.regions import Region, regions, step_regions
from ios_ray.runtime.stages import CompiledStage, compile_stage, make_lanes, resolve_device, stage_step
from ios_ray.schedule import Schedule, check_schedule
from ios_ray.vocabulary import INDUCTOR_KERNELS


class ScheduleRunner:
    """A schedule compiled for one program and device; calling it runs a forward pass on a batch."""

    def __init__(
        self, program: Program, schedule: Schedule, device: torch.device | str | None = None,
        cuda_graph: bool | None = None,
    ) -> None:
        self.device = resolve_device(device if device is not None else program.device)
        check_schedule(schedule, program.graph)
        use_graph = self.device.type == "cuda" if cuda_graph is None else cuda_graph
        if use_graph and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}; pass cuda_graph=False")
        self.program = program
        self.schedule = schedule
        self.lanes = make_lanes(self.device)
        self.stages: tuple[CompiledStage, ...] = tuple(
            compile_stage(program, stage, self.device, self.lanes) for stage in schedule.stages
        )
        self._pass = StagePass(program, self.stages, release_plan(program.graph, schedule.stages))
        # the graph replays the pass, which holds no reference back to the runner: a dropped runner (and its
        # graphs' memory pools) is freed at once, not at the next full garbage collection
        self.captured = CapturedForward(self._pass, self.device) if use_graph else None
        self._lock = threading.Lock()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Run the forward pass on ``x`` (a batch on the runner's device)."""
        if resolve_device(x.device) != self.device:
            raise ValueError(f"the input is on {x.device} but this runner runs on {self.device}; move it there first")
        with self._lock, torch.no_grad():
            return self.captured(x) if self.captured is not None else self.run_stages(x)

    def run_stages(self, x: torch.Tensor) -> torch.Tensor:
        """Run the stages in order, dropping each output after its last reader (without a CUDA graph)."""
        return self._pass(x)

    @property
    def regions(self) -> list[Region]:
        """The regions the pass calls, in order (none unless the program's kernels are ``inductor``)."""
        return step_regions(self._pass.steps)


@dataclass(frozen=True)
class StagePass:
    """One forward pass through compiled stages: each in order, each output dropped after its last reader; run as
    code written once (:func:`~ios_ray.runtime.codegen.pass_code`). With ``inductor`` kernels each run of stages
    that are not of several groups, and each group of the others, is one region compiled by Inductor
    (:mod:`~ios_ray.runtime.regions`): its :attr:`steps` say what the pass calls."""

    program: Program
    stages: tuple[CompiledStage, ...]
    releases: tuple[tuple[str, ...], ...]
    steps: tuple[StageStep, ...] = field(init=False, repr=False, compare=False)
    code: Callable[[torch.Tensor], torch.Tensor] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.program.kernels == INDUCTOR_KERNELS:
            steps, releases = regions(self.program, self.stages, self.releases, self.program.graph.output.sources)
        else:
            steps, releases = [stage_step(compiled) for compiled in self.stages], list(self.releases)
        code = pass_code(self.program.graph, self.program.enter, self.program.leave, steps, releases)
        object.__setattr__(self, "steps", tuple(steps))
        object.__setattr__(self, "code", code)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Run the stages on ``x`` and return the graph's output."""
        return self.code(x)
