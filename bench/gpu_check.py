"""Validate ios-ray on a GPU host with one command, offline, in under 8 minutes, and write the report.

    source .gpukit/install.sh                                 # on the GPU host, from the repository root
    PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out $OUT/gpu

Steps, in order, each a fresh process with a time limit (a step that fails or runs out of time costs only its own
figures; the report is rewritten after every step). The steps whose least times fit ``--budget-s`` in order are
planned, each keeping the least time of the planned steps after it; a short budget leaves out the last ones, never
the first; extra steps run only on time the others left over:

1. environment: the GPU, driver, torch/CUDA/cuDNN versions, CPU and date (``bench/gpu_steps.py env``);
2. calibration: what measuring one planned stage costs on the GPU at both batch sizes (``gpu_steps.py
   calibrate``); each search's warmup and repeat are then sized to fit its time limit;
3. at batch 1: ``ios-ray search --devices cuda`` on a fresh store (its kernels chosen by timing, its stages timed
   in CUDA graphs, its check running the DP's schedule, its alternatives, greedy and sequential), ``ios-ray bench
   --device cuda --json --no-compile`` (every variant but torch.compile), the same bench again with
   ``torch.compile(mode="reduce-overhead")`` beside the others (its own step, since compiling a large model can take
   minutes), and a PyTorch profiler summary of the DP's and the sequential schedule in a graph (``profile.txt``:
   kernels and cuDNN's layout transposes per forward);
4. the GPU tests (``pytest -m gpu``): all must pass, none be skipped;
5. the same at batch 1 in float16 and channels_last (what GPU serving mostly runs in), on a store of its own: the
   search, its bench with reduce-overhead, and its profile;
6. each batch-1 search again on its store (nothing measured twice; its DP priced by the correction the first check
   fitted, so that its prediction of what deploys can be judged);
7. at batch 32: the search, on the main store, the bench, then the bench with reduce-overhead (its own step);
8. extra, on time left over: the profile at batch 1 again with ``inductor`` kernels (the DP's and the sequential
   schedule with Inductor's regions in the CUDA graph, whatever kernels the search chose; the seconds their regions
   took to compile); a second model (``--second-model``, RandWire by default) searched and benched at batch 1; then
   calibration and ``ios-ray search --devices cpu`` at batch 1 on this host's CPU, on a store of its own.

Writes ``DIR/report.md`` and ``DIR/report.json`` (device, versions, date, every figure and its target; targets in
bench/gpu_report.py), ``DIR/profile.txt``, ``DIR/log.txt`` (each command and the end of its output) and
``DIR/latency.duckdb`` (every GPU stage measured). Working files go to ``--work`` (a temporary folder by default),
outside DIR. Exit code 0 when every planned step ran to its end (targets may still be missed: the report says which;
an extra step that found no time left over does not count), 1 when some step did not, 2 when there is nothing to
check.

``--only TEXT`` runs only the steps whose names hold TEXT, after the environment and the calibration they need, all
planned: ``--only bs32`` or ``--only randwire`` on the time a first run left.

``--device cpu --model squeezenet --quick`` runs the same pipeline on this machine's CPU with tiny repeats (batches
1 and 2, no torch.compile, each step's least time a quarter of a GPU's, so that every step is planned) so that a
crash in this script shows up here, not on the GPU host; its report says it is no validation and holds no GPU figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's ios_ray and bench, however the script is started
from bench.gpu_report import COMPILED, markdown, targets, variant_names  # noqa: E402
STEPS_SCRIPT = Path(__file__).resolve().with_name("gpu_steps.py")
#: Seconds from start by which the report is final (8 minutes, less a margin for writing it).
DEFAULT_BUDGET_S = 465.0
#: What a search costs besides measuring stages: Ray and the actor starting, importing and planning, the DP, the check.
SEARCH_OVERHEAD_S = {"cuda": 30.0, "cpu": 20.0}
#: Measured cost over the calibrated estimate that a search's protocol is sized for.
SAFETY = 1.3
#: Per device: (warmup, least repeat, most repeat) for a search's stages; --quick: the least there is.
PROTOCOL_BOUNDS = {"cuda": (1, 3, 10), "cpu": (1, 3, 10)}
QUICK_PROTOCOL = (0, 1, 1)
#: With --quick, each step's least time as a share of the GPU check's.
QUICK_NEED_SHARE = 0.25
#: The GPU test files, for --quick (a full run collects every test file of the suite).
QUICK_TEST_FILES = ("tests/test_stage_capture_cuda.py", "tests/test_bench_cuda.py")
KEEP_STORE_BYTES = 15 << 20
#: The dtype and memory format of the half-precision steps: what GPU serving mostly runs in.
HALF_NHWC = ("float16", "channels_last")
#: The second model a GPU check searches and benches on time left over: many branches, many candidate stages.
DEFAULT_SECOND_MODEL = "randwire"
#: Seconds a step stopped at its time limit (Ctrl-C) has to end before its process group is killed; a step's limit
#: leaves this much of the budget free, so that a step stopped at its limit still ends within the budget.
STOP_GRACE_S = 15.0


class StepFailed(Exception):
    """A step that did not produce its figures; the message is the report's note."""


