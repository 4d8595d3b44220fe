"""The correction of stage costs (ios_ray/scheduler/correction.py): fitted from schedules run whole, none of its
coefficients negative, and the DP over corrected costs exact against brute force on random DAGs; a search stores the
schedules its check ran, and the next search prices its stages by the correction fitted from them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import ios_ray
from bench.synthetic import SyntheticCost
from ios_ray.app.search.job import SearchOutcome
from ios_ray.frontend import import_module
from ios_ray.ir import Graph
from ios_ray.paired import least_rounds
from ios_ray.schedule import CANDIDATES
from ios_ray.scheduler import SearchParams, TableLatency, greedy_stages, optimize_block
from ios_ray.scheduler.correction import (FOLDS, IDENTITY, PLAUSIBLE_RATIO, Correction, ScheduleRun, corrected_table,
                                          fit_correction)
from ios_ray.stage import Stage, StageKeys
from ios_ray.store import LatencyStore
from tests.helpers import plausible_runs
from tests.test_runtime_schedules import Tiny, tiny
from tests.test_search_props import PROPS, all_schedules, count_schedules, dags, params_strategy, schedule_space


def runs_of(correction: Correction, shapes: list[tuple[float, int, int]]) -> list[ScheduleRun]:
    """Schedules of these (stage sum, stages, extra groups) that ran exactly as ``correction`` prices them."""
    return [ScheduleRun(p, s, g, correction.predict(p, s, g)) for p, s, g in shapes]


SHAPES = [(10.0, 40, 0), (8.0, 25, 12), (9.0, 30, 5), (7.5, 12, 30), (8.2, 20, 15)]


def test_a_correction_is_recovered_from_schedules_that_ran_as_it_prices_them() -> None:
    truth = Correction(1.1, 0.02, 0.05)
    found = fit_correction(runs_of(truth, SHAPES))
    assert (found.alpha, found.beta_ms, found.gamma_ms) == pytest.approx((1.1, 0.02, 0.05), rel=1e-6)
    assert found.runs == len(SHAPES)
    assert all(math.isclose(found.predict(p, s, g), truth.predict(p, s, g), rel_tol=1e-9) for p, s, g in SHAPES)


def test_no_coefficient_is_negative_and_few_runs_fit_the_scale_first() -> None:
    # groups that ran *faster* than their stages alone would ask for a negative cost per group: it is held at 0
    faster_together = [ScheduleRun(10.0, 40, 0, 11.0), ScheduleRun(8.0, 20, 20, 7.0), ScheduleRun(9.0, 30, 10, 9.0)]
    found = fit_correction(faster_together)
    assert found.alpha > 0 and found.beta_ms >= 0 and found.gamma_ms >= 0
    one = fit_correction([ScheduleRun(10.0, 40, 5, 12.0)])
    assert (one.alpha, one.beta_ms, one.gamma_ms, one.runs) == (pytest.approx(1.2), 0.0, 0.0, 1)
    assert fit_correction([]) == IDENTITY and IDENTITY.predict(7.0, 3, 2) == 7.0


def test_a_term_is_fitted_only_where_it_predicts_the_runs_left_out() -> None:
    """NASNet-A's first check on this CPU (2026-11-29, batch 1) ran two schedules: the DP's (two extra groups) at 1.22x
    its stage sum and sequential at 1.16x. Fitted exactly through both, a cost of 7.1 ms per extra group priced the
    greedy schedule (264 extra groups) at 2.4 s, and it then measured 0.49 s; two runs tell a scale, not a group cost."""
    dp, sequential = ScheduleRun(240.70, 299, 2, 292.82), ScheduleRun(245.98, 383, 0, 284.66)
    found = fit_correction([dp, sequential])
    assert (found.beta_ms, found.gamma_ms, found.runs) == (0.0, 0.0, 2)
    assert 284.66 / 245.98 < found.alpha < 292.82 / 240.70
    # where further runs show what a group costs, the fit takes it: those runs as a group cost of 0.2 ms prices them
    truth = Correction(1.05, 0.0, 0.2)
    assert fit_correction(runs_of(truth, SHAPES)).gamma_ms == pytest.approx(0.2)
    # more runs than FOLDS are left out a share at a time, and tell the same
    many = [(p * (1 + i / 100), s + i, g + i % 3) for i in range(FOLDS) for p, s, g in SHAPES]
    found = fit_correction(runs_of(truth, many))
    assert (found.alpha, found.beta_ms, found.gamma_ms, found.runs) == (pytest.approx(1.05), 0.0, pytest.approx(0.2),
                                                                        len(many))


def test_a_run_no_correction_could_explain_is_left_out_of_the_fit() -> None:
    """A 0.4 ms schedule measured at 63 ms under a burst of load (seen on a 2-core CPU) would make every stage cost
    tens of milliseconds more; runs beyond PLAUSIBLE_RATIO of their stage sum, either way, are left out."""
    sane = [ScheduleRun(10.0, 40, 5, 12.0), ScheduleRun(8.0, 20, 20, 9.0)]
    loaded = [ScheduleRun(0.4, 6, 2, 63.0), ScheduleRun(5.0, 10, 0, 5.0 / (PLAUSIBLE_RATIO * 1.01))]
    assert fit_correction(sane + loaded) == fit_correction(sane)
    assert fit_correction(loaded) == IDENTITY
    edge = ScheduleRun(1.0, 1, 0, PLAUSIBLE_RATIO)
    assert fit_correction([edge]).runs == 1  # at the bound it still counts


def test_the_fit_minimises_relative_errors() -> None:
    """A run of 1 ms and one of 100 ms count alike: the fit is not the large run's alone."""
    runs = [ScheduleRun(1.0, 1, 0, 1.2), ScheduleRun(100.0, 1, 0, 110.0)]
    found = fit_correction(runs)
    errors = [found.predict(r.predicted_ms, r.stages, r.extra_groups) / r.measured_ms - 1 for r in runs]
    assert errors[0] == pytest.approx(-errors[1], abs=0.02)  # split between both, not all on the small one


