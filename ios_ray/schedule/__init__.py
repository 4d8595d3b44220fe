"""The schedule file: which stages run each block of a graph, for one device and batch size.

A schedule is versioned JSON. It carries the graph fingerprint it was made for and the graph's per-sample input
shape, the device label and fingerprint, batch size, dtype, memory format and the kernels its stages were measured
with (:mod:`~ios_ray.runtime.kernels`; ``eager`` for files before kernels), the search parameters, and per block
its stages (strategy and groups of unit ids) with their predicted latencies, and for a measured device the end-to-end
check that chose it (:class:`EndToEnd`), and, where the search computed it, its peak activation memory
(:class:`PeakMemory`).

Four modules, each importing only those before it: :mod:`~ios_ray.schedule.records` holds the parts of a schedule,
:mod:`~ios_ray.schedule.format` the file's fields, listed once, from which writing, checking and reading follow (and
the upgrade of older versions), :mod:`~ios_ray.schedule.graph_schedule` the :class:`Schedule` and its JSON form, and
:mod:`~ios_ray.schedule.files` the files on disk: :func:`read_schedule` checks
every field of a file (hand-edited ones too) before anything reads it and refuses a malformed one in one sentence
naming each defect; :func:`load_schedule` also checks a file against a graph and rejects a mismatch with one clear
sentence.
"""

from ios_ray.schedule.files import (check_schedule, folder_name, load_schedule, read_schedule, save_schedule,
                                    schedule_path)
from ios_ray.schedule.format import SCHEDULE_FORMAT, SCHEDULE_VERSION
from ios_ray.schedule.graph_schedule import Schedule, schedule_defects, schedule_from_json, schedule_to_json
from ios_ray.schedule.records import (CANDIDATES, MEMORY_FORMAT_TORCH_NAMES, BlockSchedule, CandidateRun, EndToEnd,
                                      ModelAsIs, PeakMemory, megabytes)

__all__ = ["CANDIDATES", "MEMORY_FORMAT_TORCH_NAMES", "SCHEDULE_FORMAT", "SCHEDULE_VERSION", "BlockSchedule",
           "CandidateRun", "EndToEnd", "ModelAsIs", "PeakMemory", "Schedule", "check_schedule", "folder_name",
           "load_schedule", "megabytes", "read_schedule", "save_schedule", "schedule_defects", "schedule_from_json",
           "schedule_path", "schedule_to_json"]