class StepSkipped(Exception):
    """A step that cannot run because an earlier one did not finish."""


@dataclass(frozen=True)
class Setup:
    """What to check and where: the device, the model (and the second one, checked on time left over), tiny repeats
    or not, the report and working folders."""

    device: str
    model: str
    quick: bool
    out: Path
    work: Path
    budget_s: float
    second_model: str | None = None

    @property
    def batches(self) -> tuple[int, int]:
        """The small and the large batch size."""
        return (1, 2) if self.quick else (1, 32)

    @property
    def schedules(self) -> Path:
        """The searches' schedule folder."""
        return self.work / "schedules"

    @property
    def store(self) -> Path:
        """The store of the searches on the device."""
        return self.work / "latency.duckdb"

    def search_of(
        self, batch: int, dtype: str = "float32", memory_format: str = "contiguous", model: str | None = None,
    ) -> tuple[str, Path, Path]:
        """The report's key of the search of ``model`` (default: the check's) on the device at ``batch`` in ``dtype``
        and ``memory_format``, its schedule folder and store (another model's, dtype's or format's are apart, so that
        its figures count its own stages)."""
        from ios_ray.vocabulary import numerics_named

        others = [*([model] if model not in (None, self.model) else []), *numerics_named(dtype, memory_format)]
        if not others:
            return f"{self.device} bs{batch}", self.schedules, self.store
        name = "-".join(other.replace(":", "-") for other in others)
        key = " ".join([*([model] if model not in (None, self.model) else []), f"{self.device} bs{batch}",
                        *numerics_named(dtype, memory_format)])
        return key, self.work / f"{name}-schedules", self.work / f"{name}-latency.duckdb"

    def bench_key(self, batch: int, dtype: str = "float32", memory_format: str = "contiguous",
                  model: str | None = None, compiled: bool = False) -> str:
        """The report's key of a bench: the search's key less the device, and ``torch.compile`` where it ran."""
        search = self.search_of(batch, dtype, memory_format, model)[0]
        return search.replace(f"{self.device} bs", "") + (f" {COMPILED}" if compiled else "")