@PROPS
@given(dags(8), params_strategy(), st.floats(0.5, 2.0), st.floats(0.0, 0.5), st.floats(0.0, 0.5))
def test_the_dp_is_exact_over_corrected_costs(graph: Graph, params: SearchParams, alpha: float, beta: float,
                                             gamma: float) -> None:
    """The DP over a table of corrected stage costs finds the schedule brute force finds for the corrected cost of
    whole schedules: alpha * their stage sum + beta * their stages + gamma * their extra groups."""
    stages_from = schedule_space(graph, params)
    units = frozenset(graph.blocks[0].units)
    assume(count_schedules(stages_from, units) <= 2000)
    cost, keys = SyntheticCost(graph), StageKeys(graph)
    schedules = list(all_schedules(stages_from, units))
    table = {keys.key(s): cost.latency(s) for schedule in schedules for s in schedule}
    groups = {keys.key(s): concurrency(s) for schedule in schedules for s in schedule}
    correction = Correction(alpha, beta, gamma, 3)

    def whole(schedule: tuple[Stage, ...]) -> float:
        extra = sum(concurrency(s) - 1 for s in schedule)
        return correction.predict(sum(cost.latency(s) for s in schedule), len(schedule), extra)

    best = min(map(whole, schedules))
    result = optimize_block(graph, graph.blocks[0], TableLatency(keys, corrected_table(table, groups, correction)),
                            params)
    assert math.isclose(result.cost, best, rel_tol=1e-9)
    assert math.isclose(whole(result.schedule.stages), best, rel_tol=1e-9)


def concurrency(stage: Stage) -> int:
    """The groups of a stage that run at once (a merged conv is one)."""
    return len(stage.groups) if stage.strategy == "concurrent" else 1


