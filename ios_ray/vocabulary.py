"""The words and defaults every layer shares, in one torch-free home.

The names a schedule file, the latency store, the scheduler, the API and the CLI all use (stage strategies, how a
search measures, dtypes, memory formats, kernels, where a latency comes from, the ``sim:`` prefix of device labels)
and the defaults of a search (the pruning bounds ``r`` and ``s``, the rounds, confidence and time cap of the
end-to-end check, the margin of a default memory budget) and the bytes per element of each dtype are written here
once. It imports nothing of torch, Ray or DuckDB, so the scheduler and the store read it as the API does.
"""

from __future__ import annotations

from typing import Iterable, Literal, Sequence

from ios_ray.errors import UserError

#: How a stage runs its groups: at once (``concurrent``), or as one wider conv (``merge``).
Strategy = Literal["concurrent", "merge"]
STRATEGIES: tuple[Strategy, ...] = ("concurrent", "merge")

#: The pruning bounds of the search: the most units per group (``r``) and groups per stage (``s``), as in the paper.
DEFAULT_R = 3
DEFAULT_S = 8

#: How a search measures: ``all`` planned stages, or ``lazy``: only those that can change the schedule.
MEASURE_MODES = ("all", "lazy")
DEFAULT_MEASURE = "lazy"
#: The end-to-end check, which times the IOS and the sequential schedule whole in paired rounds: at most this many
#: rounds (0: no check), and the confidence of its interval of IOS / sequential.
DEFAULT_CHECK_ROUNDS = 28
DEFAULT_CHECK_CONFIDENCE = 0.999
#: The end-to-end check goes on to its next look only where it would reach it within this many seconds.
DEFAULT_CHECK_SECONDS = 60.0
#: After the check, the schedule kept is timed against the model as is (its own forward, eager) in at most this many
#: paired rounds, at 95% (a report, not a decision: the search warns where the kept schedule is slower).
MODEL_AS_IS_ROUNDS = 10
#: A memory budget: whole bytes or ``<factor>x`` of the sequential schedule's peak; none given, a GPU label keeps
#: within its memory less the model's weights and this share of its memory (the CUDA context, cuDNN's workspaces
#: and the caching allocator's fragmentation live there too).
DEFAULT_MEMORY_MARGIN = 0.1
#: Actors a ``sim:`` device gets where no node offers its GPU.
DEFAULT_SIM_ACTORS = 2

#: The dtypes a schedule (and a stored measurement) can be made for, by their names in files.
DTYPE_NAMES = ("float32", "float16", "bfloat16")
DEFAULT_DTYPE = "float32"
#: Bytes per element of each dtype, for sizing activations without torch.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: The memory formats a schedule can be made for (NCHW, NHWC), by their names in files and graphs.
MEMORY_FORMAT_NAMES = ("contiguous", "channels_last")
DEFAULT_MEMORY_FORMAT = "contiguous"
#: The kernels a deployed model's units run with: ``eager`` (torch's own ops, as the model calls them, in the
#: graph's memory format), ``fused`` (activations channels-last, each conv one call that adds its bias and applies
#: its activation in the same kernel) or ``inductor`` (the units as with ``fused``, each run of stages that are not of
#: several groups, and each group of the others, compiled by Inductor into one region);
#: a schedule records its own, files before kernels were ``eager``.
EAGER_KERNELS, FUSED_KERNELS, INDUCTOR_KERNELS = "eager", "fused", "inductor"
KERNEL_NAMES = (EAGER_KERNELS, FUSED_KERNELS, INDUCTOR_KERNELS)
#: The version of a kernels' implementation (:mod:`~ios_ray.runtime.kernels`), where it is not the first: part of the
#: identity of a device running stages with them, so rows measured with an earlier one are not reused. ``fused`` 2:
#: oneDNN's weights packed per input shape (before: for batch 1, several times slower at some other batch sizes); 3:
#: opaque units of torch's own ops take channels-last inputs as they come (before: converted to the graph's format);
#: 4: not those whose output has five dimensions or more (before: as they came, and summed slowly); 5: a 4-D input
#: that is a permuted view (another opaque unit's output: MobileViT's patches) copied into the graph's format once
#: (before: as it came, read slowly by each op of the unit). ``inductor`` 2: activations held channels-last (before:
#: in the graph's format); 3: a unit outside a region, and every unit of a stage as the profiler times it, runs as
#: ``fused`` runs it (before: as ``eager``, a conv's bias and activation separate calls).
KERNEL_VERSIONS = {FUSED_KERNELS: 5, INDUCTOR_KERNELS: 3}
#: What a search runs each setting's stages with: the kernels named, or ``auto``: on a measured device the
#: sequential schedule timed whole with each in turns, in :data:`KERNEL_NAMES` order, each against the one kept so
#: far, a challenger kept only where faster beyond noise; on ``sim:`` ``eager`` (the sim model prices no kernels).
KERNEL_CHOICES = ("auto", *KERNEL_NAMES)
DEFAULT_KERNEL_CHOICE = "auto"

#: Where a latency comes from: a device, or the sim model.
SOURCES = ("measured", "simulated")
#: What every label of a simulated device starts with (``sim:v100``).
SIM_PREFIX = "sim:"

#: The largest batch size a schedule (and a stored measurement) can be made for: the store keeps it in 32 bits.
MAX_BATCH_SIZE = 2**31 - 1


def is_simulated(device: str) -> bool:
    """Whether a (canonical) device label names a simulated device: ``sim:<gpu>``."""
    return device.startswith(SIM_PREFIX)


def checked_batches(batches: Iterable[object]) -> tuple[int, ...]:
    """The batch sizes, in order and without repeats; UserError unless there is at least one and each is an integer
    from 1 to :data:`MAX_BATCH_SIZE`."""
    found = tuple(batches)
    if not found or any(type(b) is not int or not 0 < b <= MAX_BATCH_SIZE for b in found):
        raise UserError(f"batch sizes must be integers from 1 to {MAX_BATCH_SIZE:,}, not {list(found)}.")
    return tuple(dict.fromkeys(found))  # type: ignore[arg-type]


def numerics_named(dtype: str, memory_format: str) -> tuple[str, ...]:
    """A schedule's numerics (its dtype and memory format; a *setting* is a device and a batch size), in that order, where they are not the defaults (float32, contiguous): what
    file names and titles add, e.g. ``("float16", "channels_last")``."""
    defaults = (DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT)
    return tuple(name for name, default in zip((dtype, memory_format), defaults) if name != default)


def kernel_named(name: str, kernels: str) -> str:
    """A schedule's name with the kernels it runs with where they are not eager: ``IOS fused``, ``sequential``."""
    return name if kernels == EAGER_KERNELS else f"{name} {kernels}"


def spelt_shape(shape: Sequence[int]) -> str:
    """A per-sample input shape as the command line spells it (``--input-shape``): ``3x224x224``."""
    return "x".join(map(str, shape))