@dataclass(frozen=True)
class Completed:
    """A finished command: exit code, output, wall time, and whether it was stopped at its time limit."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool
    stamped: str = ""  # stdout with each line's seconds since the start: where a search's time went


@dataclass(frozen=True)
class Step:
    """A step: its name, the longest it may run, the least time worth starting it with, and what it does; an
    ``extra`` step runs only on time the steps before it left over (none is kept for it)."""

    name: str
    cap_s: float
    need_s: float
    run: Callable[["Check", float], str]
    extra: bool = False


class Check:
    """One run of the check: runs the steps in order within the deadline, keeps the report and rewrites it."""

    def __init__(self, setup: Setup, command: str) -> None:
        self.setup = setup
        self.started = time.monotonic()
        self.reserve_s = 0.0
        kind = ("GPU validation" if setup.device == "cuda" and not setup.quick else
                f"pipeline check on {setup.device} with tiny repeats (--quick): not a validation, no target applies")
        self.report: dict[str, Any] = {
            "kind": kind, "device": setup.device, "model": setup.model, "batches": list(setup.batches),
            "quick": setup.quick, "command": command, "started": _now(), "wall_s": 0.0, "environment": None,
            "steps": [], "tests": None, "calibration": {}, "searches": {}, "bench": {}, "profile": {},
            "schedules": {}, "targets": [],
        }
        setup.out.mkdir(parents=True, exist_ok=True)
        setup.work.mkdir(parents=True, exist_ok=True)
        (setup.out / "log.txt").write_text(f"gpu_check {command}\n")
        (setup.out / "profile.txt").unlink(missing_ok=True)  # each profile step appends its tables

    def elapsed(self) -> float:
        """Seconds since the check started."""
        return time.monotonic() - self.started

    def available(self) -> float:
        """Seconds the current step may still use, keeping the later steps' minimum and the grace of a stop."""
        return self.setup.budget_s - self.elapsed() - self.reserve_s - STOP_GRACE_S

    def run_all(self, steps: list[Step]) -> bool:
        """Run the steps in order: those whose least times fit the budget in order (:func:`planned`) keep them, the
        others are left out, extra ones run on time left over; True where every step but the extra ones ran to its
        end (an extra step skipped for want of time left over does not count against that; a step left out does)."""
        kept = planned(steps, self.setup.budget_s)
        for index, step in enumerate(steps):
            self.reserve_s = sum(later.need_s for later in steps[index + 1:] if later in kept)
            if step.extra or step in kept:
                self.run(step)
            else:
                self.skip(step, f"left out: a budget of {self.setup.budget_s:.0f} s keeps the least time of the "
                                f"steps before it (it needs {step.need_s:.0f} s more)")
        self.write()
        return all(entry["status"] == "ok" or (step.extra and entry["status"] == "skipped")
                   for step, entry in zip(steps, self.report["steps"]))

    def skip(self, step: Step, note: str) -> None:
        """Record a step that does not run, and why."""
        self.report["steps"].append({"name": step.name, "status": "skipped", "wall_s": 0.0, "timeout_s": 0.0,
                                     "note": note})
        print(f"[{self.elapsed():5.0f} s] {step.name}: skipped; {note}", flush=True)

    def run(self, step: Step) -> None:
        """Run one step within its time limit; record its status and note, then rewrite the report."""
        timeout = min(step.cap_s, self.available())
        started = time.monotonic()
        if timeout < step.need_s:
            status, note = "skipped", f"not enough time left ({max(timeout, 0):.0f} s, needs {step.need_s:.0f})"
        else:
            try:
                status, note = "ok", step.run(self, timeout)
            except StepSkipped as exc:
                status, note = "skipped", str(exc)
            except StepFailed as exc:
                status, note = "failed", str(exc)
            except Exception as exc:  # noqa: BLE001 - a broken step must not cost the others' figures
                status, note = "failed", f"{type(exc).__name__}: {exc}"
                self.log(f"{step.name} raised:\n{traceback.format_exc()}")
        wall = time.monotonic() - started
        self.report["steps"].append({"name": step.name, "status": status, "wall_s": round(wall, 1),
                                     "timeout_s": round(max(timeout, 0), 1), "note": note})
        print(f"[{self.elapsed():5.0f} s] {step.name}: {status} in {wall:.1f} s; {note}", flush=True)
        self.write()

    def python(self, args: list[str], timeout_s: float, quiet_timeout: bool = False) -> Completed:
        """Run ``python ARGS`` from the repository root; StepFailed (with the end of its errors) unless it
        succeeds, or where ``quiet_timeout``, returns a run stopped at its time limit too."""
        done = run_command([sys.executable, *args], timeout_s, ROOT)
        stamped, stderr = (deduplicated(text) for text in (done.stamped or done.stdout, done.stderr))
        self.log(f"$ python {' '.join(args)}\nexit {done.returncode} after {done.wall_s:.1f} s"
                 f"{' (stopped at its time limit)' if done.timed_out else ''}\n--- stdout\n{stamped[-4000:]}\n"
                 f"--- stderr\n{stderr[-4000:]}\n")
        if done.timed_out and quiet_timeout:
            return done
        if done.timed_out:
            raise StepFailed(f"stopped at its time limit of {timeout_s:.0f} s")
        if done.returncode != 0:
            lines = (stderr.strip() or done.stdout.strip()).splitlines()
            print("\n".join(f"    {line}" for line in lines[-12:]), flush=True)
            raise StepFailed(f"exit {done.returncode}: {lines[-1] if lines else 'no output'}")
        return done

    def log(self, text: str) -> None:
        """Append to DIR/log.txt."""
        with open(self.setup.out / "log.txt", "a", encoding="utf-8") as log:
            log.write(f"\n[{self.elapsed():.0f} s] {text}")

    def write(self) -> None:
        """Rewrite report.json and report.md from the report so far."""
        self.report["wall_s"] = round(self.elapsed(), 1)
        self.report["targets"] = [t.as_json() for t in targets(self.report)]
        _write_atomically(self.setup.out / "report.json", json.dumps(self.report, indent=1))
        _write_atomically(self.setup.out / "report.md", markdown(self.report))


