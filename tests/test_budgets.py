"""Memory budgets and peaks as the user meets them: parsing, the schedule file, the search and show."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from bench.synthetic import SyntheticCost
from ios_ray.app.cli.show import schedule_text
from ios_ray.app.search.budgets import (MemoryBudget, budgeted, default_budget, device_memory, parse_memory_budget,
                                 refuse_what_cannot_fit, sequential_peak, trade_off)
from ios_ray.app.search.job import SearchRequest, _search, checked_request, run_search
from ios_ray.app.search.planning import Planned, plan_model
from ios_ray.app.search.request import SearchPlan
from ios_ray.app.search.progress import SilentProgress
from ios_ray.errors import UserError
from ios_ray.frontend import load_model
from ios_ray.profiler import DeviceIdentity
from ios_ray.ir import Graph
from ios_ray.schedule import PeakMemory, Schedule, read_schedule, save_schedule, schedule_from_json
from ios_ray.scheduler import SearchParams, optimize_graph
from ios_ray.scheduler.budget import smallest_peak
from ios_ray.scheduler.memory import GraphMemory, to_bytes
from ios_ray.store import LatencyStore
from tests.helpers import search_budget
from tests.test_schedule_file import squeezenet_schedule  # noqa: F401 - a fixture


@pytest.mark.parametrize("given, expected", [
    ("1.1x", MemoryBudget(factor=1.1)), ("2X", MemoryBudget(factor=2.0)), ("123456", MemoryBudget(bytes=123456)),
    (5000, MemoryBudget(bytes=5000)), ("none", None), (None, None),
])
def test_budgets_parse(given: str | int | None, expected: MemoryBudget | None) -> None:
    assert parse_memory_budget(given) == expected


@pytest.mark.parametrize("given", ["lots", "0", "-5", "0x", "1.1y", "nanx", "infx", "1e9"])
def test_a_bad_budget_is_one_sentence(given: str) -> None:
    with pytest.raises(UserError, match=r"^memory budget must be .* not .*\.$"):
        parse_memory_budget(given)


def test_a_sim_gpu_budgets_its_memory_less_weights_and_margin_and_the_cpu_none() -> None:
    assert default_budget("sim:v100", 10**9) == int(16e9 * 0.9) - 10**9
    assert default_budget("sim:k80", 0) < default_budget("sim:a100", 0)
    assert default_budget("t4", 0) == default_budget("sim:v100", 0)
    assert default_budget("cpu", 0) is None and default_budget("cuda:1", 0) is None


def test_a_gpu_that_reports_its_memory_budgets_that_over_its_labels_sheet() -> None:
    assert default_budget("cuda:1", 10**9, memory_bytes=8 * 10**9) == int(8e9 * 0.9) - 10**9
    assert default_budget("v100", 0, memory_bytes=32 * 10**9) == int(32e9 * 0.9)  # a 32 GB V100, not the sheet's 16
    assert default_budget("cpu", 0, memory_bytes=8 * 10**9) is None
    model = torch.nn.Linear(10, 10)  # 110 float32 parameters
    assert search_budget(None, "cuda:0", model, 10**9) == MemoryBudget(bytes=int(1e9 * 0.9) - 440)
    assert search_budget("1.1x", "cuda:0", model, 10**9) == MemoryBudget(factor=1.1)


def test_device_memory_is_a_gpu_sheets_or_this_machines_cpu_and_unknown_elsewhere() -> None:
    assert device_memory("sim:v100", local=False) == device_memory("v100", local=True) == 16 * 10**9
    assert device_memory("cpu", local=True) > 10**9
    assert device_memory("cpu", local=False) is None and device_memory("cuda:0", local=True) is None


def test_a_batch_that_cannot_fit_is_refused_naming_the_least_it_needs(small_graph: Graph) -> None:
    least = GraphMemory(small_graph).least_peak()
    fits = 16 * 10**9 // (least * 4)
    refuse_what_cannot_fit(small_graph, [1, fits], "float32", ["sim:v100", "cuda:0"], local=False)
    with pytest.raises(UserError, match=rf"at batch {fits + 1} needs at least .* more than the 16,000.0 MB of memory "
                                        r"sim:v100 has; search a smaller batch\.$"):
        refuse_what_cannot_fit(small_graph, [1, fits + 1], "float32", ["cuda:0", "sim:v100"], local=False)


def test_the_trade_off_keeps_each_budget_and_gets_no_slower_as_it_loosens(small_graph: Graph) -> None:
    cost = SyntheticCost(small_graph)
    found = optimize_graph(small_graph, cost)
    rows = trade_off(small_graph, found, cost, SearchParams(), 8, "float32")
    plain = sequential_peak(small_graph, GraphMemory(small_graph), 8, "float32")
    assert [r.budget for r in rows] == ["1.0x", "1.1x", "1.25x", "1.5x", "none"]
    for row, factor in zip(rows, (1.0, 1.1, 1.25, 1.5)):
        assert row.peak_bytes is not None and row.peak_bytes <= factor * plain
    latencies = [r.latency_ms for r in rows]
    assert all(a >= b - 1e-9 for a, b in zip(latencies, latencies[1:]))
    assert latencies[-1] == pytest.approx(found.cost)


def test_a_budget_below_every_schedule_names_the_smallest_peak(small_graph: Graph) -> None:
    cost = SyntheticCost(small_graph)
    least = to_bytes(smallest_peak(small_graph), 8, "float32")
    with pytest.raises(UserError) as error:
        budgeted(small_graph, optimize_graph(small_graph, cost), cost, SearchParams(), 8, "float32",
                 MemoryBudget(bytes=least - 1))
    assert f"the smallest peak any schedule reaches is {least / 1e6:,.1f} MB" in str(error.value)
    result, memory = budgeted(small_graph, optimize_graph(small_graph, cost), cost, SearchParams(), 8, "float32",
                              MemoryBudget(bytes=least))
    assert memory.peak_bytes == least and memory.budget_bytes == least


def test_peaks_round_trip_and_files_without_them_still_load(
        tmp_path: Path, squeezenet_schedule: Schedule) -> None:  # noqa: F811
    path = tmp_path / "s.json"
    with_memory = dataclasses.replace(squeezenet_schedule, memory=PeakMemory(3_000_000, 2_000_000, 4_000_000))
    save_schedule(with_memory, path)
    assert read_schedule(path) == with_memory
    assert "memory: peak 3.0 MB (sequential 2.0 MB; budget 4.0 MB)" in schedule_text(with_memory)
    data = json.loads(path.read_text())
    del data["memory"]
    assert schedule_from_json(data).memory is None
    data["memory"] = {"peak_bytes": -1, "sequential_peak_bytes": "2"}
    with pytest.raises(ValueError, match=r"memory\.peak_bytes is -1, not a whole number of bytes; "
                                         r"memory\.sequential_peak_bytes"):
        schedule_from_json(data)


def planned_request(plan: SearchPlan) -> Planned:
    """The checked request's model, built, imported and planned on the driver as a search does."""
    return plan_model(plan, load_model(plan.model, plan.input_shape, plan.name), threaded=False)


