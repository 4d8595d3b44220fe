"""bench/gpu_check.py without a GPU: it refuses in one sentence, sizes searches and judges targets as documented, and
its whole pipeline runs on the CPU with a small model and tiny repeats (``--device cpu --quick``), so that a crash in
it shows up here rather than on the GPU host."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
import torch
from typer.testing import CliRunner

import bench.gpu_check as gpu_check_module
from bench import gpu_steps
from bench.gpu_check import SAFETY, Completed, choose_protocol, deduplicated, run_command
from bench.gpu_report import Target, markdown, targets
from ios_ray.vocabulary import KERNEL_NAMES, kernel_named
from ios_ray.cli import app
from ios_ray.profiler.timing import gpu_protocol
from ios_ray.scheduler.correction import plausible

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"


def gpu_check(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the script as a user would, from the repository root."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there to check")
def test_without_a_gpu_it_says_so_in_one_sentence(tmp_path: Path) -> None:
    done = gpu_check("--out", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"gpu_check: torch {torch.__version__} sees no CUDA GPU on this machine")
    assert line.endswith(".") and line.count(". ") == 0
    assert not (tmp_path / "out").exists()


def test_a_cpu_run_needs_quick(tmp_path: Path) -> None:
    done = gpu_check("--out", str(tmp_path / "out"), "--device", "cpu")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gpu_check: a run on the CPU only exercises the pipeline and validates nothing, so it needs --quick."]


def test_a_search_gets_the_most_repeats_that_fit_its_budget() -> None:
    # 1,000 stages at 5 ms fixed + 1 ms per replay: warmup 2 + repeat r replays take 1000 * (5 + 2 + r) ms
    assert choose_protocol(1000, 0.005, 0.001, 1000 * 0.017 * SAFETY, 2, 3, 10) == (2, 10)
    assert choose_protocol(1000, 0.005, 0.001, 1000 * 0.0125 * SAFETY, 2, 3, 10) == (2, 5)
    assert choose_protocol(1000, 0.005, 0.001, 1.0, 2, 3, 10) == (2, 3)  # nothing fits: the least


def test_a_command_past_its_time_limit_is_interrupted_and_keeps_its_output() -> None:
    child = ("import os, sys, time; print(os.environ['PYTHONPATH'].split(os.pathsep)[0], flush=True)\n"
             "try:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('stored', flush=True); sys.exit(3)")
    done = run_command([sys.executable, "-c", child], 1.0, ROOT)
    assert done.timed_out and done.returncode == 3 and done.wall_s >= 1.0  # stopped by the limit: code 3
    assert done.stdout.splitlines() == [str(ROOT), "stored"]  # this tree first; Ctrl-C lets the child finish
    stamps = [float(re.match(r"\[\s*([\d.]+) s\] ", line).group(1)) for line in done.stamped.splitlines()]
    assert stamps[0] < 1.0 <= stamps[1]  # each line with when it came: 'stored' after the Ctrl-C at the limit


#: How a machine's speed moved over the rounds of a fake bench: every variant alike in a round.
DRIFT = (1.0, 1.1, 0.95, 1.05, 0.9, 1.2)


def bench_rows(ios: float, seq: float, eager: float, compiled: float | None, predicted: float) -> dict:
    def row(name: str, ms: float, predicted_ms: float | None) -> dict:
        return {"name": name, "median_ms": ms, "predicted_ms": predicted_ms, "samples_ms": [ms * d for d in DRIFT]}

    rows = [row("eager", eager, None), row("sequential + graph", seq, seq), row("IOS + graph", ios, predicted)]
    if compiled is not None:
        rows.append(row("torch.compile reduce-overhead", compiled, None))
    return {"rows": rows, "notes": []}


def test_targets_are_judged_from_the_figures_and_missing_ones_are_said_so() -> None:
    report = {"device": "cuda", "quick": False, "batches": [1, 32], "wall_s": 400.0,
              "tests": {"tests": 20, "failures": 0, "errors": 0, "skipped": 0},
              "bench": {"1": bench_rows(ios=1.0, seq=1.3, eager=1.6, compiled=0.9, predicted=1.05)},
              "searches": {"cuda bs1": {"kept_over_predicted": 1.2, "sequential_over_dp": 1.25}}}
    found = {t.what: t for t in targets(report)}
    results = {what: t.result for what, t in found.items()}
    assert results["IOS + graph vs sequential + graph, batch 1"] == "PASS"  # 1.3 >= 1.2
    assert results["IOS + graph vs eager, batch 1"] == "PASS"  # 1.6 >= 1.5
    assert results["IOS + graph vs torch.compile reduce-overhead, batch 1"] == "MISS"  # 0.9 < 1.0
    assert found["IOS + graph vs sequential + graph, batch 1"].shown == "1.300 (1.30-1.30)"
    # a speedup whose median clears its target but whose interval does not is missed
    noisy = bench_rows(ios=1.0, seq=1.3, eager=1.6, compiled=0.9, predicted=1.05)
    noisy["rows"][2]["samples_ms"] = [1.0, 1.0, 1.0, 1.0, 1.0, 1.2]
    noisy["rows"][1]["samples_ms"] = [1.3] * 6
    report["bench"]["1"] = noisy
    assert {t.what: t.result for t in targets(report)}["IOS + graph vs sequential + graph, batch 1"] == "MISS"
    report["bench"]["1"] = bench_rows(ios=1.0, seq=1.3, eager=1.6, compiled=0.9, predicted=1.05)
    assert found["IOS + graph: measured / predicted, batch 1"].figure == pytest.approx(0.952)
    assert results["IOS + graph: measured / predicted, batch 1"] == "PASS"
    assert results["search's check, batch 1: kept schedule measured / predicted"] == "MISS"  # 1.2 > 1.1
    assert results["IOS + graph vs sequential + graph, batch 32"] == "no figure"  # that bench did not run
    assert results["GPU tests failed, errored or skipped"] == "PASS" and results["whole check, s"] == "PASS"
    assert found["search's check, batch 1: sequential / DP schedule, both in a graph"].result == "-"
    report["quick"] = True
    assert {t.result for t in targets(report)} == {"n/a", "-"}


def test_the_compile_and_layout_targets_read_their_own_runs_and_the_kernels_the_search_chose() -> None:
    def fused(bench: dict) -> dict:
        for row in bench["rows"]:
            row.update(kernels="fused", name=row["name"].replace("IOS", "IOS fused").replace("sequential",
                                                                                           "sequential fused"))
        return bench

    profile = {"DP schedule": {"transposes_per_forward": 0.0}, "sequential schedule": {"transposes_per_forward": 0.0}}
    report = {"device": "cuda", "quick": False, "batches": [1, 32], "wall_s": 400.0, "tests": None,
              "bench": {"1": fused(bench_rows(ios=1.0, seq=1.3, eager=1.6, compiled=None, predicted=1.0)),
                        "1 torch.compile": fused(bench_rows(ios=1.0, seq=1.3, eager=1.6, compiled=1.4, predicted=1.0)),
                        "1 float16 channels_last torch.compile": fused(
                            bench_rows(ios=1.0, seq=1.2, eager=1.6, compiled=1.2, predicted=1.0)),
                        "32 torch.compile": bench_rows(ios=1.0, seq=1.1, eager=1.2, compiled=1.05, predicted=1.0),
                        "randwire 1 torch.compile": bench_rows(ios=1.0, seq=1.5, eager=2, compiled=0.8,
                                                               predicted=1.0)},
              "profile": {"cuda bs1": profile, "cuda bs1 float16 channels_last": {
                  **profile, "DP schedule": {"transposes_per_forward": 12.0}}}}
    found = {t.what: t for t in targets(report)}
    assert found["IOS + graph vs sequential + graph, batch 1"].result == "PASS"  # found as "IOS fused + graph"
    assert found["IOS + graph vs torch.compile reduce-overhead, batch 1"].figure == pytest.approx(1.4)
    assert found["IOS + graph vs torch.compile reduce-overhead, batch 1"].result == "PASS"  # 1.4 >= 1.3
    assert found["IOS + graph vs torch.compile reduce-overhead, batch 1 float16 channels_last"].result == "MISS"
    assert found["IOS + graph vs torch.compile reduce-overhead, batch 32"].result == "PASS"  # 1.05 >= 1.0
    assert found["cuDNN layout transposes per forward, DP schedule, batch 1"].result == "PASS"
    assert found["cuDNN layout transposes per forward, DP schedule, batch 1 float16 channels_last"].result == "MISS"
    assert found["randwire 1: IOS + graph vs torch.compile reduce-overhead"].figure == pytest.approx(0.8)
    assert found["randwire 1: IOS + graph vs torch.compile reduce-overhead"].result == "-"  # shown, no target


def test_the_searches_are_judged_for_their_cost_their_corrected_prediction_and_against_greedy() -> None:
    def with_greedy(bench: dict, greedy: float) -> dict:
        row = dict(bench["rows"][1], name="greedy + graph", samples_ms=[greedy * d for d in DRIFT])
        return {**bench, "rows": [*bench["rows"], row]}

    searches = {"cuda bs1": {"wall_s": 8.5}, "cuda bs1 again": {"kept_over_predicted": 1.03, "new_stages": 0},
                "cuda bs1 float16 channels_last again": {"kept_over_predicted": 1.08, "new_stages": 0},
                "randwire cuda bs1": {"wall_s": 41.0}}
    report = {"device": "cuda", "quick": False, "batches": [1, 32], "wall_s": 400.0, "tests": None,
              "bench": {"1": with_greedy(bench_rows(ios=1.0, seq=1.3, eager=1.6, compiled=None, predicted=1.0), 0.9)},
              "searches": searches}
    results = {t.what: t.result for t in targets(report)}
    assert results["search at batch 1 on a fresh store, check included, s"] == "PASS"  # 8.5 <= 10
    assert results["search again, batch 1: kept schedule measured / predicted (corrected)"] == "PASS"
    assert results["search again, batch 1 float16 channels_last: kept schedule measured / predicted (corrected)"] \
        == "MISS"  # 1.08 > 1.05
    assert results["search again at batch 1: new stages the corrected costs asked for (none twice)"] == "-"
    assert results["IOS + graph slower than greedy + graph beyond noise, batch 1 (1: yes)"] == "MISS"  # 0.9 < 1.0
    assert results["randwire cuda bs1: search within the check, s"] == "PASS"
    report["bench"]["1"] = with_greedy(bench_rows(ios=1.0, seq=1.3, eager=1.6, compiled=None, predicted=1.0), 1.1)
    assert {t.what: t.result for t in targets(report)}[
        "IOS + graph slower than greedy + graph beyond noise, batch 1 (1: yes)"] == "PASS"


def test_the_report_shows_the_gpu_and_the_copies_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                            total_memory=80 << 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: props)
    copies = {"stages": 2, "ms_sum": {"1": 0.4, "2": 0.3, "4": 0.25, "8": 0.2, "eager": 1.0}}
    report = {"kind": "GPU validation", "device": "cuda", "model": "inception_v3", "batches": [1, 32], "quick": False,
              "wall_s": 1.0, "started": "now", "command": "gpu_check", "steps": [], "tests": None, "searches": {},
              "bench": {}, "profile": None, "environment": gpu_steps.environment("cuda"),
              "calibration": {"cuda": {"sample": 24, "stages": 3711, "batches": {
                  "1": {"fixed_s": 0.01, "per_replay_s": 0.0002, "copies": copies}}}}}
    text = markdown(report)
    assert "| GPU | NVIDIA H100 80GB HBM3 (compute capability 9.0, 132 SMs, 80.0 GiB) |" in text
    assert f"| stage timing protocol | {gpu_protocol()} |" in text
    assert "| cuda bs1 | 24 of 3711 | 10.00 | 0.200 | 0.2000 / 0.1500 / 0.1250 / 0.1000 / 0.5000 |" in text


def test_the_report_names_the_candidates_a_search_left_out_for_its_time_and_what_it_compiled_ahead() -> None:
    search = {"warmup": 1, "repeat": 5, "stages": 1561, "uncaptured": 0, "wall_s": 95.0, "phases": None,
              "dp_predicted_ms": 0.7, "sequential_predicted_ms": 0.9, "dp_ms": 0.6, "sequential_ms": 0.8,
              "kept": "dp", "decision": "kept IOS: faster beyond noise, 0.74-0.77", "kept_over_predicted": 0.86}
    report = {"kind": "GPU validation", "device": "cuda", "model": "inception_v3", "batches": [1, 32],
              "quick": False, "wall_s": 1.0, "started": "now", "command": "gpu_check", "steps": [], "tests": None,
              "bench": {}, "profile": None, "environment": None,
              "searches": {"cuda bs1": {**search, "left_out": ["dp-fewer-groups", "greedy"]}, "cuda bs32": search}}
    rows = [line for line in markdown(report).splitlines() if line.startswith("| cuda bs")]
    assert "| kept IOS: faster beyond noise, 0.74-0.77; left out for time: dp-fewer-groups, greedy |" in rows[0]
    assert "left out" not in rows[1]
    compiled = "72 regions compiled ahead in 9.1 s, 58 by 8 workers"
    report["searches"]["cuda bs32"] = {**search, "compiled": compiled}
    rows = [line for line in markdown(report).splitlines() if line.startswith("| cuda bs")]
    assert f"| kept IOS: faster beyond noise, 0.74-0.77; {compiled} |" in rows[1]


def test_a_target_reads_its_range() -> None:
    assert Target("x", 1.0, 0.9, 1.1).goal == "0.9 to 1.1" and Target("x", 1.2, 0.9, 1.1).result == "MISS"
    assert Target("x", 480.5, high=480).result == "MISS" and Target("x", None, 1.2).result == "no figure"


def test_torch_compile_is_benched_in_a_step_of_its_own_and_judged_in_that_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiling a large model can take minutes: the bench without torch.compile keeps its figures where the run with
    it does not finish, and the speedup over reduce-overhead is taken within the run that timed both."""
    setup = gpu_check_module.Setup("cuda", "inception_v3", False, tmp_path / "out", tmp_path / "work", 465.0)
    check = gpu_check_module.Check(setup, "test")
    check.report["searches"].update({"cuda bs1": {}, "cuda bs32": {}})
    ran: list[list[str]] = []
    rows = bench_rows(ios=1.0, seq=1.3, eager=1.6, compiled=None, predicted=1.0)["rows"]
    for row in rows:
        row.update(speedup_vs_sequential=1.0, speedup=1.0)

    def python(args: list[str], timeout_s: float) -> Completed:
        ran.append(args[args.index("--json") + 1:])
        if "--no-compile" not in args:
            raise gpu_check_module.StepFailed(f"stopped at its time limit of {timeout_s:.0f} s")
        return Completed(0, json.dumps({"rows": rows, "notes": []}), "", 1.0, False)

    monkeypatch.setattr(check, "python", python)
    assert [step.name for step in gpu_check_module.steps(setup)][2:5] == [
        "search cuda bs1", "bench cuda bs1", "bench cuda bs1 torch.compile"]
    gpu_check_module.bench_step(check, 60.0, 1)
    with pytest.raises(gpu_check_module.StepFailed, match="time limit of 130 s"):
        gpu_check_module.bench_step(check, 130.0, 1, compiled=True)
    assert ran == [["--no-compile"], ["--compile-mode", "reduce-overhead"]]
    assert list(check.report["bench"]) == ["1"]
    check.report.update(device="cuda", quick=False, batches=[1, 32], wall_s=1.0, tests=None)
    results = {t.what: t.result for t in targets(check.report)}
    assert results["IOS + graph vs sequential + graph, batch 1"] == "PASS"
    assert results["IOS + graph vs torch.compile reduce-overhead, batch 1"] == "no figure"
    check.report["bench"]["1 torch.compile"] = bench_rows(ios=1.1, seq=1.3, eager=1.6, compiled=1.2, predicted=1.0)
    assert {t.what: t.figure for t in targets(check.report)}[
        "IOS + graph vs torch.compile reduce-overhead, batch 1"] == pytest.approx(1.2 / 1.1, abs=1e-3)


