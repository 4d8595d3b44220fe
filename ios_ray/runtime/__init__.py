"""Executing schedules: a graph bound to torch, compiled stages, whole-schedule runners, and ScheduledModule.

Imports torch and ios_ray core only (never ray, duckdb or pyarrow), so a deployed model needs neither.

* :class:`Program`: a graph bound to torch callables on one device, with one set of kernels
  (:mod:`~ios_ray.runtime.kernels`); sequential ``run``. :class:`Programs`: an import's programs, bound on first use.
* :func:`compile_stage`: one stage as the callable the runtime executes and the profiler times.
* :class:`ScheduleRunner`: a whole schedule, stage after stage (threads on CPU, streams and a CUDA graph on GPU).
* :class:`ScheduledModule`: an ``nn.Module`` that picks the schedule for each input's device and batch.
* :func:`measure_latency`: median, p10 and p90 of timed calls.
"""

from ios_ray.lifetimes import release_plan
from ios_ray.runtime.executor import ScheduleRunner
from ios_ray.runtime.merge import MergedConv, merge_convs
from ios_ray.runtime.program import Program, Programs
from ios_ray.runtime.units import FoldedConv
from ios_ray.runtime.schedule_set import device_rank, pick_batch, read_schedules, select_schedule
from ios_ray.runtime.scheduled_module import ScheduledModule
from ios_ray.runtime.stages import CompiledStage, compile_stage, make_lanes
from ios_ray.runtime.timing import measure_latency

__all__ = [
    "CompiledStage", "FoldedConv", "MergedConv", "Program", "Programs", "ScheduleRunner", "ScheduledModule",
    "compile_stage",
    "device_rank", "make_lanes", "measure_latency", "merge_convs", "pick_batch", "read_schedules",
    "release_plan", "select_schedule",
]
