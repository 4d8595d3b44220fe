"""A lower bound and a best guess of every candidate stage's latency from the stages measured on one setting.

Everything here is fitted on the measured latencies of one (device fingerprint, batch), never on a device model,
so it works the same on a GPU, a CPU and a ``sim:`` device. Stages relate as in
:mod:`~ios_ray.scheduler.relations`: groups, units, sub-stages and pairs.

**Lower bounds.** A measured stage is its measurement. Otherwise:

* A *concurrent* stage is at least as slow as its slowest group run alone (the other groups only take device
  time and issue slots from it), and a group at least as slow as its slowest unit alone (it runs that unit and
  more, in order). A stage of three or more groups is, likewise, at least as slow as its largest sub-stage (one
  group dropped), recursively down to the measured stages. These *structural* bounds hold on the ``sim:`` model
  exactly; on a real device they hold up to measurement noise, which ``margin`` covers.
* A concurrent stage of three or more groups also has a *composed* bound: for each of its groups, the stage
  without it plus the least that adding it to one of the other groups alone cost (from the pairs), and the
  largest of these; recursively, from measured pairs up. It is exact where a stage costs its slowest group plus
  a fixed share of each other group (the synthetic cost of the tests), and close where groups contend for the
  device. Nothing guarantees it on any device (adding a group to a larger stage can cost less than adding it
  to one group, when it hides behind a long one), so it is *calibrated*: every measured stage of three or more
  groups is checked against its own composed value, and a stage of ``k`` groups takes its composed value times
  the smallest ratio measured / composed seen so far among stages of ``k`` or more groups, less ``margin``. That
  ratio is a fact of the device, not a safety factor: it can exceed 1 where groups contend (each added group then
  costs more than it did beside one other, so the composed value falls further short the more groups a stage
  has) and it nears 1 from below where a group can hide behind a long one (rarer, the more groups share a stage).
  Until ``MIN_EVIDENCE`` such stages are measured, the composed bound is not used; where fewer are measured at
  ``k`` or more groups, the ratio over all sizes (at most 1) stands in.
* A *merge* stage has no lower bound (0): one wide conv can use the device better than each of its narrow convs
  alone, so it can be faster than any of them. Merge candidates are few (29 in Inception V3), so they are simply
  measured whenever they could matter.

**Guesses** (to choose what to measure first): the composed value with pairs guessed from the measured pairs'
typical overlap, scaled by the median measured / composed ratio; a merge stage as the sum of its convs alone times
the median ratio of the measured merges. A guess is never below the stage's lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ios_ray.scheduler.relations import StageRelations

#: Measured stages of three or more groups needed before the composed bound is trusted.
MIN_EVIDENCE = 8


@dataclass(frozen=True)
class Estimates:
    """Per stage number: a lower bound and a best guess of its latency in ms (a measured stage's latency for both);
    ``calibration``: the least factor any composed bound was scaled by (0 until enough stages are measured);
    ``structural``: of a stage of two or more groups, measured or not, the bound it would have unmeasured without
    the composed bound (the audit before a certificate is drawn by it)."""

    lower: np.ndarray
    guess: np.ndarray
    calibration: float
    structural: np.ndarray


def estimate(relations: StageRelations, latency: np.ndarray, margin: float = 0.0,
             evidence: int = MIN_EVIDENCE) -> Estimates:
    """Bounds and guesses for every stage; ``latency`` holds the measured stages' latencies and NaN elsewhere.

    ``margin`` lowers every bound that is not a measurement by that fraction (measurement noise on a device);
    the composed bound is used once ``evidence`` stages of three or more groups are measured.
    """
    known = ~np.isnan(latency)
    alone = np.where(known, latency, 0.0)
    unit_flat, unit_starts = relations.units
    unit_max = np.maximum.reduceat(alone[unit_flat], unit_starts)
    unit_sum = np.add.reduceat(alone[unit_flat], unit_starts)
    one_group = np.where(known, latency, unit_max)
    group_flat, group_starts = relations.groups
    slowest = np.maximum.reduceat(one_group[group_flat], group_starts)
    fastest = np.minimum.reduceat(one_group[group_flat], group_starts)
    overlap = _median_ratio(latency - slowest, fastest, relations.pairs, known, default=0.5)
    pair_guess = slowest + overlap * fastest
    at_least = np.where(known, latency, slowest)
    lower_composed, composed = _compose(relations, at_least, known)
    largest_sub, sub = _compose(relations, at_least, known, joins=False)
    guess_composed, _ = _compose(relations, np.where(known, latency, pair_guess), known)
    calibration = _calibrations(relations, latency, composed, known, evidence)
    lower = (1.0 - margin) * np.maximum(largest_sub, calibration * lower_composed)
    lower[relations.merge] = 0.0
    larger = np.concatenate([run.stages for run in relations.runs] or [np.zeros(0, np.int64)])
    scale = _median_ratio(latency, composed, larger, known, default=1.0)
    count = relations.group_count
    guess = np.where(count == 1, unit_sum, np.where(count == 2, pair_guess, scale * guess_composed))
    merges = np.flatnonzero(relations.merge)
    guess[merges] = _median_ratio(latency, unit_sum, merges, known, default=1.0) * unit_sum[merges]
    guess = np.maximum(guess, lower)
    structural = (1.0 - margin) * np.where(np.isnan(sub), slowest, sub)
    structural[relations.merge] = 0.0
    return Estimates(np.where(known, latency, lower), np.where(known, latency, guess),
                     float(np.min(calibration[larger], initial=1.0)), structural)


def _calibrations(relations: StageRelations, latency: np.ndarray, composed: np.ndarray, known: np.ndarray,
                  evidence: int) -> np.ndarray:
    """Per stage, the factor its composed bound is multiplied by (0 where not enough is measured).

    For a stage of ``k`` groups: the least measured / composed ratio over the measured stages of ``k`` or more
    groups (see the module docstring); where fewer than ``evidence`` of those are measured, the least over all
    measured stages of three or more groups, at most 1, or 0 below that.
    """
    factor = np.zeros(len(latency))
    measured = [run.stages[known[run.stages]] for run in relations.runs]
    ratios = [latency[stages] / composed[stages] for stages in measured]
    overall = np.concatenate(ratios) if ratios else np.zeros(0)
    fallback = min(1.0, float(np.min(overall))) if len(overall) >= evidence else 0.0
    for position, run in enumerate(relations.runs):
        larger = np.concatenate(ratios[position:])
        factor[run.stages] = float(np.min(larger)) if len(larger) >= evidence else fallback
    return factor


def _compose(relations: StageRelations, value: np.ndarray, known: np.ndarray,
             joins: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Composed values of stages of three or more groups, from ``value`` of the smaller ones, size by size.

    Returns ``value`` with the composed value in place of every unmeasured stage of three or more groups, and the
    composed value of each such stage, measured or not (NaN for the others), for calibration. A composed value is
    the largest, over the stage's groups, of the stage without that group plus the least that adding that group
    to one other group alone cost (at least 0); with ``joins`` False, just the largest sub-stage.
    """
    filled = value.copy()
    composed = np.full(len(value), np.nan)
    for run in relations.runs:
        without = filled[run.subs]
        if joins:
            added = (filled[run.pairs] - filled[run.others]).reshape(len(run.stages), run.size, run.size - 1)
            without = without + np.maximum(np.min(added, axis=2), 0.0)
        composed[run.stages] = np.max(without, axis=1)
        filled[run.stages] = np.where(known[run.stages], value[run.stages], composed[run.stages])
    return filled, composed


def _median_ratio(numerator: np.ndarray, denominator: np.ndarray, among: np.ndarray, known: np.ndarray,
                  default: float) -> float:
    """The median of ``numerator / denominator`` over the measured stages ``among`` (``default`` where none)."""
    among = among[known[among] & (denominator[among] > 0)]
    if not len(among):
        return default
    return float(np.median(numerator[among] / denominator[among]))