def deduplicated(text: str) -> str:
    """``text`` with each line that repeats an earlier one (timestamps aside: torch's ``[W1126 23:42:24.82 ...]``
    warnings) left out, and a count of them after the first: so that the end of a failing command's output kept in
    the log is its error, not the same warning a hundred times (seen on an H100, 2026-11-26)."""
    kept: list[str] = []
    seen: dict[str, int] = {}
    for line in text.splitlines():
        key = re.sub(r"^\[\w\d+ [\d:.]+ ", "[", line)
        if key in seen:
            seen[key] += 1
            continue
        seen[key] = 0
        kept.append(key)
    repeats = sum(seen.values())
    return "\n".join(kept) + (f"\n({repeats} repeated lines left out)" if repeats else "")


def only(steps: list[Step], texts: list[str]) -> list[Step]:
    """The steps whose names hold one of ``texts``, all planned (extra ones too), after the environment and each
    calibration a chosen step's name names (``calibrate cuda`` for ``search cuda bs32``); the order kept."""
    chosen = [step for step in steps if any(text in step.name for text in texts)]
    needed = {"environment"} | {step.name for step in steps if step.name.startswith("calibrate ")
                                and any(step.name.removeprefix("calibrate ") in other.name for other in chosen)}
    return [dataclasses.replace(step, extra=False) for step in steps if step in chosen or step.name in needed]


def planned(steps: list[Step], budget_s: float) -> list[Step]:
    """The steps (not extra) that keep their least time within ``budget_s``: taken in order while their least times,
    with a stop's grace, still fit, up to the first that does not, so a short budget drops the last steps, never the
    first, and never plans a step whose search it left out (a bench or profile comes after its search)."""
    kept, used = [], STOP_GRACE_S
    for step in steps:
        if step.extra:
            continue
        if used + step.need_s > budget_s:
            break
        kept.append(step)
        used += step.need_s
    return kept


def run_command(args: list[str], timeout_s: float, cwd: Path) -> Completed:
    """Run a command in its own process group with this tree first on PYTHONPATH; at the time limit it gets Ctrl-C
    (a search then stores what it measured) and, :data:`STOP_GRACE_S` later, its whole group is killed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: dict[str, list[tuple[float, str]]] = {"stdout": [], "stderr": []}

    def read(name: str) -> None:
        for line in getattr(proc, name):
            lines[name].append((time.monotonic() - started, line))

    readers = [threading.Thread(target=read, args=(name,), daemon=True) for name in lines]
    for reader in readers:
        reader.start()
    timed_out = not _ended(proc, timeout_s)
    if timed_out:
        proc.send_signal(signal.SIGINT)
        if not _ended(proc, STOP_GRACE_S):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for reader in readers:
        reader.join(timeout=STOP_GRACE_S)  # a process the command left behind may hold its output open
    stdout, stderr = ("".join(line for _, line in lines[name]) for name in ("stdout", "stderr"))
    stamped = "".join(f"[{at:6.1f} s] {line}" for at, line in lines["stdout"])
    return Completed(proc.returncode, stdout, stderr, time.monotonic() - started, timed_out, stamped)


def _ended(proc: subprocess.Popen[str], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` (at least a second) for ``proc``; whether it ended."""
    try:
        proc.wait(timeout=max(timeout_s, 1.0))
        return True
    except subprocess.TimeoutExpired:
        return False


def environment_step(check: Check, timeout: float) -> str:
    """The device, driver and software versions."""
    out = check.setup.work / "environment.json"
    check.python([str(STEPS_SCRIPT), "env", "--device", check.setup.device, "--out", str(out)], timeout)
    env = check.report["environment"] = json.loads(out.read_text())
    gpu = env.get("gpu")
    cpu = f"{env['cpu']['model']} ({env['cpu']['cores']} cores)"
    return f"{gpu['model']}, driver {gpu['driver']}, torch {gpu['torch']}, CUDA {gpu['cuda']}; {cpu}" if gpu else cpu


def tests_step(check: Check, timeout: float) -> str:
    """The tests marked gpu, counted from their JUnit XML (a test file that fails to import on this host counts as
    an error, and the others still run)."""
    xml = check.setup.work / "gpu-tests.xml"
    files = QUICK_TEST_FILES if check.setup.quick else ("tests",)
    done = check.python(["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
                         f"--junitxml={xml}", *files], timeout, quiet_timeout=True)
    counts = check.report["tests"] = junit_counts(xml) if xml.exists() else None
    if done.timed_out or counts is None:
        stopped = ", stopped at its time limit" if done.timed_out else ""
        raise StepFailed(f"no test results (exit {done.returncode}{stopped})")
    note = ", ".join(f"{counts[k]} {k}" for k in ("tests", "failures", "errors", "skipped"))
    if done.returncode not in (0, 5):
        raise StepFailed(note)
    return note