def test_searches_are_sized_for_the_stages_a_lazy_search_measures() -> None:
    from ios_ray.frontend import import_model
    from ios_ray.scheduler import LazySpace, SearchParams

    space = LazySpace.build(import_model("inception_v3").graph, SearchParams())
    assert len(space.seeds) < gpu_steps.lazy_stages(space) < len(space.planned) / 2  # 952 < 1333 < 3711 / 2
    small = LazySpace.build(import_model("squeezenet").graph, SearchParams())
    assert gpu_steps.lazy_stages(small) == len(small.planned)  # nearly every stage a seed: all of them, no more
    setup = gpu_check_module.Setup("cuda", "inception_v3", False, Path("out"), Path("work"), 465.0)
    check = gpu_check_module.Check.__new__(gpu_check_module.Check)
    check.setup = setup
    check.report = {"calibration": {"cuda": {"stages": 3711, "lazy_stages": 1333, "batches": {
        "1": {"fixed_s": 0.01, "per_replay_s": 0.0001}}}}}
    assert gpu_check_module.search_protocol(check, "cuda", "cuda", 1, 45.0) == (1, 10)
    del check.report["calibration"]["cuda"]["lazy_stages"]  # sized for every planned stage: the least repeat
    assert gpu_check_module.search_protocol(check, "cuda", "cuda", 1, 45.0) == (1, 3)


