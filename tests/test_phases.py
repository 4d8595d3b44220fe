"""Where a search's time goes: the stopwatch's phases add up to the wall time, in the order a search reaches them,
and a search's outcomes, files and last progress line carry them."""

from __future__ import annotations

from pathlib import Path

import pytest

import ios_ray
from ios_ray.app.search.phases import PHASES, SearchTimes, Stopwatch
from ios_ray.app.search.progress import SilentProgress
from ios_ray.schedule import read_schedule
from tests.api_model import INPUT_SHAPE, TwoBranch


class FakeClock:
    """Seconds that move only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_phases_add_up_to_the_wall_time_in_the_order_a_search_reaches_them() -> None:
    clock = FakeClock()
    watch = Stopwatch(clock)
    with watch.phase("measuring"):
        clock.now += 2.0
    clock.now += 0.5  # in no phase: other
    with watch.phase("start-up"):
        clock.now += 1.0
    with watch.phase("measuring"):  # a lazy search's second round adds to the first
        clock.now += 3.0
    times = watch.read()
    assert times.phases == (("start-up", 1.0), ("measuring", 5.0))  # PHASES order, not the order of entry
    assert times.wall_s == pytest.approx(6.5) and times.other_s == pytest.approx(0.5)
    assert times.to_json() == {"wall": 6.5, "start-up": 1.0, "measuring": 5.0, "other": 0.5}
    assert times.summary() == "6.5 s: start-up 1.0, measuring 5.0, other 0.5"


def test_a_phase_that_raises_still_counts_and_an_unknown_phase_is_refused() -> None:
    clock = FakeClock()
    watch = Stopwatch(clock)
    with pytest.raises(KeyboardInterrupt), watch.phase("check"):
        clock.now += 4.0
        raise KeyboardInterrupt
    assert watch.read().phases == (("check", 4.0),)
    with pytest.raises(ValueError, match="no search phase 'dp'; the phases are start-up, import"):
        with watch.phase("dp"):
            pass
    assert SearchTimes(1.0, (("DP", 1.5),)).other_s == 0.0  # never negative where rounding crosses
    assert PHASES.index("choosing") < PHASES.index("measuring") < PHASES.index("check")


class Finished(SilentProgress):
    """Remembers the times the search said it finished in."""

    def __init__(self) -> None:
        self.times: list[SearchTimes] = []

    def finished(self, times: SearchTimes) -> None:
        self.times.append(times)


def test_a_search_says_where_its_time_went_in_its_outcomes_files_and_last_line(
    ray_local: None, tmp_path: Path
) -> None:
    progress = Finished()
    store, out = tmp_path / "s.duckdb", tmp_path / "out"
    first = ios_ray.search(TwoBranch().eval(), "sim:v100", [1, 4], input_shape=INPUT_SHAPE, store=store, out=out,
                           progress=progress)
    again = ios_ray.search(TwoBranch().eval(), "sim:v100", [1, 4], input_shape=INPUT_SHAPE, store=store,
                           progress=progress)
    [ended_first, ended_again] = progress.times
    for result, ended in ((first, ended_first), (again, ended_again)):
        walls = [outcome.wall_s for outcome in result]
        assert walls == sorted(walls) and walls[-1] <= ended.wall_s  # each setting's times: the search's until then
        for outcome in result:
            assert outcome.schedule.params["search_s"] == outcome.times.to_json()
            assert {"import", "DP"} <= dict(outcome.times.phases).keys()
    assert {"start-up", "measuring"} <= dict(ended_first.phases).keys()  # a fresh store: Ray started, measured
    assert "measuring" not in dict(ended_again.phases)  # all stored: nothing measured, no Ray needed
    for outcome in first:
        assert outcome.path is not None and read_schedule(outcome.path).params["search_s"] == outcome.times.to_json()