def junit_counts(xml: Path) -> dict[str, int]:
    """Tests, failures, errors and skipped of a pytest JUnit XML file."""
    root = ElementTree.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, f"{xml} holds no test suite"
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}


def calibrate_step(check: Check, timeout: float, key: str, device: str, batches: tuple[int, ...]) -> str:
    """The fixed and per-replay cost of measuring a planned stage, per batch (``gpu_steps.py calibrate``)."""
    out = check.setup.work / f"calibration-{key.replace(' ', '-')}.json"
    sample = 4 if check.setup.quick else 24 if device == "cuda" else 12
    check.python([str(STEPS_SCRIPT), "calibrate", "--device", device, "--model", check.setup.model, "--batches",
                  ",".join(map(str, batches)), "--sample", str(sample), "--out", str(out)], timeout)
    found = check.report["calibration"][key] = json.loads(out.read_text())
    return "; ".join(f"bs{batch}: {entry['fixed_s'] * 1e3:.1f} ms per stage + {entry['per_replay_s'] * 1e3:.2f} ms "
                     "per replay" for batch, entry in found["batches"].items())


def choose_protocol(
    stages: int, fixed_s: float, per_replay_s: float, budget_s: float, warmup: int, least: int, most: int
) -> tuple[int, int]:
    """(warmup, repeat) with the most repeats in [least, most] whose estimated measuring time, with
    :data:`SAFETY`, fits ``budget_s``; ``least`` where none does."""
    for repeat in range(most, least - 1, -1):
        if stages * (fixed_s + (warmup + repeat) * per_replay_s) * SAFETY <= budget_s:
            return warmup, repeat
    return warmup, least


def search_protocol(check: Check, key: str, device: str, batch: int, measure_s: float) -> tuple[int, int]:
    """The warmup and repeat for a search, sized from the calibration under ``key`` to measure in ``measure_s``."""
    warmup, least, most = QUICK_PROTOCOL if check.setup.quick else PROTOCOL_BOUNDS[device]
    found = check.report["calibration"].get(key)
    entry = found["batches"].get(str(batch)) if found else None
    if entry is None:
        return warmup, least
    return choose_protocol(found.get("lazy_stages", found["stages"]), entry["fixed_s"], entry["per_replay_s"],
                           measure_s, warmup, least, most)


def search_step(
    check: Check, timeout: float, key: str, calibration: str, device: str, batch: int, store: Path, out: Path,
    measure_s: float, dtype: str = "float32", memory_format: str = "contiguous", model: str | None = None,
    again: bool = False,
) -> str:
    """``ios-ray search`` of ``model`` (default: the check's) on ``device`` at one batch size in ``dtype`` and
    ``memory_format``, its protocol sized by the calibration (in float32, NCHW) under key ``calibration`` to measure
    for about ``measure_s`` (less where the time limit is shorter); its figures (under ``key``, `` again`` added for
    the same search run again on its store, where the correction the first one's check fitted prices its stages)
    from the schedule file and the store."""
    model = model or check.setup.model
    if again and key not in check.report["searches"]:
        raise StepSkipped(f"the search {key} did not finish, so there is nothing to search again")
    before = _store_rows(store)
    budget = min(measure_s, timeout - SEARCH_OVERHEAD_S[device])
    warmup, repeat = search_protocol(check, calibration, device, batch, budget)
    from ios_ray.paired import least_rounds
    from ios_ray.vocabulary import DEFAULT_CHECK_ROUNDS

    rounds = least_rounds() if check.setup.quick else DEFAULT_CHECK_ROUNDS
    done = check.python(["-m", "ios_ray", "search", "--model", model, "--devices", device, "--batches",
                         str(batch), "--store", str(store), "--out", str(out), "--warmup", str(warmup), "--repeat",
                         str(repeat), "--check-rounds", str(rounds), "--dtype", dtype, "--memory-format",
                         memory_format], timeout)
    from ios_ray.schedule import schedule_path

    path = schedule_path(out, model, device, batch, dtype, memory_format)
    found = check.report["searches"][key + (" again" if again else "")] = {
        "warmup": warmup, "repeat": repeat, "wall_s": round(done.wall_s, 1),
        **search_figures(store, path, device, batch), "new_stages": _store_rows(store) - before}
    check.report["schedules"][key] = json.loads(path.read_text())
    if store == check.setup.store and store.stat().st_size <= KEEP_STORE_BYTES:
        shutil.copyfile(store, check.setup.out / "latency.duckdb")
    return (f"{found['stages']} stages ({found['uncaptured']} uncaptured) with warmup {warmup}, repeat {repeat}; "
            f"{found['kernels']} kernels{_compiled_for(found['kernel_choice_compiled_s'])}; check DP "
            f"{found['dp_ms']:.3f} ms, sequential {found['sequential_ms']:.3f} ms "
            f"in {found['rounds']} rounds; {found['decision']}")