def test_a_short_budget_leaves_out_the_last_steps_never_the_first(tmp_path: Path) -> None:
    setup = gpu_check_module.Setup("cuda", "inception_v3", False, tmp_path / "out", tmp_path / "work", 320.0,
                                   "randwire")
    steps = gpu_check_module.steps(setup)
    kept = gpu_check_module.planned(steps, setup.budget_s)
    names = [step.name for step in kept]
    assert names[:4] == ["environment", "calibrate cuda", "search cuda bs1", "bench cuda bs1"]
    assert names == [step.name for step in steps if not step.extra][:len(names)]  # a prefix, in order
    assert sum(step.need_s for step in kept) + gpu_check_module.STOP_GRACE_S <= 320
    assert len(kept) < len([step for step in steps if not step.extra])  # the last ones left out
    check = gpu_check_module.Check(setup, "test")
    limits: dict[str, float] = {}
    for step in steps:  # nothing runs: each step only records the time it was given
        object.__setattr__(step, "run", lambda _, timeout, name=step.name: str(limits.setdefault(name, timeout)))
    check.run_all(steps)
    assert limits["environment"] >= 10 and limits["search cuda bs1"] >= 120  # each keeps its least time, first too
    statuses = {entry["name"]: entry["status"] for entry in check.report["steps"]}
    assert statuses["environment"] == statuses["search cuda bs1"] == "ok"
    assert statuses[f"bench cuda bs32 {gpu_check_module.COMPILED}"] == "skipped"