def test_schedule_runs_are_stored_and_read_back_per_device_batch_and_dtype(tmp_path: Path) -> None:
    store = LatencyStore(tmp_path / "store.duckdb")
    assert store.runs("fp", 1, "float32").num_rows == 0  # none yet
    row = {"device": "cpu", "device_fingerprint": "fp", "batch": 1, "dtype": "float32", "model": "m",
           "graph_fingerprint": "g", "schedule": "dp", "predicted_ms": 1.0, "stages": 3, "extra_groups": 1,
           "measured_ms": 1.2, "rounds": 19, "host": "h"}
    assert store.put_runs([row, {**row, "schedule": "sequential", "extra_groups": 0}, {**row, "batch": 8}]) == 3
    found = store.runs("fp", 1, "float32")
    assert found.num_rows == 2 and found["schedule"].to_pylist() == ["dp", "sequential"]
    assert store.runs("fp", 1, "float16").num_rows == 0 and store.runs("other", 1, "float32").num_rows == 0


def test_a_search_keeps_what_its_check_ran_and_the_next_search_prices_stages_by_it(
        ray_local: None, tmp_path: Path) -> None:
    store = tmp_path / "store.duckdb"

    def search() -> SearchOutcome:
        return ios_ray.search(tiny(), ["cpu"], [2], input_shape=Tiny.input_shape, store=store, kernels="eager",
                              warmup=0, repeat=2, check_rounds=least_rounds(), progress=False)["cpu", 2]

    first = search()
    check = first.end_to_end
    assert check is not None and first.correction.runs == 0 and "correction" not in first.schedule.params
    ran = {c.name: c for c in check.candidates}
    assert {"dp", "sequential"} <= set(ran) <= set(CANDIDATES) and check.kept in ran
    assert all(c.corrected_ms is None for c in ran.values())  # nothing to correct with yet
    stored = LatencyStore(store, create=False).runs(first.schedule.device_fingerprint, 2)
    assert sorted(stored["schedule"].to_pylist()) == sorted(ran)
    for row in stored.to_pylist():
        assert row["measured_ms"] == pytest.approx(ran[row["schedule"]].ms)
        assert row["predicted_ms"] == pytest.approx(ran[row["schedule"]].predicted_ms)
    second = search()
    fitted = plausible_runs(check.candidates)  # a burst of load can put a run beyond belief: the fit leaves it out
    assert second.correction.runs == fitted
    again = second.end_to_end
    assert again is not None
    if fitted:
        assert second.schedule.params["correction"]["source"] == "fitted"
        assert all(c.corrected_ms is not None for c in again.candidates)
        kept = next(c for c in again.candidates if c.name == again.kept)
        assert again.kept_over_predicted == pytest.approx(kept.ms / kept.corrected_ms)
    assert LatencyStore(store, create=False).runs(first.schedule.device_fingerprint, 2).num_rows == len(ran) + len(
        again.candidates)  # the store keeps learning


def test_on_a_measured_device_the_greedy_schedule_is_measured_to_run_beside_the_dps(
        ray_local: None, tmp_path: Path) -> None:
    outcome = ios_ray.search(tiny(), ["cpu"], [2], input_shape=Tiny.input_shape, store=tmp_path / "s.duckdb",
                             kernels="eager", warmup=0, repeat=2, check_rounds=0, progress=False)["cpu", 2]
    graph = import_module(tiny(), torch.randn(1, *Tiny.input_shape)).graph
    keys = StageKeys(graph)
    table = LatencyStore(tmp_path / "s.duckdb", create=False).lookup(
        [keys.key(s) for b in graph.blocks for s in greedy_stages(graph, b)], outcome.schedule.device_fingerprint, 2)
    assert len(table) == len({keys.key(s) for b in graph.blocks for s in greedy_stages(graph, b)})