def _compiled_for(seconds: float) -> str:
    """`` (chosen with 17.2 s of compiles)`` where the kernel choice compiled regions, else nothing."""
    return f" (chosen with {seconds:.1f} s of compiles)" if seconds else ""


def _store_rows(store: Path) -> int:
    """How many latencies a store holds (0 where there is none yet)."""
    from ios_ray.store import LatencyStore

    if not store.exists():
        return 0
    return sum(LatencyStore(store, create=False).stats()["rows"].to_pylist())


def search_figures(store: Path, schedule_path: Path, device: str, batch: int) -> dict[str, Any]:
    """What a search produced: stages in the store (and how many timed uncaptured), predictions and its check."""
    from ios_ray.schedule import read_schedule
    from ios_ray.store import LatencyStore

    rows = LatencyStore(store, create=False).query(device=device, batch=batch).column("device_info").to_pylist()
    schedule = read_schedule(schedule_path)
    check = schedule.end_to_end
    if check is None:
        raise StepFailed(f"{schedule_path.name} has no end-to-end check")
    over = check.kept_over_predicted
    return {"stages": len(rows), "uncaptured": sum("uncaptured" in json.loads(info) for info in rows),
            "kernels": schedule.kernels, "kernel_choice": schedule.params.get("kernels", {}).get("decision"),
            "kernel_choice_compiled_s": sum(turn["compiled"]["seconds"] for turn in
                                            schedule.params.get("kernels", {}).get("timed", []) if "compiled" in turn),
            "corrected": "correction" in schedule.params,
            "dp_predicted_ms": check.dp_predicted_ms, "sequential_predicted_ms": check.sequential_predicted_ms,
            "dp_ms": check.dp_ms, "sequential_ms": check.sequential_ms, "kept": check.kept,
            "rounds": check.rounds, "decision": check.decision,
            "candidates": {c.name: round(c.ms, 4) for c in check.candidates}, "left_out": list(check.left_out),
            "compiled": None if check.compiled is None else check.compiled.summary(),
            "kept_over_predicted": None if over is None else round(over, 3),
            "sequential_over_dp": _ratio(check.sequential_ms, check.dp_ms),
            "phases": schedule.params.get("search_s")}


def bench_step(
    check: Check, timeout: float, batch: int, dtype: str = "float32", memory_format: str = "contiguous",
    compiled: bool = False, model: str | None = None,
) -> str:
    """``ios-ray bench --json`` of ``model`` (default: the check's) at one batch size, without torch.compile;
    ``compiled``: with ``torch.compile(mode="reduce-overhead")`` beside the other variants (at the small batch in its
    own step, after the bench without it: compiling a large model can take minutes, and must not cost the figures of
    the run without it)."""
    setup = check.setup
    search, schedules, store = setup.search_of(batch, dtype, memory_format, model)
    if search not in check.report["searches"]:
        raise StepSkipped(f"the search {search} did not finish, so there is no schedule for it")
    compile_options = ["--compile-mode", "reduce-overhead"] if compiled else ["--no-compile"]
    done = check.python(["-m", "ios_ray", "bench", "--model", model or setup.model, "--device", setup.device,
                         "--batches", str(batch), "--schedules", str(schedules), "--store", str(store), "--rounds",
                         "2" if setup.quick else "20", "--dtype", dtype, "--memory-format", memory_format, "--json",
                         *compile_options], timeout)
    found = json.loads(done.stdout)
    check.report["bench"][setup.bench_key(batch, dtype, memory_format, model, compiled)] = {
        "rows": found["rows"], "notes": found["notes"]}
    rows = {row["name"]: row for row in found["rows"]}
    kernels = found["rows"][0].get("kernels", "eager") if found["rows"] else "eager"
    ios = variant_names(setup.device, kernels)["ios"]
    return (f"{len(rows)} variants; {ios} {rows[ios]['median_ms']:.3f} ms, "
            f"{rows[ios]['speedup_vs_sequential']:.2f}x sequential ({_span(rows[ios], 'vs_sequential')}), "
            f"{rows[ios]['speedup']:.2f}x eager ({_span(rows[ios], 'speedup')})"
            + "".join(f"; {note}" for note in found["notes"]))