def test_only_runs_the_steps_named_after_the_environment_and_their_calibration(tmp_path: Path) -> None:
    setup = gpu_check_module.Setup("cuda", "inception_v3", False, tmp_path / "out", tmp_path / "work", 300.0,
                                   "randwire")
    steps = gpu_check_module.steps(setup)
    compiled = gpu_check_module.COMPILED
    chosen = gpu_check_module.only(steps, ["bs32"])
    assert [step.name for step in chosen] == ["environment", "calibrate cuda", "search cuda bs32", "bench cuda bs32",
                                              f"bench cuda bs32 {compiled}"]
    assert gpu_check_module.planned(chosen, setup.budget_s) == chosen  # the time a first run left is theirs
    second = gpu_check_module.only(steps, ["randwire", "host cpu"])
    assert [step.name for step in second] == ["environment", "calibrate cuda", "search randwire cuda bs1",
                                              f"bench randwire cuda bs1 {compiled}", "calibrate host cpu",
                                              "search host cpu bs1"]
    assert not any(step.extra for step in second)  # extra in a whole run, planned when asked for


def test_extra_steps_run_on_time_left_over_and_keep_none_from_the_steps_before(tmp_path: Path) -> None:
    setup = gpu_check_module.Setup("cpu", "m", True, tmp_path / "out", tmp_path / "work", 100.0)
    check = gpu_check_module.Check(setup, "test")
    limits: dict[str, float] = {}

    def record(name: str) -> Callable[[gpu_check_module.Check, float], str]:
        return lambda _, timeout: str(limits.setdefault(name, timeout))

    Step = gpu_check_module.Step
    assert check.run_all([Step("first", 1000, 1, record("first")), Step("kept", 1000, 20, record("kept")),
                          Step("extra", 1000, 50, record("extra"), extra=True)])
    grace = gpu_check_module.STOP_GRACE_S
    assert 100 - grace - 20 - 1 < limits["first"] <= 100 - grace - 20  # keeps the next step's 20 s, not the extra's
    assert [s["status"] for s in check.report["steps"]] == ["ok", "ok", "ok"]
    # an extra step that finds no time left over is skipped, and the run still counts as complete; a kept one not
    check = gpu_check_module.Check(setup, "test")
    assert check.run_all([Step("first", 1000, 1, record("first")), Step("extra", 1000, 500, record("x"), extra=True)])
    assert [s["status"] for s in check.report["steps"]] == ["ok", "skipped"]
    assert not gpu_check_module.Check(setup, "test").run_all([Step("kept", 1000, 500, record("y"))])


