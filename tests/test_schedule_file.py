"""The schedule file: versioned JSON that round-trips and is checked against the graph it is loaded for."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote

import pytest

from bench.synthetic import SyntheticCost
from ios_ray.errors import UserError
from ios_ray.paired import CompiledAhead, RatioInterval
from ios_ray.frontend import import_model
from ios_ray.runtime import read_schedules
from ios_ray.schedule import (SCHEDULE_VERSION, BlockSchedule, CandidateRun, EndToEnd, ModelAsIs, PeakMemory,
                              Schedule, check_schedule, folder_name, load_schedule, read_schedule, save_schedule,
                              schedule_path)
from ios_ray.scheduler import SearchParams, optimize_graph, sequential
from ios_ray.app.search.check import kept_schedule
from ios_ray.app.search.outcome import SearchOutcome
from ios_ray.app.search.phases import SearchTimes
from ios_ray.stage import Stage
from tests.helpers import HANG_S, ios_ray_here


@pytest.fixture(scope="module")
def squeezenet_schedule() -> Schedule:
    graph = import_model("squeezenet").graph
    result = optimize_graph(graph, SyntheticCost(graph), SearchParams())
    return Schedule("squeezenet", graph.fingerprint, "sim:v100", 8, result.schedules, device_fingerprint="abc",
                    device_info={"gpu": "v100"}, params=SearchParams().to_json(), source="simulated")


def test_round_trip_keeps_everything(tmp_path: Path, squeezenet_schedule: Schedule) -> None:
    path = tmp_path / "bs8.json"
    save_schedule(squeezenet_schedule, path)
    again = load_schedule(path, import_model("squeezenet").graph, device="sim:v100")
    assert again == squeezenet_schedule
    data = json.loads(path.read_text())
    assert data["version"] == 2 and data["params"] == {"r": 3, "s": 8, "strategies": ["concurrent", "merge"]}
    assert data["predicted_latency_ms"] == pytest.approx(squeezenet_schedule.predicted_latency)
    assert {s["strategy"] for b in data["blocks"] for s in b["stages"]} <= {"concurrent", "merge"}


def test_the_end_to_end_check_keeps_the_dp_schedule_only_where_it_is_faster_beyond_noise_and_round_trips(
    tmp_path: Path, squeezenet_schedule: Schedule
) -> None:
    graph = import_model("squeezenet").graph
    plain = Schedule("squeezenet", graph.fingerprint, "cpu", 8,
                     tuple(sequential(graph, b, SyntheticCost(graph)) for b in graph.blocks))
    checks = {
        "kept IOS: faster beyond noise, 0.93-0.99": RatioInterval(0.96, 0.93, 0.99, 0.99, 12),
        "kept sequential: within noise, 0.98-1.03": RatioInterval(0.99, 0.98, 1.03, 0.99, 18),
        "kept sequential: IOS slower beyond noise, 1.04-1.10": RatioInterval(1.07, 1.04, 1.10, 0.99, 12),
        "kept sequential: within noise, no interval": RatioInterval(0.9, None, None, 0.99, 6),
    }
    for decision, ratio in checks.items():
        # the medians say the DP's schedule ran faster every time: the interval alone decides
        check = EndToEnd(ratio.rounds, dp_ms=3.9, sequential_ms=4.0, dp_predicted_ms=3.5, sequential_predicted_ms=4.1,
                         ratio=ratio)
        kept = kept_schedule({"dp": squeezenet_schedule, "sequential": plain}, check)
        assert check.decision == decision
        assert kept.stages == (squeezenet_schedule if check.kept == "dp" else plain).stages
        assert kept.end_to_end == check and (check.kept == "dp") == decision.startswith("kept IOS")
        assert f"IOS / sequential {ratio.median:.3f} (99% interval {ratio.span}, {ratio.rounds} rounds)" in (
            check.summary())

        path = tmp_path / "bs8.json"
        save_schedule(kept, path)
        assert read_schedule(path) == kept
    assert json.loads(path.read_text())["end_to_end"] == {
        "rounds": 6, "dp_ms": 3.9, "sequential_ms": 4.0, "dp_predicted_ms": 3.5, "sequential_predicted_ms": 4.1,
        "ratio": 0.9, "ratio_low": None, "ratio_high": None, "confidence": 0.99, "kept": "sequential",
        "decision": "kept sequential: within noise, no interval"}
    save_schedule(squeezenet_schedule, path)
    assert json.loads(path.read_text())["end_to_end"] is None and read_schedule(path).end_to_end is None


def test_the_candidates_a_check_left_out_for_its_time_are_said_and_round_trip(tmp_path: Path,
                                                                              squeezenet_schedule: Schedule) -> None:
    paired = RatioInterval(0.9, 0.85, 0.95, 0.99, 12)
    check = EndToEnd(12, 0.9, 1.0, 0.8, 1.1, paired, (CandidateRun("dp", 0.9, 12, 0.8, None, paired),
                                                      CandidateRun("sequential", 1.0, 12, 1.1)),
                     "dp", left_out=("dp-fewer-groups", "greedy"))
    said = "left out for the check's time: IOS fewer groups, greedy"
    assert said in check.summary()
    kept = kept_schedule({"dp": squeezenet_schedule, "sequential": squeezenet_schedule}, check)
    assert said in SearchOutcome("cpu", 8, kept, 0.8, 1.1, 0, 0, SearchTimes(1.0, ()), None, "measured").summary()
    save_schedule(kept, tmp_path / "bs8.json")
    assert json.loads((tmp_path / "bs8.json").read_text())["end_to_end"]["left_out"] == ["dp-fewer-groups", "greedy"]
    assert read_schedule(tmp_path / "bs8.json").end_to_end == check
    assert "left out" not in dataclasses.replace(check, left_out=()).summary()


def test_what_a_check_compiled_before_its_rounds_is_said_and_round_trips(tmp_path: Path,
                                                                          squeezenet_schedule: Schedule) -> None:
    paired = RatioInterval(0.9, 0.85, 0.95, 0.99, 12)
    check = EndToEnd(12, 0.9, 1.0, 0.8, 1.1, paired, (CandidateRun("dp", 0.9, 12, 0.8, None, paired),
                                                      CandidateRun("sequential", 1.0, 12, 1.1)),
                     "dp", compiled=CompiledAhead(8, 75, 61, 0, 9.25))
    said = "75 regions compiled ahead in 9.2 s, 61 by 8 workers"
    kept = kept_schedule({"dp": squeezenet_schedule, "sequential": squeezenet_schedule}, check)
    assert said in check.summary()
    assert said in SearchOutcome("cpu", 8, kept, 0.8, 1.1, 0, 0, SearchTimes(1.0, ()), None, "measured").summary()
    save_schedule(kept, tmp_path / "bs8.json")
    data = json.loads((tmp_path / "bs8.json").read_text())
    assert data["end_to_end"]["compiled"] == {
        "workers": 8, "regions": 75, "by_workers": 61, "left": 0, "seconds": 9.25, "missed": 0}
    assert read_schedule(tmp_path / "bs8.json").end_to_end == check
    del data["end_to_end"]["compiled"]["missed"]  # as written before the workers' misses were counted
    (tmp_path / "before.json").write_text(json.dumps(data))
    assert read_schedule(tmp_path / "before.json").end_to_end == check
    left = dataclasses.replace(check, compiled=CompiledAhead(1, 14, 3, 2, 30.0, missed=4))
    assert ("14 regions compiled ahead in 30.0 s, 3 by 1 worker (4 more missed the cache and compiled again), 2 left "
            "to their first calls") in left.summary()
    save_schedule(dataclasses.replace(kept, end_to_end=left), tmp_path / "left.json")
    assert read_schedule(tmp_path / "left.json").end_to_end == left
    assert "compiled ahead" not in dataclasses.replace(check, compiled=None).summary()


@pytest.mark.parametrize("low, high, slower", [(1.04, 1.10, True), (0.95, 1.02, False), (0.55, 0.61, False)])
def test_the_model_as_is_round_trips_and_a_kept_schedule_slower_than_it_is_warned_of(
        tmp_path: Path, squeezenet_schedule: Schedule, low: float, high: float, slower: bool) -> None:
    ratio = RatioInterval((low + high) / 2, low, high, 0.95, 10)
    check = EndToEnd(12, 3.9, 4.0, 3.5, 4.1, RatioInterval(0.96, 0.93, 0.99, 0.99, 12),
                     as_is=ModelAsIs(4.0 / ratio.median, 10, ratio))
    kept = kept_schedule({"dp": squeezenet_schedule, "sequential": squeezenet_schedule}, check)
    save_schedule(kept, tmp_path / "bs8.json")
    assert read_schedule(tmp_path / "bs8.json").end_to_end == check
    assert json.loads((tmp_path / "bs8.json").read_text())["end_to_end"]["as_is"] == {
        "ms": check.as_is.ms, "rounds": 10, "ratio": ratio.median, "ratio_low": low, "ratio_high": high,
        "confidence": 0.95}
    assert f"the model as is {check.as_is.ms:.3f} ms, kept / as is {ratio.median:.3f} ({low:.2f}-{high:.2f})" in \
        check.summary()
    outcome = SearchOutcome("cpu", 8, kept, 3.5, 4.1, 0, 0, SearchTimes(1.0, ()), None, "measured")
    assert check.as_is.summary() in outcome.summary()
    assert (outcome.slower_than_as_is is not None) == slower
    if slower:
        assert outcome.slower_than_as_is == (
            f"warning: cpu batch 8: the schedule kept ran {ratio.median:.2f}x as long as the model as is "
            f"({low:.2f}-{high:.2f}, 10 rounds): ios-ray does not speed squeezenet up there; run the model as is "
            "on cpu")


def test_a_schedule_file_from_before_paired_checks_still_loads_and_keeps_what_it_kept(
    tmp_path: Path, squeezenet_schedule: Schedule
) -> None:
    data = squeezenet_schedule.to_json()
    for dp_ms, kept in ((5.0, "sequential"), (3.0, "dp")):
        data["end_to_end"] = {"rounds": 10, "dp_ms": dp_ms, "sequential_ms": 4.0, "dp_predicted_ms": 3.5,
                              "sequential_predicted_ms": 4.1, "kept": kept}
        path = tmp_path / "old.json"
        path.write_text(json.dumps(data))
        check = read_schedule(path).end_to_end
        assert check is not None and check.ratio is None and check.kept == kept and check.rounds == 10
        assert check.decision == f"kept {'IOS' if kept == 'dp' else 'sequential'}: lower median, unpaired check"


def test_mismatches_are_rejected(tmp_path: Path, squeezenet_schedule: Schedule) -> None:
    path = tmp_path / "bs8.json"
    save_schedule(squeezenet_schedule, path)
    with pytest.raises(UserError, match="made for another graph"):
        load_schedule(path, import_model("inception_v3").graph)
    with pytest.raises(UserError, match="not 'cpu'"):
        load_schedule(path, import_model("squeezenet").graph, device="cpu")
    data = json.loads(path.read_text())
    data["version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="format version 99"):
        read_schedule(path)
    path.write_text("{not json")
    with pytest.raises(UserError, match="not a valid ios-ray schedule"):
        read_schedule(path)


def test_a_schedule_missing_a_unit_or_out_of_order_is_rejected(squeezenet_schedule: Schedule) -> None:
    graph = import_model("squeezenet").graph
    first, *rest = squeezenet_schedule.blocks
    dropped = Schedule("squeezenet", graph.fingerprint, "cpu", 1, tuple(rest))
    with pytest.raises(UserError, match="exactly once"):
        check_schedule(dropped, graph)
    units = [u for stage in first.stages for u in stage.units]
    backwards = BlockSchedule(first.block, tuple(Stage("concurrent", ((u,),)) for u in reversed(units)))
    with pytest.raises(UserError, match="before or beside one of its inputs"):
        check_schedule(Schedule("squeezenet", graph.fingerprint, "cpu", 1, (backwards, *rest)), graph)


@pytest.mark.parametrize("content, message", [
    ("{broken", "is not a valid ios-ray schedule"),
    pytest.param("[" * 200_000 + "]" * 200_000, "its JSON is nested too deeply to read", id="nested"),  # 46, 12
    pytest.param(None, "was made for this InceptionV3", marks=pytest.mark.slow),
])
def test_cli_rejects_corrupt_or_foreign_schedules(tmp_path: Path, squeezenet_schedule: Schedule,
                                                  content: str | None, message: str) -> None:
    path = tmp_path / "schedules" / "x" / "cpu" / "bs1.json"
    save_schedule(squeezenet_schedule, path)
    if content is not None:
        path.write_text(content)
    command = ["show", str(path)] if content is not None else ["run", "--model", "inception_v3", "--schedules",
                                                                 str(path)]
    result = subprocess.run([sys.executable, "-m", "ios_ray", *command], capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_writers_of_one_schedule_file_at_once_never_tear_it(tmp_path: Path, squeezenet_schedule: Schedule) -> None:
    """Issue 46, item 15: writers shared one temporary name, so a write failed or a reader saw a torn file."""
    path = tmp_path / "bs8.json"
    versions = [dataclasses.replace(squeezenet_schedule, batch=batch) for batch in (1, 2, 4, 8)]
    save_schedule(versions[0], path)
    failures: list[str] = []

    def write(schedule: Schedule) -> None:
        for _ in range(40):
            try:
                save_schedule(schedule, path)
            except UserError as error:
                failures.append(f"write: {error}")

    def read() -> None:
        for _ in range(200):
            try:
                assert read_schedule(path) in versions
            except (UserError, AssertionError) as error:
                failures.append(f"read: {error}")

    threads = [threading.Thread(target=write, args=(v,)) for v in versions] + [threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:3]
    assert [p.name for p in tmp_path.iterdir()] == ["bs8.json"]  # no temporary file left behind


#: A paired check's ``end_to_end`` as a search writes it.
PAIRED = {"rounds": 19, "dp_ms": 3.9, "sequential_ms": 4.0, "ratio": 0.97, "ratio_low": 0.95, "ratio_high": 0.99,
          "confidence": 0.999, "kept": "dp", "decision": "kept IOS: faster beyond noise, 0.95-0.99"}

#: Hand edits of a schedule file, by the field they spoil (path in the JSON, new value) and what the sentence says.
HAND_EDITS = {
    "latency a word": (("blocks", 0, "stages", 0, "latency_ms"), "fast",
                       'blocks[0].stages[0].latency_ms is "fast", not a number of milliseconds or null'),
    "unknown dtype": (("dtype",), "float8", 'dtype is "float8", not one of float32, float16, bfloat16'),
    "batch a string": (("batch",), "1", 'batch is "1", not a whole number from 1 to'),
    "batch zero": (("batch",), 0, "batch is 0, not a whole number"),
    "batch a fraction": (("batch",), 1.5, "batch is 1.5, not a whole number"),
    "unknown memory format": (("memory_format",), "nhwc", 'memory_format is "nhwc", not one of contiguous'),
    "input shape of words": (("input_shape",), ["3", 224, 224], "input_shape is [\"3\", 224, 224], not a list"),
    "negative latency": (("blocks", 1, "stages", 0, "latency_ms"), -2, "latency_ms is -2, not a number"),
    "unknown strategy": (("blocks", 0, "stages", 0, "strategy"), "fused", 'strategy is "fused", not one of'),
    "groups of numbers": (("blocks", 0, "stages", 0, "groups"), [[1, 2]], "groups is [[1, 2]], not a non-empty"),
    "block not a number": (("blocks", 0, "block"), "zero", 'blocks[0].block is "zero", not a whole number'),
    "model missing": (("model",), None, "model is null, not a string"),
    "check not timed": (("end_to_end",), {"rounds": 3, "dp_ms": "x", "sequential_ms": 1.0},
                        'end_to_end.dp_ms is "x", not a number of milliseconds'),
    "ratio a word": (("end_to_end",), {**PAIRED, "ratio": "fast"},
                     'end_to_end.ratio is "fast", not a positive number or null'),
    "confidence a percentage": (("end_to_end",), {**PAIRED, "confidence": 99.9},
                                "end_to_end.confidence is 99.9, not a number from 0.5 to below 1"),
    "ratio without confidence": (("end_to_end",), {k: v for k, v in PAIRED.items() if k != "confidence"},
                                 "end_to_end.confidence is missing"),
    "interval beside its ratio": (("end_to_end",), {**PAIRED, "ratio_low": 1.02, "ratio_high": 1.1},
                                  "end_to_end's interval 1.02-1.1 does not hold its ratio 0.97"),
    "half an interval": (("end_to_end",), {**PAIRED, "ratio_high": None},
                         "end_to_end.ratio_low and ratio_high are not both numbers or both null"),
    "decision a number": (("end_to_end",), {**PAIRED, "decision": 1}, "end_to_end.decision is 1, not a string"),
    "unknown candidate left out": (("end_to_end",), {**PAIRED, "left_out": ["fastest"]},
                                   'end_to_end.left_out is ["fastest"], not a list of names from dp, dp-fewer-stages'),
    "regions compiled a fraction": (("end_to_end",), {**PAIRED, "compiled": {"workers": 1, "regions": 7.5,
                                                                             "by_workers": 0, "left": 0,
                                                                             "seconds": 1.0}},
                                    "end_to_end.compiled.regions is 7.5, not a whole number from 0"),
}


@pytest.fixture(scope="module")
def cpu_schedule() -> Schedule:
    graph = import_model("squeezenet").graph
    blocks = tuple(sequential(graph, b, SyntheticCost(graph)) for b in graph.blocks)
    return Schedule("squeezenet", graph.fingerprint, "cpu", 1, blocks, input_shape=graph.input_shape)


@pytest.mark.parametrize("case", list(HAND_EDITS))
def test_a_hand_edited_field_is_refused_in_one_sentence_naming_it(tmp_path: Path, cpu_schedule: Schedule,
                                                                   case: str) -> None:
    steps, value, said = HAND_EDITS[case]
    path = tmp_path / "bs1.json"
    save_schedule(cpu_schedule, path)
    data = json.loads(path.read_text())
    place = data
    for step in steps[:-1]:
        place = place[step]
    place[steps[-1]] = value
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=re.escape(said)) as refused:
        read_schedule(path)
    defects = str(refused.value).partition(" (")[2].rpartition("); ")[0]
    assert "; " not in defects and "\n" not in str(refused.value)  # one defect, named once


def test_every_defect_is_named_and_run_and_scheduled_module_refuse_the_file_untouched(
    tmp_path: Path, cpu_schedule: Schedule
) -> None:
    from ios_ray.runtime import ScheduledModule
    from ios_ray.zoo import ZOO

    path = tmp_path / "schedules" / "bs1.json"
    save_schedule(cpu_schedule, path)
    data = json.loads(path.read_text())
    data["blocks"][0]["stages"][0]["latency_ms"], data["dtype"], data["batch"] = "fast", "float8", "1"
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    every = r'batch is "1".*; dtype is "float8".*; blocks\[0\].stages\[0\].latency_ms is "fast"'
    with pytest.raises(UserError, match=every):
        read_schedule(path)
    with pytest.raises(UserError, match=r"bs1.json is not a valid ios-ray schedule"):
        ScheduledModule(ZOO["squeezenet"].build(), tmp_path / "schedules")
    ran = ios_ray_here("run", "--model", "squeezenet", "--schedules", str(path), "--repeat", "1", cwd=tmp_path)
    assert ran.returncode == 1 and ran.stdout == "", ran.stdout
    assert ran.stderr.startswith(f"error: {path} is not a valid ios-ray schedule (") and ran.stderr.count("\n") == 1
    assert path.read_bytes() == before


@pytest.mark.parametrize("name, folder", [
    ("sim:v100", "sim-v100"), ("cuda:1", "cuda-1"), ("cpu", "cpu"), ("mynet:build", "mynet-build"),
    ("Net.graph0", "Net.graph0"), ("Net.forward@17.afdeba2119f3", "Net.forward@17.afdeba2119f3"),
    ("ultralytics:yolo11n-seg", "ultralytics-yolo11n%2Dseg"),
    ("smp:FPN/resnet34", "smp-FPN%2Fresnet34"), ("..", "%2E."), ("a:-b c", "a-%2Db%20c"),
])
def test_folder_names_have_no_colon_and_read_back(name: str, folder: str) -> None:
    assert folder_name(name) == folder
    assert unquote(folder.replace("-", ":")) == name


def test_schedules_go_to_folders_without_colons_and_old_folders_still_read(tmp_path: Path,
                                                                           squeezenet_schedule: Schedule) -> None:
    path = schedule_path(tmp_path, "tests.user_models:wide", "sim:v100", 8, "float16", "channels_last")
    assert path == tmp_path / "tests.user_models-wide" / "sim-v100" / "bs8-float16-channels_last.json"
    old = tmp_path / "squeezenet" / "sim:v100" / "bs8.json"  # written before folders were spelt without colons
    save_schedule(squeezenet_schedule, old)
    save_schedule(squeezenet_schedule, schedule_path(tmp_path, "squeezenet", "sim:v100", 8))
    assert sorted(read_schedules(tmp_path)) == sorted(str(p) for p in (old, tmp_path / "squeezenet" / "sim-v100" /
                                                                        "bs8.json"))


#: Version-1 files written by hand as ios-ray wrote them: as version 1 was first written, and as it was last written
#: (every field version 2 names, the version still 1).
VERSION_1 = Path(__file__).parent / "data"


def _tiny_v2(**fields: object) -> Schedule:
    """The schedule both version-1 files hold, as version 2 reads it (``fields``: what the last one adds)."""
    blocks = (BlockSchedule(0, (Stage("concurrent", (("conv1",),)), Stage("concurrent", (("conv2",), ("conv3",)))),
                            (0.2, 0.3)),
              BlockSchedule(1, (Stage("merge", (("conv4",), ("conv5",))),), (0.25,)))
    return Schedule("tiny", "5d41402abc4b2a76", "cpu", 1, blocks, device_fingerprint="cpu-8c1f",
                    device_info={"cpu": "x86_64"}, params={"r": 3, "s": 8, "strategies": ["concurrent", "merge"]},
                    **fields)  # type: ignore[arg-type]


def test_a_version_1_file_reads_as_its_version_2_equivalent(tmp_path: Path) -> None:
    first = read_schedule(VERSION_1 / "schedule_v1_first.json")
    assert first == _tiny_v2()
    assert (first.input_shape, first.memory_format, first.kernels, first.end_to_end, first.memory) == (
        None, "contiguous", "eager", None, None)  # what version 1 meant where it said nothing
    paired = RatioInterval(0.88, 0.85, 0.92, 0.999, 12)
    check = EndToEnd(12, 0.7, 0.8, 0.75, 0.85, paired, (CandidateRun("dp", 0.7, 12, 0.75, None, paired),
                                                        CandidateRun("sequential", 0.8, 12, 0.85)), "dp")
    last = _tiny_v2(input_shape=(3, 16, 16), memory_format="channels_last", kernels="fused", end_to_end=check,
                    memory=PeakMemory(3_000_000, 2_000_000))
    assert read_schedule(VERSION_1 / "schedule_v1_last.json") == last
    for schedule in (first, last):  # written again, it is a version-2 file holding the same schedule
        save_schedule(schedule, tmp_path / "again.json")
        assert json.loads((tmp_path / "again.json").read_text())["version"] == SCHEDULE_VERSION == 2
        assert read_schedule(tmp_path / "again.json") == schedule


@pytest.mark.parametrize("version", [0, 3, "2", None])
def test_a_file_of_a_version_this_ios_ray_does_not_know_is_refused_in_one_sentence(tmp_path: Path,
                                                                                  version: object) -> None:
    data = json.loads((VERSION_1 / "schedule_v1_last.json").read_text()) | {"version": version}
    (tmp_path / "bs1.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match=f"schedule format version {re.escape(json.dumps(version))}, and this "
                                        "ios-ray reads versions 1 to 2") as refused:
        read_schedule(tmp_path / "bs1.json")
    assert "\n" not in str(refused.value) and str(refused.value).count("; ") == 1


def test_a_candidate_ratio_without_the_checks_confidence_is_refused_in_one_sentence(tmp_path: Path) -> None:
    data = json.loads((VERSION_1 / "schedule_v1_last.json").read_text())
    del data["end_to_end"]["confidence"], data["end_to_end"]["ratio"]
    del data["end_to_end"]["ratio_low"], data["end_to_end"]["ratio_high"]
    (tmp_path / "bs1.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"\(end_to_end.confidence is missing \(a check with a ratio has one\)\); "):
        read_schedule(tmp_path / "bs1.json")


@pytest.mark.parametrize("command, search", [
    (["run", "--model", "squeezenet"],
     "(ios-ray search --model squeezenet --devices cpu --batches 1 writes them there)"),
    (["bench", "--model", "squeezenet", "--batches", "1,8", "--dtype", "bfloat16", "--schedules", "mine"],
     "(ios-ray search --model squeezenet --devices cpu --batches 1,8 --dtype bfloat16 --out mine writes them there)"),
    (["evaluate"], "(ios-ray search --model MODEL --devices DEVICE --batches BATCHES writes them there)"),
    (["run", "--model", "squeezenet", "--schedules", "bs1.json"],
     "no schedule file at bs1.json: pass one a search wrote (ios-ray search --model squeezenet --devices cpu "
     "--batches 1 writes them under schedules)"),
])
def test_commands_before_any_search_say_which_search_writes_their_schedules(tmp_path: Path, command: list[str],
                                                                           search: str) -> None:
    ran = ios_ray_here(*command, cwd=tmp_path)
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr.startswith("error: no schedule") and search in ran.stderr, ran.stderr
    assert ran.stderr.endswith("the --out folder of a search.\n") and ran.stderr.count("\n") == 1