def _span(row: dict[str, Any], name: str) -> str:
    """A bench row's interval of one speedup, in words."""
    low, high = row.get(f"{name}_low"), row.get(f"{name}_high")
    return "no interval" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def profile_step(check: Check, timeout: float, dtype: str = "float32", memory_format: str = "contiguous",
                 kernels: str | None = None) -> str:
    """The PyTorch profiler's tables for the DP's and the sequential schedule at the small batch, in ``dtype`` and
    ``memory_format``, with ``kernels`` (default: the search's; under the report's ``profile`` by the search's key,
    and the kernels where they are named)."""
    setup = check.setup
    small = setup.batches[0]
    key, schedules, store = setup.search_of(small, dtype, memory_format)
    if key not in check.report["searches"]:
        raise StepSkipped(f"the search {key} did not finish")
    named = f"{key} {kernels}" if kernels else key
    out = setup.work / f"profile-{named.replace(' ', '-')}.json"
    text = setup.work / f"profile-{named.replace(' ', '-')}.txt"
    check.python([str(STEPS_SCRIPT), "profile", "--device", setup.device, "--model", setup.model, "--batch",
                  str(small), "--store", str(store), "--schedules", str(schedules), "--calls",
                  "3" if setup.quick else "20", "--dtype", dtype, "--memory-format", memory_format, "--out", str(out),
                  "--text", str(text), *(["--kernels", kernels] if kernels else [])], timeout)
    found = check.report["profile"][named] = json.loads(out.read_text())
    with open(setup.out / "profile.txt", "a", encoding="utf-8") as profile_text:
        profile_text.write(text.read_text())
    return "; ".join(f"{name}: {p['median_ms']:.3f} ms, {p['kernels_per_forward']} kernels per forward, "
                     f"{p['transposes_per_forward']} layout transposes" for name, p in found.items())


def steps(setup: Setup) -> list[Step]:
    """The check's steps in order, with their time limits and the least time each is worth starting with."""
    small, large = setup.batches
    device = setup.device
    compiles = device == "cuda" and not setup.quick  # the torch.compile targets are a GPU's
    cpu_store, cpu_out = setup.work / "cpu-latency.duckdb", setup.work / "cpu-schedules"

    def search(
        batch: int, measure_s: float, dtype: str = "float32", memory_format: str = "contiguous",
        model: str | None = None, again: bool = False,
    ) -> Callable[[Check, float], str]:
        key, out, store = setup.search_of(batch, dtype, memory_format, model)
        return partial(search_step, key=key, calibration=device, device=device, batch=batch, store=store, out=out,
                       measure_s=measure_s, dtype=dtype, memory_format=memory_format, model=model, again=again)

    def bench(batch: int, dtype: str = "float32", memory_format: str = "contiguous", compiled: bool = False,
              model: str | None = None) -> Callable[[Check, float], str]:
        return partial(bench_step, batch=batch, dtype=dtype, memory_format=memory_format,
                       compiled=compiled and compiles, model=model)

    half = " ".join(HALF_NHWC)
    with_compile = f" {COMPILED}" if compiles else ""
    second = setup.second_model
    # (name, time limit, least time worth starting with, what it does), in the order of what the issues ask most:
    # the batch-1 search and its benches first (most targets; torch.compile in a step of its own after the bench
    # without it: compiling can take minutes, and a fault in it, as at batch 32 on the H100 on 2026-11-26, must not
    # cost the other variants' figures), then the GPU tests (77 s on the H200 on 2026-11-28, where before them the
    # first search was left 85 s and did not finish), float16, the searches again, batch 32. A first search needs
    # about two minutes on a fresh machine: its kernel choice compiles Inductor's regions of the sequential schedule
    # and its check each candidate's (the H200, 2026-11-28: 72 s in float16, over 120 s in float32); later steps
    # read the regions from Inductor's cache. A short --budget-s leaves out the last steps (planned), extra ones run
    # on time left over
    found = [
        Step("environment", 40, 10, environment_step),
        Step(f"calibrate {device}", 60, 15, partial(calibrate_step, key=device, device=device, batches=(small, large))),
        Step(f"search {device} bs{small}", 210, 120, search(small, 45)),
        Step(f"bench {device} bs{small}", 60, 25, bench(small)),
        *([Step(f"bench {device} bs{small} {COMPILED}", 130, 50, bench(small, compiled=True))] if compiles else []),
        Step(f"profile {device} bs{small}", 60, 30, profile_step),
        Step("GPU tests", 100, 60, tests_step),
        Step(f"search {device} bs{small} {half}", 150, 80, search(small, 40, *HALF_NHWC)),
        Step(f"bench {device} bs{small} {half}{with_compile}", 130, 45, bench(small, *HALF_NHWC, compiled=True)),
        Step(f"profile {device} bs{small} {half}", 60, 30, partial(profile_step, dtype=HALF_NHWC[0],
                                                                    memory_format=HALF_NHWC[1])),
        Step(f"search {device} bs{small} again", 90, 40, search(small, 45, again=True)),
        Step(f"search {device} bs{small} {half} again", 90, 40, search(small, 40, *HALF_NHWC, again=True)),
        Step(f"search {device} bs{large}", 160, 60, search(large, 50)),
        Step(f"bench {device} bs{large}", 60, 25, bench(large)),
        *([Step(f"bench {device} bs{large} {COMPILED}", 130, 50, bench(large, compiled=True))] if compiles else []),
        Step(f"profile {device} bs{small} inductor", 150, 40, partial(profile_step, kernels="inductor"), extra=True),
        *([Step(f"search {second} {device} bs{small}", 120, 40, search(small, 45, model=second), extra=True),
           Step(f"bench {second} {device} bs{small}{with_compile}", 130, 40,
                bench(small, compiled=True, model=second), extra=True)] if second else []),
        Step("calibrate host cpu", 30, 10, partial(calibrate_step, key="host cpu", device="cpu", batches=(1,)),
             extra=True),
        Step("search host cpu bs1", 100, 35, partial(search_step, key="host cpu bs1", calibration="host cpu",
                                                      device="cpu", batch=1, store=cpu_store, out=cpu_out,
                                                      measure_s=35), extra=True),
    ]
    if setup.quick:  # tiny repeats: every step's least time is a share of a GPU's, so that the whole pipeline runs
        found = [dataclasses.replace(step, need_s=step.need_s * QUICK_NEED_SHARE) for step in found]
    return found


