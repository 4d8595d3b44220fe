"""Lazy search: measure only the candidate stages that can change the DP's answer.

The IOS DP is a shortest path over a block's states whose edges are stages. The lazy search evaluates edges
lazily (in the spirit of LazySP, Dellin and Srinivasa 2016): it keeps, per setting (device, batch), the measured
latencies and from them a lower bound and a best guess of every other stage (:mod:`~ios_ray.scheduler.estimate`).
One round, :func:`next_round`, is pure: given what is measured, it says what to measure next.

Per block it runs the DP (:mod:`~ios_ray.scheduler.arrays`) three times: on the lower bounds (cost ``L``: no
schedule can be cheaper), on measured stages only (cost ``U``: the best schedule known for sure) and on the
guesses. Where ``L >= U`` the block is done: its best measured schedule is optimal, exactly as far as the bounds
are bounds. Otherwise a stage is *live* where the cheapest schedule through it, priced with bounds, is below
``U``; only live stages can change the answer. The round asks for the unmeasured stages of the block's best
schedule under the bounds (without those, ``L`` cannot rise) and under the guesses, then for the other live
stages by how close the guessed schedule through them comes to the guessed optimum, until the round holds
``round_size`` stages, so that every device gets a batch worth sending. The first round measures the seeds:
every one-group stage (units alone included) and every two-group stage, which the estimates are built from.

Structural bounds hold on any device (up to noise); the composed bound of stages of three or more groups is only
calibrated on the stages measured so far, which the search chose because they looked good, so it can sit above
stages it did not choose. Before it certifies a schedule, the search therefore *audits* the composed bound: the
*population* is every stage of three or more groups that is live under structural bounds alone, and the sample is
``audit`` (``AUDIT_SIZE``) of them per group count, uniformly at random (the first in a fixed random order, so a
rerun on the same store asks for the same ones). It certifies only once the sample is measured and still nothing
is live: a sampled stage below its composed bound lowers the calibration, and the rounds go on. Each group
count's calibration is then at most the least measured / composed ratio of a uniform sample of that size's
population, so fewer than about ``3 / audit`` of that size's population lie below their bound (95% confidence):
a statistical certificate, as good as the sample, not a proof.

Work is reused between rounds: states, transitions and stage numbers are built once (:class:`LazySpace`, a
:class:`~ios_ray.scheduler.search_space.SearchSpace` with the estimates' relations), and identical blocks (NASNet's
repeated cells) are solved once; a round is a few vectorised passes per block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Iterator, Mapping

import numpy as np

from ios_ray.ir import Graph
from ios_ray.scheduler.arrays import BlockArrays
from ios_ray.scheduler.estimate import Estimates, estimate
from ios_ray.scheduler.relations import StageRelations, relate
from ios_ray.scheduler.search_space import SearchSpace, collection_paused, walked
from ios_ray.scheduler.space import SearchParams
from ios_ray.stage import StageKeys

#: Relative tolerance of ``L >= U`` (sums of the same floats in another order).
TOLERANCE = 1e-9
#: Stages sampled to audit the composed bound before a schedule is certified (see the module docstring).
AUDIT_SIZE = 64


@dataclass(frozen=True)
class LazyParams:
    """How the lazy search measures: ``margin`` below every bound that is not a measurement (a fraction, for
    measurement noise), at least ``round_size`` stages per setting and round, at most ``budget`` per setting, and
    ``audit`` stages of each group count sampled before it certifies a schedule."""

    margin: float = 0.0
    round_size: int = 64
    budget: int | None = None
    audit: int = AUDIT_SIZE


@dataclass(frozen=True)
class LazyRound:
    """What one round found for one setting: the stage keys to measure next (none when done) with the lower bound
    each had (NaN for seeds), the bounds on the best schedule's cost in ms (``lower``: under the bounds,
    ``upper``: of measured stages, ``inf`` where none), whether they meet (and the audit is measured), how many
    stages are live, the composed bound's calibration, and the audit: how many stages it samples, of how many
    live under structural bounds alone (0 and 0 until the search first comes to certify)."""

    measure: tuple[str, ...]
    bounds: tuple[float, ...]
    lower: float
    upper: float
    certified: bool
    live: int
    calibration: float
    audited: int = 0
    audit_population: int = 0

    @property
    def done(self) -> bool:
        """True when nothing is left to measure: the schedule is certified, or the budget is spent."""
        return not self.measure


@dataclass(frozen=True, kw_only=True)
class LazySpace(SearchSpace):
    """What does not change between the lazy search's rounds: the search space, with the stages its estimates
    relate (numbered after the planned ones) and the seeds, measured first."""

    relations: StageRelations
    seeds: np.ndarray

    @staticmethod
    def build(graph: Graph, params: SearchParams, keys: StageKeys | None = None) -> LazySpace:
        """The lazy space of ``graph`` under ``params``."""
        with collection_paused():
            index, space = walked(graph, params, keys)
            relations = relate(index)
        seeds = np.concatenate([relations.one_group, relations.pairs])
        return LazySpace(**{f.name: getattr(space, f.name) for f in fields(SearchSpace)}, relations=relations,
                         seeds=np.sort(seeds))


def next_round(space: LazySpace, table: Mapping[str, float], params: LazyParams = LazyParams()) -> LazyRound:
    """Given one setting's measured latencies (by stage key), the stages to measure next; pure."""
    latency = space.vector(table)
    known = ~np.isnan(latency)
    left = math.inf if params.budget is None else max(0, params.budget - int(known.sum()))
    missing_seeds = space.seeds[~known[space.seeds]]
    if len(missing_seeds):
        chosen = missing_seeds[: _cap(left)]
        return LazyRound(_keys(space, chosen), (math.nan,) * len(chosen), lower=math.nan, upper=math.inf,
                         certified=False, live=len(missing_seeds), calibration=0.0)
    estimates = estimate(space.relations, latency, params.margin)
    return _choose(space, estimates, known, params, left)