def run_in_process(args: list[str], timeout_s: float, cwd: Path) -> Completed:
    """gpu_check's commands run in this process instead of a child (the session's Ray, torch already imported):
    ``python -m ios_ray``, ``python -m pytest`` and ``python bench/gpu_steps.py``, with their own arguments."""
    assert args[0] == sys.executable and cwd == ROOT
    stdout, stderr = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        if args[1:3] == ["-m", "ios_ray"]:
            result = CliRunner().invoke(app, args[3:], prog_name="ios-ray")
            print(result.stdout, end="")
            print(result.stderr, end="", file=sys.stderr)
            code = result.exit_code
        elif args[1:3] == ["-m", "pytest"]:
            code = int(pytest.main(args[3:]))
        else:
            assert Path(args[1]) == ROOT / "bench" / "gpu_steps.py", args
            code = gpu_steps.main(args[2:])
    return Completed(code, stdout.getvalue(), stderr.getvalue(), time.monotonic() - started, False)


@pytest.mark.slow
def test_the_whole_pipeline_runs_on_the_cpu_with_tiny_repeats(
    tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_check_module, "run_command", run_in_process)
    out = tmp_path / "out"
    code = gpu_check_module.main(["--out", str(out), "--work", str(tmp_path / "work"), "--device", "cpu", "--model",
                                  "tests.api_model:build", "--quick"])
    assert code == 0, (out / "log.txt").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["latency.duckdb", "log.txt", "profile.txt", "report.json",
                                                     "report.md"]
    report = json.loads((out / "report.json").read_text())
    assert [s["status"] for s in report["steps"]] == ["ok"] * 16, report["steps"]
    assert report["environment"]["cpu"]["cores"] >= 1 and "gpu" not in report["environment"]  # no GPU figure
    assert set(report["searches"]) == {"cpu bs1", "cpu bs1 again", "cpu bs2", "host cpu bs1",
                                       "cpu bs1 float16 channels_last", "cpu bs1 float16 channels_last again"}
    for first in ("cpu bs1", "cpu bs1 float16 channels_last"):
        again = report["searches"][f"{first} again"]
        # priced as the first search was, the search again measures nothing; priced by a fitted correction, the lazy
        # search may ask for stages the corrected costs newly need (a burst of load during the first check fits a
        # steep one: CI, 2026-11-27, one new stage after a check that ran a 0.3-ms model in 28 ms), and so may it
        # where it measured again a unit alone stored as an outlier, whose new latency moves the bounds (CI,
        # 2026-11-29: float16, one outlier measured again, then one new stage); the file kept is the search again's
        remeasured = report["schedules"][first]["params"]["measure"]["remeasured"]
        assert again["new_stages"] == 0 or again["corrected"] or remeasured > 0
        # fitted from the first search's check, unless a burst of load put every run beyond belief (the fit leaves
        # those out, scheduler.correction.plausible): then neither the DP's nor sequential's run may be plausible
        ran = report["searches"][first]
        assert again["corrected"] or not any(plausible(ran[f"{name}_predicted_ms"], ran[f"{name}_ms"])
                                             for name in ("dp", "sequential"))
    for search in report["searches"].values():
        assert search["stages"] > 0 and search["kept"] in ("dp", "sequential") and search["dp_ms"] > 0
        assert search["left_out"] == []  # every candidate's first calls took milliseconds
        assert (search["compiled"] is not None) == (search["kernels"] == "inductor")  # its regions, before the rounds
        assert (search["warmup"], search["repeat"]) == (0, 1) and search["kernels"] in KERNEL_NAMES
        phases = search["phases"]  # where the search's own time went: its phases and the rest add up to its wall
        assert {"start-up", "import", "DP", "check"} <= phases.keys()
        assert sum(s for name, s in phases.items() if name != "wall") == pytest.approx(phases["wall"], abs=0.1)
        assert 0 < phases["wall"] <= search["wall_s"] + 0.05  # within the command's (rounded to 0.1 s)
    wall = report["searches"]["cpu bs1"]["phases"]["wall"]
    assert re.search(rf"\| cpu bs1 \| 0 / 1 \| \d+ \| \d+ \| [\d.]+ \| {wall:.1f}: ", (out / "report.md").read_text())
    for batch in ("1", "2", "1 float16 channels_last"):
        kernels = report["bench"][batch]["rows"][0]["kernels"]
        assert [row["name"] for row in report["bench"][batch]["rows"]] == [
            "eager", *(kernel_named(name, kernels) for name in ("sequential", "greedy", "IOS"))]
    [half] = (tmp_path / "work" / "float16-channels_last-schedules").rglob("*.json")
    assert half.name == "bs1-float16-channels_last.json"
    assert (json.loads(half.read_text())["dtype"], json.loads(half.read_text())["memory_format"]) == (
        "float16", "channels_last")
    assert set(report["profile"]) == {"cpu bs1", "cpu bs1 float16 channels_last", "cpu bs1 inductor"}
    assert all(set(found) == {"DP schedule", "sequential schedule"} for found in report["profile"].values())
    inductor = report["profile"]["cpu bs1 inductor"].values()
    assert all(p["kernels"] == "inductor" and p["first_call_s"] > 0 for p in inductor)
    assert {t["result"] for t in report["targets"]} <= {"n/a", "-"}
    text = (out / "report.md").read_text()
    assert "not a validation" in text and "no target applies" in text
    assert text == markdown(report)
    assert "== DP schedule" in (out / "profile.txt").read_text()


def test_a_failing_commands_log_keeps_its_error_under_a_flood_of_one_warning() -> None:
    """H100, 2026-11-26: a bench's stderr was a hundred copies of one CUDA warning, and the log kept only those."""
    flood = "".join(f"[W1126 23:42:24.8207{i:05d} CUDAEvent.h:57] Warning: CUDA warning: launch failure\n"
                    for i in range(300))
    kept = deduplicated("Traceback (most recent call last):\nRuntimeError: the error\n" + flood)
    assert kept.splitlines() == ["Traceback (most recent call last):", "RuntimeError: the error",
                                 "[CUDAEvent.h:57] Warning: CUDA warning: launch failure",
                                 "(299 repeated lines left out)"]