def refusal(device: str, quick: bool) -> str | None:
    """Why there is nothing to check here, in one sentence, or None."""
    if device == "cpu":
        return None if quick else ("gpu_check: a run on the CPU only exercises the pipeline and validates nothing, "
                                   "so it needs --quick.")
    import torch

    if torch.cuda.is_available():
        return None
    return (f"gpu_check: torch {torch.__version__} sees no CUDA GPU on this machine, so there is nothing to validate "
            "(run it on a GPU host; `--device cpu --model squeezenet --quick` only exercises the pipeline).")


def main(argv: list[str] | None = None) -> int:
    """Check this host and write the report; the exit code says whether every step ran to its end."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for report.md, report.json and the rest")
    parser.add_argument("--work", type=Path, help="folder for stores and schedules (default: a temporary one)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--second-model", default=None, help="a second model searched and benched at the small "
                        "batch on time left over (default: randwire on a GPU, none with --quick)")
    parser.add_argument("--quick", action="store_true", help="tiny repeats, small batches, no torch.compile: "
                        "exercises the pipeline, validates nothing")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="seconds by which all is done")
    parser.add_argument("--only", action="append", metavar="TEXT", help="only the steps whose names hold TEXT (and "
                        "the environment and the calibration they need), all planned: e.g. --only bs32 on the time a "
                        "first run left (repeatable)")
    args = parser.parse_args(argv)
    problem = refusal(args.device, args.quick)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="ios-ray-gpu-check-"))
    second = args.second_model or (None if args.quick else DEFAULT_SECOND_MODEL)
    setup = Setup(args.device, args.model, args.quick, args.out, work, args.budget_s, second)
    check = Check(setup, " ".join(["bench/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]))
    print(f"gpu_check: {check.report['kind']}; report in {setup.out}, working files in {work}", flush=True)
    complete = check.run_all(only(steps(setup), args.only) if args.only else steps(setup))
    for target in check.report["targets"]:
        print(f"  {target['result']:>9}  {target['what']}: {target['figure']} (target {target['target']})")
    print(f"gpu_check: {'every step ran' if complete else 'some steps did not run to their end'}; "
          f"{check.report['wall_s']:.0f} s; report: {setup.out / 'report.md'}", flush=True)
    return 0 if complete else 1


def _ratio(numerator: float, denominator: float | None) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_atomically(path: Path, text: str) -> None:
    partial_path = path.with_name(path.name + ".tmp")
    partial_path.write_text(text, encoding="utf-8")
    os.replace(partial_path, path)


if __name__ == "__main__":
    sys.exit(main())
