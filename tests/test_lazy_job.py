"""The lazy search through the job: it measures less than everything, on a sim device ends on a schedule exactly
as cheap as the exhaustive one, records how it was made, and keeps to its budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from ios_ray.app.search.job import SearchRequest, run_search
from ios_ray.app.search.progress import SilentProgress
from ios_ray.app.search.rounds import MAX_GROWTH, ROUND_STAGES_PER_ACTOR, RoundSize
from ios_ray.errors import UserError

MODEL = "tests.user_models:wide"


def search(store: Path, measure: str, budget: int | None = None, memory_budget: str | None = None) -> list:
    """One search of the wide model on sim:v100 at batches 1 and 16."""
    request = SearchRequest(model=MODEL, devices=("sim:v100",), batches=(1, 16), store=store, measure=measure,
                            budget=budget, memory_budget=memory_budget)
    return run_search(request, SilentProgress())


@pytest.mark.slow
def test_lazy_then_all_on_one_store_cost_the_same(ray_local: None, tmp_path: Path) -> None:
    store = tmp_path / "store.duckdb"
    lazy = search(store, "lazy")
    assert all(0 < o.measured < o.planned and o.cached == 0 for o in lazy)
    for o in lazy:
        record = o.schedule.params["measure"]
        assert record["mode"] == "lazy" and record["certified"] is True and record["margin"] == 0.0
        assert record["lower_ms"] == pytest.approx(record["upper_ms"], rel=1e-9)
        assert 0 <= record["audited"] <= record["audit_population"]
        assert record["upper_ms"] == pytest.approx(o.predicted_ms, rel=1e-9)
    every = search(store, "all")  # measures the rest: now every planned stage is known
    assert [o.measured + l.measured for o, l in zip(every, lazy)] == [o.planned for o in every]
    assert [o.predicted_ms for o in every] == pytest.approx([o.predicted_ms for o in lazy], rel=1e-9)
    assert all(o.schedule.params["measure"]["mode"] == "all" for o in every)


@pytest.mark.slow
def test_under_a_memory_budget_lazy_ends_as_cheap_as_all(ray_local: None, tmp_path: Path) -> None:
    """Through the job, a lazy search under a budget that binds (the unbudgeted schedule peaks over it) ends on the
    exhaustive budgeted DP's cost (the rounds past the certificate: tests/test_lazy.py)."""
    store = tmp_path / "store.duckdb"
    free = search(store, "lazy")
    lazy = search(store, "lazy", memory_budget="1.0x")
    assert all(o.schedule.memory.peak_bytes <= o.schedule.memory.budget_bytes < f.schedule.memory.peak_bytes
               for o, f in zip(lazy, free))
    every = search(store, "all", memory_budget="1.0x")
    assert [o.predicted_ms for o in lazy] == pytest.approx([o.predicted_ms for o in every], rel=1e-9)


@pytest.mark.slow
def test_a_budget_below_the_seeds_is_one_sentence(ray_local: None, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="raise the budget"):
        search(tmp_path / "store.duckdb", "lazy", budget=5)


def test_bad_measure_mode_and_budget_are_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="measure must be one of all, lazy"):
        search(tmp_path / "store.duckdb", "some")
    with pytest.raises(UserError, match="budget must be at least 1"):
        search(tmp_path / "store.duckdb", "lazy", budget=0)
    assert not (tmp_path / "store.duckdb").exists()


def test_rounds_grow_while_choosing_outweighs_measuring_and_shrink_back() -> None:
    size = RoundSize()
    assert size.stages(actors=2) == 2 * ROUND_STAGES_PER_ACTOR
    assert size.after(choosing_s=0.1, measuring_s=0.01) == size  # quick choosing: the search is quick anyway
    grown = size.after(choosing_s=1.0, measuring_s=0.5)
    assert grown.growth == 2 and grown.stages(actors=2) == 4 * ROUND_STAGES_PER_ACTOR
    assert grown.after(choosing_s=1.0, measuring_s=9.0) == grown  # the driver's share (10%) is fine: stay
    assert grown.after(choosing_s=1.0, measuring_s=99.0).growth == 1  # the devices set the pace: smaller again
    for _ in range(20):
        size = size.after(choosing_s=1.0, measuring_s=0.1)
    assert size.growth == MAX_GROWTH
    assert RoundSize().after(choosing_s=0.0, measuring_s=0.0).growth == 1