def test_a_search_on_a_gpu_that_reports_its_memory_keeps_each_setting_within_it(tmp_path: Path) -> None:
    """The search's settings take their default budget from what each device's actor reported."""
    request = checked_request(SearchRequest(model="tests.user_models:wide", devices=("cuda:0", "cpu"), batches=(1, 8),
                                            store=tmp_path / "store.duckdb"))
    identities = {"cuda:0": DeviceIdentity("cuda:0", "f", {"kind": "gpu", "memory_bytes": 10**9}, "host", "measured"),
                  "cpu": DeviceIdentity("cpu", "g", {"kind": "cpu"}, "host", "measured")}
    search = _search(request, planned_request(request), identities)
    weights = sum(t.numel() * t.element_size() for t in search.model.model.module.parameters())
    assert [(s.device, s.batch, s.memory_budget) for s in search.settings] == [
        ("cuda:0", 1, MemoryBudget(bytes=int(1e9 * 0.9) - weights)),
        ("cuda:0", 8, MemoryBudget(bytes=int(1e9 * 0.9) - weights)), ("cpu", 1, None), ("cpu", 8, None)]


def test_a_budget_no_schedule_meets_is_refused_before_anything_is_measured(tmp_path: Path) -> None:
    store = tmp_path / "store.duckdb"
    request = SearchRequest(model="tests.user_models:wide", devices=("sim:v100",), batches=(1, 8), store=store,
                            memory_budget="0.5x")
    with pytest.raises(UserError, match=r"^no schedule of tests.user_models:wide at batch 1 peaks within [\d.]+ MB: "
                                        r"the smallest peak any schedule reaches is [\d.]+ MB"):
        run_search(request, SilentProgress())
    assert LatencyStore(store, create=False).stats().num_rows == 0


def test_none_means_no_budget_even_on_a_gpu(tmp_path: Path) -> None:
    """Issue 46, item 16: ``--memory-budget none`` recorded the GPU's default budget."""
    model = torch.nn.Linear(10, 10)
    assert search_budget("none", "sim:v100", model) is None and search_budget(" None ", "cuda:0", model, 10**9) is None
    assert search_budget(None, "sim:v100", model) == MemoryBudget(bytes=int(16e9 * 0.9) - 440)
    request = checked_request(SearchRequest(model="tests.user_models:wide", devices=("sim:v100",), batches=(1,),
                                            store=tmp_path / "store.duckdb", memory_budget="none"))
    identities = {"sim:v100": DeviceIdentity("sim:v100", "f", {"kind": "gpu"}, "host", "simulated")}
    search = _search(request, planned_request(request), identities)
    assert [s.memory_budget for s in search.settings] == [None]
