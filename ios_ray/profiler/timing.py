"""The profiler's timing of a stage: the runtime's timing protocol with the device's default counts.

Samples come from :func:`ios_ray.runtime.timing.samples_ms` (CUDA events on a GPU; a monotonic clock on a CPU,
each call primed by :func:`ios_ray.runtime.timing.cpu_primer`).
The protocol used (warmup and repeat counts) is recorded with every row.
"""

from __future__ import annotations

from typing import Callable

import torch

from ios_ray.profiler.protocol import Timing, resolve_protocol
from ios_ray.runtime.timing import samples_ms


def time_callable(
    fn: Callable[[], object], device: torch.device | str, warmup: int | None = None, repeat: int | None = None,
    before: Callable[[], object] | None = None,
) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` times timed one by one (None: the device's default);
    ``before`` runs untimed before every call."""
    device = torch.device(device)
    warmup, repeat = resolve_protocol(device.type == "cuda", warmup, repeat)
    return Timing.of_samples(samples_ms(fn, device, warmup, repeat, before), warmup)
