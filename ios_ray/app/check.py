"""The search's end-to-end check: on a measured device the IOS schedule (the DP's) and the sequential one run whole,
in paired rounds of alternating order, on an actor of the device (:func:`~ios_ray.runtime.compare.paired_timing`),
and the search keeps the IOS schedule only where the interval of the ratio IOS / sequential lies wholly below 1
(:mod:`ios_ray.paired`); otherwise sequential (fewer threads and streams, the same speed). The interval is looked
at at three planned rounds, up to ``check_rounds``, and the check stops early once it decides or where the next look
would end past ``check_seconds``.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import TYPE_CHECKING

from ios_ray.errors import UserError
from ios_ray.paired import least_rounds, percent, valid_confidence
from ios_ray.profiler import CheckJob, DevicePool, ModelSource
from ios_ray.schedule import EndToEnd, Schedule

if TYPE_CHECKING:
    from ios_ray.app.options import SearchOptions
    from ios_ray.ir import Graph


def check_the_check(options: SearchOptions) -> None:
    """Fail on an end-to-end check that could never decide, or on a confidence or time cap out of range."""
    if not valid_confidence(options.check_confidence):
        raise UserError(f"check_confidence must be at least 0.5 and below 1 (e.g. 0.99), not "
                        f"{options.check_confidence}.")
    least = least_rounds(options.check_confidence)
    if 0 < options.check_rounds < least:
        raise UserError(f"check_rounds must be 0 (no check) or at least {least}: fewer rounds give no "
                        f"{percent(options.check_confidence)} interval that could decide, not "
                        f"{options.check_rounds}.")
    if options.check_seconds is not None and not options.check_seconds > 0:
        raise UserError(f"check_seconds must be above 0 (or None: no time cap), not {options.check_seconds}.")


def checked_end_to_end(
    pool: DevicePool, source: ModelSource, graph: Graph, options: SearchOptions, ios: Schedule, plain: Schedule
) -> Schedule:
    """Time the IOS schedule against the sequential one whole, in paired rounds, on the device; keep the IOS one
    only where it is faster beyond noise."""
    job = CheckJob(source, graph, (ios, plain), ios.batch, options.check_rounds, dtype=ios.dtype,
                   confidence=options.check_confidence, max_seconds=options.check_seconds)
    timing = pool.time_schedules(ios.device, job)
    return keep_faster(ios, plain, EndToEnd(timing.rounds, statistics.median(timing.first_ms),
                                            statistics.median(timing.second_ms), ios.predicted_latency,
                                            plain.predicted_latency, timing.ratio))


def keep_faster(ios: Schedule, sequential: Schedule, check: EndToEnd) -> Schedule:
    """The schedule the check keeps (:attr:`EndToEnd.kept`: the IOS one only where it is faster beyond noise),
    carrying the check."""
    return dataclasses.replace(sequential if check.kept == "sequential" else ios, end_to_end=check)
