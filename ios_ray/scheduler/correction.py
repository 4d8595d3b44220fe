"""What a whole schedule runs in, from what its stages ran in alone: a correction of stage costs fitted from
schedules run end to end on one device.

The DP prices a schedule as the sum of its stages, each timed alone. A deployed schedule runs them back to back,
and the sum misses what happens between and beside them: the barrier between two stages (on a CPU waking worker
threads and waiting for them, on a GPU the events that fork and join side streams) and the interference of groups
that run at once (they share caches, memory bandwidth and SMs); the DP also takes the least of many noisy stage
timings, which favours the optimistic ones. A :class:`Correction` prices a stage of ``g`` groups measured at
``latency`` ms as ``alpha * latency + beta + gamma * (g - 1)``: a scale, a cost per stage, a cost per group beside
the first. A schedule's corrected cost is then ``alpha * P + beta * S + gamma * G`` for its stage sum P, its stages
S and its extra groups G, and :func:`fit_correction` chooses the three coefficients, none negative, that bring the
corrected costs of schedules measured whole closest to what they measured, in relative terms
(:class:`ScheduleRun`, one per schedule timed whole), with a cost per stage or per group only where it predicts the
runs left out of the fit better: two runs would otherwise fit two terms exactly, noise and all.

Applied per stage (:func:`corrected_table`), the correction is a table of stage costs like any other, so the DP,
exact over stage costs, is exact over corrected ones; and since every coefficient is non-negative, a stage's
corrected cost is at least any of its sub-stages' and groups', so the lazy search's lower bounds hold for corrected
costs as for measured ones. The same transformation with prices added (``stage_price``, ``group_price``) gives the
DP's alternatives that run fewer stages or fewer groups at once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class ScheduleRun:
    """A schedule timed whole on a device: the sum of its stages' latencies (``predicted_ms``), its stages and its
    extra groups (groups beyond the first, summed over its stages), and the median it ran in."""

    predicted_ms: float
    stages: int
    extra_groups: int
    measured_ms: float


@dataclass(frozen=True)
class Correction:
    """Stage costs as a schedule runs them: ``alpha * latency + beta_ms + gamma_ms * (groups - 1)``, fitted from
    ``runs`` schedules measured whole (0: none, the identity)."""

    alpha: float = 1.0
    beta_ms: float = 0.0
    gamma_ms: float = 0.0
    runs: int = 0

    def cost(self, latency_ms: float, groups: int) -> float:
        """The corrected cost of one stage of ``groups`` groups measured alone at ``latency_ms``."""
        return self.alpha * latency_ms + self.beta_ms + self.gamma_ms * (groups - 1)

    def predict(self, predicted_ms: float, stages: int, extra_groups: int) -> float:
        """The corrected cost of a whole schedule: its stage sum, stages and extra groups."""
        return self.alpha * predicted_ms + self.beta_ms * stages + self.gamma_ms * extra_groups

    def to_json(self) -> dict[str, Any]:
        """What a schedule file records of the correction its DP ran with (``source: fitted``)."""
        return {"alpha": self.alpha, "beta_ms": self.beta_ms, "gamma_ms": self.gamma_ms, "runs": self.runs,
                "source": "fitted"}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Correction":
        """Inverse of :meth:`to_json`."""
        return Correction(float(data["alpha"]), float(data["beta_ms"]), float(data["gamma_ms"]), int(data["runs"]))


IDENTITY = Correction()

#: A run that measured more than this many times its stage sum, or less than its inverse, is left out of a fit: no
#: correction of stage costs explains it (a burst of load during the check, or during its stages' timing: seen on
#: a loaded 2-core CPU, a 0.4 ms schedule measured 63 ms whole); the gaps a correction is for were 0.86-1.4x
#: (H100 and CPUs, 2026-11-26).
PLAUSIBLE_RATIO = 3.0


#: The most fits a choice of terms is judged by (each leaving out a share of the runs): leave-one-out up to this many
#: runs, so that the choice stays quick however many runs a device has stored (0.7 s for 1,000 runs one by one).
FOLDS = 10


def fit_correction(runs: Sequence[ScheduleRun]) -> Correction:
    """The correction, every coefficient non-negative and the scale positive, that minimises the squared relative
    error of the corrected costs against what the schedules measured; the identity without runs. Which terms beside
    the scale it fits is chosen by how well each choice predicts a run left out of its fit (leave-one-out), fewer
    terms where as good: a term is fitted only where the runs tell what it costs, never to pass exactly through as
    many runs as it has terms (more than :data:`FOLDS` runs are left out a share at a time). Runs measured beyond
    :data:`PLAUSIBLE_RATIO` of their stage sum, either way, are left out."""
    usable = [run for run in runs if plausible(run.predicted_ms, run.measured_ms)]
    if not usable:
        return IDENTITY
    features = np.array([[run.predicted_ms, run.stages, run.extra_groups] for run in usable], dtype=float)
    measured = np.array([run.measured_ms for run in usable], dtype=float)
    weighted = features / measured[:, None]  # relative errors: each run counts alike, whatever its size
    errors = {terms: _held_out_error(weighted, terms) for terms in _term_sets(len(usable))}
    least = min(errors.values())
    chosen = next(terms for terms, error in errors.items() if error <= least + 1e-12)
    alpha, beta, gamma = _fit(weighted, chosen)
    return Correction(float(alpha), float(beta), float(gamma), len(usable))


def plausible(predicted_ms: float, measured_ms: float) -> bool:
    """Whether a fit uses a schedule's run: it measured within :data:`PLAUSIBLE_RATIO` of its stage sum
    (``predicted_ms``), either way."""
    return predicted_ms > 0 and measured_ms > 0 and 1 / PLAUSIBLE_RATIO <= measured_ms / predicted_ms <= PLAUSIBLE_RATIO


def _term_sets(runs: int) -> list[tuple[int, ...]]:
    """The terms a fit of ``runs`` runs may choose among (0 the scale, always; 1 per stage; 2 per extra group), fewest
    first: no more terms than runs less one, so that every run left out is predicted by a fit of as many runs as
    terms at least."""
    most = max(0, min(2, runs - 2))
    return [(0, *extra) for size in range(most + 1) for extra in itertools.combinations((1, 2), size)]


def _held_out_error(weighted: np.ndarray, terms: tuple[int, ...]) -> float:
    """The summed squared relative error of the runs as fits of ``terms`` to the other runs predict them: each run
    left out in turn, or, beyond :data:`FOLDS` runs, every FOLDS-th run together (0 for a single run)."""
    folds = min(len(weighted), FOLDS)
    if folds < 2:
        return 0.0
    error = 0.0
    for fold in range(folds):
        out = np.arange(len(weighted)) % folds == fold
        residual = weighted[out] @ _fit(weighted[~out], terms) - 1
        error += float(residual @ residual)
    return error


def _fit(weighted: np.ndarray, terms: tuple[int, ...]) -> np.ndarray:
    """The three coefficients (0 where not fitted) of the subset of ``terms`` holding the scale, none negative, no
    more than the runs (``weighted``: one row each, features over measured), whose least-squares fit errs least."""
    best: tuple[float, np.ndarray] | None = None
    target = np.ones(len(weighted))
    for size in range(1, min(len(terms), len(weighted)) + 1):
        for used in itertools.combinations(terms[1:], size - 1):
            columns = [0, *used]
            coefficients, *_ = np.linalg.lstsq(weighted[:, columns], target, rcond=None)
            if coefficients[0] <= 0 or (coefficients < 0).any():
                continue
            residual = float(np.sum((weighted[:, columns] @ coefficients - target) ** 2))
            if best is None or residual < best[0] - 1e-12:
                full = np.zeros(3)
                full[columns] = coefficients
                best = (residual, full)
    assert best is not None, "the scale alone is positive for positive runs"
    return best[1]


def corrected_table(table: Mapping[str, float], groups: Mapping[str, int], correction: Correction,
                    stage_price: float = 0.0, group_price: float = 0.0) -> dict[str, float]:
    """The stage costs of ``table`` (stage key -> ms measured alone) as ``correction`` prices them, with
    ``stage_price`` more per stage and ``group_price`` more per group beside the first (``groups``: each key's
    groups)."""
    beta, gamma = correction.beta_ms + stage_price, correction.gamma_ms + group_price
    return {key: correction.alpha * ms + beta + gamma * (groups[key] - 1) for key, ms in table.items()}
