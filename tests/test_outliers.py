"""Stored outliers: a unit alone measured much slower than a stage containing it is found, and a search on a measured
device measures it once more, leaving simulated devices and consistent stores alone."""

from __future__ import annotations

from pathlib import Path

import pytest

import ios_ray
from ios_ray.dtypes import example_input
from ios_ray.frontend import import_model, import_module
from ios_ray.schedule import read_schedule
from ios_ray.scheduler import SearchParams, inflated, plan_graph, unit_parts
from ios_ray.stage import Stage, StageKeys
from ios_ray.store import LatencyStore, rows_to_table
from ios_ray.paired import least_rounds
from tests.api_model import INPUT_SHAPE, TwoBranch
from tests.helpers import GIVEN_KERNELS, NAMED_KERNELS, ios_ray_here


@pytest.fixture(scope="module")
def squeezenet() -> tuple[StageKeys, dict]:
    graph = import_model("squeezenet").graph
    keys = StageKeys(graph)
    return keys, plan_graph(graph, SearchParams(), keys).stages


def test_each_stage_of_several_units_names_its_units_alone(squeezenet: tuple[StageKeys, dict]) -> None:
    keys, planned = squeezenet
    parts = unit_parts(planned, keys)
    assert parts and all(len(p.stage.units) > 1 for p in (planned[k] for k in parts))
    for key, unit_keys in parts.items():
        alone = {keys.key(Stage("concurrent", ((u,),))) for u in planned[key].stage.units}
        assert set(unit_keys) == alone and alone <= set(planned)  # every unit alone is a planned stage too


def test_a_unit_alone_much_slower_than_a_stage_containing_it_is_an_outlier(
    squeezenet: tuple[StageKeys, dict]
) -> None:
    keys, planned = squeezenet
    parts = unit_parts(planned, keys)
    containing, (first, *rest) = next((k, u) for k, u in parts.items() if len(u) >= 2)
    table = {containing: 1.0, first: 2.9, **{u: 0.5 for u in rest}}
    assert inflated(table, parts) == []  # slower, but not beyond what timing noise can do
    table[first] = 4.0
    assert inflated(table, parts) == [first]
    assert inflated({first: 4.0}, parts) == []  # no measured stage contains it
    assert inflated({**table, rest[0]: 20.0}, parts)[:2] == [rest[0], first]  # the most inflated first
    assert inflated({containing: 0.001, first: 0.02}, parts) == []  # 20 times, but by less than timing resolution


@pytest.mark.slow
def test_a_stored_outlier_is_measured_again_once_by_the_next_search(ray_local: None, tmp_path: Path) -> None:
    model = TwoBranch().eval()
    store_path = tmp_path / "s.duckdb"
    # measure all: a lazy search may certify before it measured every stage
    options = {"input_shape": INPUT_SHAPE, "store": store_path, "check_rounds": least_rounds(), "warmup": 1,
               "repeat": 3, "progress": False, "measure": "all", "kernels": NAMED_KERNELS}
    first = ios_ray.search(model, "cpu", 2, **options)["cpu", 2]
    graph = import_module(model, example_input(model, INPUT_SHAPE)).graph
    keys = StageKeys(graph)
    parts = unit_parts(plan_graph(graph, SearchParams(), keys).stages, keys)
    store = LatencyStore(store_path)
    rows = store.query(device="cpu", batch=2).to_pylist()
    table = {r["stage_key"]: r["median_ms"] for r in rows}
    slowed = next(u for k, units in parts.items() if k in table for u in units if u in table)
    fastest = min(table[k] for k, units in parts.items() if k in table and slowed in units)
    row = next(r for r in rows if r["stage_key"] == slowed)
    store.put(rows_to_table([{**row, "median_ms": 50 * fastest, "p10_ms": 50 * fastest, "p90_ms": 50 * fastest}]))

    # The next search, from the CLI, of the same graph (a factory of the same class: the same stage keys).
    done = ios_ray_here("search", "--model", "tests.api_model:build", "--devices", "cpu", "--batches", "2", "--store",
                        str(store_path), "--out", "out", "--warmup", "1", "--repeat", "3",
                        "--check-rounds", str(least_rounds()), *GIVEN_KERNELS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert first.measured == first.planned  # a model this small is measured whole, so nothing new is left
    assert f"0 / {first.planned}" in done.stdout and "measured again: " in done.stdout  # measured again, not new
    [path] = (tmp_path / "out").rglob("bs2.json")
    assert read_schedule(path).params["measure"]["remeasured"] >= 1
    remeasured = {r["stage_key"]: r["median_ms"] for r in LatencyStore(store_path).query(device="cpu", batch=2)
                  .to_pylist()}
    assert remeasured[slowed] != 50 * fastest  # the outlier is replaced by the new row (however loaded the box)


@pytest.mark.slow
def test_simulated_devices_are_never_measured_again(tmp_path: Path) -> None:
    options = {"store": tmp_path / "s.duckdb", "progress": False}
    ios_ray.search("squeezenet", "sim:v100", 1, **options)
    again = ios_ray.search("squeezenet", "sim:v100", 1, **options)["sim:v100", 1]
    assert again.measured == 0 and again.schedule.params["measure"]["remeasured"] == 0