def lower_bounds(space: LazySpace, table: Mapping[str, float], margin: float = 0.0) -> dict[str, float]:
    """Every planned stage's lower bound in ms by key, given one setting's measured latencies (a measured stage's
    is its latency), as :func:`next_round` prices them once the seeds are measured; pure."""
    lower = estimate(space.relations, space.vector(table), margin).lower
    return {key: float(ms) for key, ms in zip(space.keys, lower)}


def _choose(space: LazySpace, estimates: Estimates, known: np.ndarray, params: LazyParams, left: float
            ) -> LazyRound:
    """Run the three DPs per block and pick the round's stages (see the module docstring)."""
    measured_only = np.where(known, estimates.lower, np.inf)
    regret = np.full(len(known), np.inf)
    must: set[int] = set()
    lower_total = upper_total = 0.0
    uppers = []
    for block, copies in zip(space.blocks, space.copies):
        lower, upper = _block_round(block, estimates, known, measured_only, regret, must)
        lower_total += copies * lower
        upper_total += copies * upper
        uppers.append(upper)
    live = np.flatnonzero(np.isfinite(regret))
    ranked = live[np.argsort(regret[live], kind="stable")]
    chosen = list(dict.fromkeys([*sorted(must), *ranked.tolist()]))[: max(params.round_size, len(must))]
    audit = population = np.zeros(0, dtype=np.int64)
    if not chosen and math.isfinite(upper_total):
        audit, population = _audit(space, estimates, known, uppers, params.audit)
        chosen = audit[~known[audit]].tolist()
    picked = np.array(chosen[: _cap(left)], dtype=np.int64)
    return LazyRound(_keys(space, picked), tuple(float(b) for b in estimates.lower[picked]), lower=lower_total,
                     upper=upper_total, certified=not chosen and math.isfinite(upper_total), live=len(live),
                     calibration=estimates.calibration, audited=len(audit),
                     audit_population=len(population))


def _block_round(block: BlockArrays, estimates: Estimates, known: np.ndarray, measured_only: np.ndarray,
                 regret: np.ndarray, must: set[int]) -> tuple[float, float]:
    """One block's bounds ``(L, U)``; adds its live stages' regrets to ``regret`` and its must-measure to ``must``."""
    by_lower = block.ending_weights(estimates.lower)
    cost_lower = block.forward(by_lower)
    lower, upper = cost_lower[block.full], block.forward(block.ending_weights(measured_only))[block.full]
    if lower >= upper * (1 - TOLERANCE):
        return lower, upper
    by_guess = block.ending_weights(estimates.guess)
    cost_guess = block.forward(by_guess)
    for weights, cost in ((by_lower, cost_lower), (by_guess, cost_guess)):
        for ending in block.best_endings(weights, cost):
            must.update(int(s) for s in block.candidates[ending] if s >= 0 and not known[s])
    through_lower = block.through(cost_lower, block.backward(by_lower))
    through_guess = block.through(cost_guess, block.backward(by_guess)) - cost_guess[block.full]
    for usable, stage, below in _beating(block, through_lower, estimates.lower, upper):
        live = below & ~known[stage]
        np.minimum.at(regret, stage[live], through_guess[usable][live] + estimates.guess[stage[live]])
    return lower, upper


def _audit(space: LazySpace, estimates: Estimates, known: np.ndarray, uppers: list[float], size: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """The audit's sample (``size`` stages of each group count, fewer where the population has fewer) and the
    population it is drawn from: the stages of three or more groups that are live under structural bounds alone
    (below each block's ``U``, from ``uppers``), each priced with the bound it has unmeasured (so measuring a
    sampled stage does not take it out of the population), other stages with their measured latency or
    structural bound."""
    weights = np.where(known, estimates.lower, estimates.structural)
    live = np.zeros(len(known), dtype=bool)
    for block, upper in zip(space.blocks, uppers):
        by_bound = block.ending_weights(weights)
        through = block.through(block.forward(by_bound), block.backward(by_bound))
        for _, stage, below in _beating(block, through, estimates.structural, upper):
            live[stage[below]] = True
    population = np.flatnonzero(live & (space.relations.group_count >= 3) & ~space.relations.merge)
    ranked = population[np.argsort(space.audit_rank[population])]
    sizes = space.relations.group_count[ranked]
    return np.concatenate([ranked[sizes == k][:size] for k in np.unique(sizes)] or [ranked]), population


def _beating(block: BlockArrays, through: np.ndarray, bound: np.ndarray, upper: float
             ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per column of the block's candidates: which endings have one, its stages, and which of these a schedule
    can run below ``upper`` (``through`` from :meth:`BlockArrays.through`, the stage itself at ``bound``)."""
    for column in range(block.candidates.shape[1]):
        stage = block.candidates[:, column]
        usable = stage >= 0
        stage = stage[usable]
        yield usable, stage, through[usable] + bound[stage] < upper * (1 - TOLERANCE)


def _keys(space: LazySpace, chosen: np.ndarray) -> tuple[str, ...]:
    """The keys of the chosen stage numbers."""
    return tuple(space.planned[i].key for i in chosen)


def _cap(left: float) -> int | None:
    """A slice end for what the budget has left (None: no limit)."""
    return None if math.isinf(left) else int(left)
