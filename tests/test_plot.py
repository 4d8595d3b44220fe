"""The schedule picture: its timeline (who runs where and when, the critical path, the sequential schedule beside
it) and the files matplotlib writes from it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping, Sequence

import pytest

from ios_ray.app.search.budgets import Lookup
from ios_ray.app.cli.plot import check_plot_paths, plot_schedule
from ios_ray.app.cli.timeline import timelines
from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.schedule import BlockSchedule, Schedule
from ios_ray.stage import Stage, StageKeys

#: The small graph's units alone, in ms (identical units, such as b7a and bda, share a stage key and a latency), and
#: one group of three measured as a stage of its own.
ALONE = {"b1": 1.0, "b7a": 1.0, "b7b": 2.0, "b7c": 1.0, "bda": 1.0, "bp": 1.0, "cat": 1.0}
CHAIN = ("b7a", "b7b", "b7c")
CHAIN_MS = 4.0


def three_stages(graph: Graph) -> Schedule:
    """A merge of two convs, a chain beside a conv, then the concat: 2, 5 and 1 ms."""
    stages = (Stage("merge", (("b1",), ("bp",))), Stage("concurrent", (CHAIN, ("bda",))),
              Stage("concurrent", (("cat",),)))
    return Schedule("inception_c_like", graph.fingerprint, "sim:v100", 1, (BlockSchedule(0, stages, (2.0, 5.0, 1.0)),),
                    device_fingerprint="fp", source="simulated")


def store_of(graph: Graph) -> Lookup:
    """A lookup that holds every unit alone and the chain (what a lazy search measures first)."""
    keys = StageKeys(graph)
    table = {keys.key(Stage("concurrent", ((unit,),))): ms for unit, ms in ALONE.items()}
    table[keys.key(Stage("concurrent", (CHAIN,)))] = CHAIN_MS

    def lookup(wanted: Sequence[str], fingerprint: str, batch: int, dtype: str) -> Mapping[str, float]:
        assert (fingerprint, batch, dtype) == ("fp", 1, "float32")
        return {key: table[key] for key in wanted if key in table}

    return lookup


def test_stages_follow_their_latencies_and_groups_their_own(small_graph: Graph) -> None:
    timeline, sequential = timelines(three_stages(small_graph), small_graph, store_of(small_graph))
    assert timeline.stages == ((0.0, 2.0), (2.0, 5.0), (7.0, 1.0)) and timeline.total_ms == 8.0
    assert timeline.lanes == 2
    bars = {bar.unit: bar for bar in timeline.bars}
    # the merged convs share the stage on one lane, by their latencies alone
    assert (bars["b1"].lane, bars["b1"].start_ms, bars["b1"].ms, bars["b1"].merged) == (0, 0.0, 1.0, True)
    assert (bars["bp"].start_ms, bars["bp"].ms) == (1.0, 1.0)
    # the chain takes its measured 4 ms on stream 0, shared by its units alone (1:2:1); the conv beside it 1 ms
    assert [(bars[u].lane, bars[u].start_ms, bars[u].ms) for u in CHAIN] == [
        (0, 2.0, 1.0), (0, 3.0, 2.0), (0, 5.0, 1.0)]
    assert (bars["bda"].lane, bars["bda"].start_ms, bars["bda"].ms) == (1, 2.0, 1.0)
    # the critical path: the merge, the chain (the longer group), the concat
    assert {bar.unit for bar in timeline.bars if bar.critical} == {"b1", "bp", *CHAIN, "cat"}
    assert sequential is not None and sequential.lanes == 1
    assert sequential.total_ms == pytest.approx(sum(ALONE.values()))
    assert [bar.unit for bar in sequential.bars] == [u.id for u in small_graph.units]


def test_without_a_store_groups_span_their_stage_and_no_sequential_is_drawn(small_graph: Graph) -> None:
    timeline, sequential = timelines(three_stages(small_graph), small_graph, None)
    assert sequential is None
    stage = [bar for bar in timeline.bars if bar.stage == 1]
    assert {bar.known for bar in stage} == {False}
    assert sum(bar.ms for bar in stage if bar.lane == 0) == pytest.approx(5.0)  # the whole stage, split evenly
    assert [bar.ms for bar in stage if bar.lane == 1] == [5.0]


def test_a_group_never_outlasts_its_stage(small_graph: Graph) -> None:
    schedule = three_stages(small_graph)
    [block] = schedule.blocks
    tight = Schedule(schedule.model, schedule.graph_fingerprint, schedule.device, 1,
                     (BlockSchedule(0, block.stages, (2.0, 3.0, 1.0)),), device_fingerprint="fp", source="simulated")
    timeline, _ = timelines(tight, small_graph, store_of(small_graph))
    assert sum(bar.ms for bar in timeline.bars if bar.stage == 1 and bar.lane == 0) == pytest.approx(3.0)


def test_a_stage_without_a_latency_is_one_sentence(small_graph: Graph) -> None:
    schedule = three_stages(small_graph)
    [block] = schedule.blocks
    unpriced = Schedule(schedule.model, schedule.graph_fingerprint, "cpu", 1, (BlockSchedule(0, block.stages),))
    with pytest.raises(UserError, match="lacks the latency of a stage of block 0"):
        timelines(unpriced, small_graph, None)


def test_the_picture_is_written_in_each_format_asked(small_graph: Graph, tmp_path: Path) -> None:
    schedule = three_stages(small_graph)
    timeline, sequential = timelines(schedule, small_graph, store_of(small_graph))
    paths = [tmp_path / "deep" / "s.png", tmp_path / "s.svg"]
    plot_schedule(schedule, timeline, sequential, paths, "the store")
    assert paths[0].read_bytes().startswith(b"\x89PNG")
    svg = paths[1].read_text()
    assert "<svg" in svg and "stream 1" in svg and "sequential" in svg


def test_a_file_of_another_format_or_a_missing_matplotlib_is_one_sentence(
    small_graph: Graph, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UserError, match=r"--plot takes a file ending in .png, .svg, .pdf, not '.*s.jpg'"):
        check_plot_paths([tmp_path / "s.png", tmp_path / "s.jpg"])
    schedule = three_stages(small_graph)
    timeline, sequential = timelines(schedule, small_graph, None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if matplotlib were not installed
    with pytest.raises(UserError, match=r"needs matplotlib, which is not installed here; install it with pip install "
                                        r"'ios-ray\[plot\]'"):
        plot_schedule(schedule, timeline, sequential, [tmp_path / "s.png"], "the store")
    assert not (tmp_path / "s.png").exists()
