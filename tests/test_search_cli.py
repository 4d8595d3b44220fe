"""The ``ios-ray search`` command as a user runs it: bad input, Ctrl-C and resuming, and on the CPU search followed
by run, bench, evaluate and show.

Commands run inside a temporary folder, with their own store. Those about the process itself (signals, Ray
started by the command, the real entry point) run in a subprocess (``python -m ios_ray``), which starts Ray locally
as the CLI does without ``--address``; the bad-input matrix runs the same app in this process (:func:`ios_ray_here`,
on the session's Ray), which spares each case the seconds of importing torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import ray

from ios_ray.schedule import CANDIDATES, read_schedule
from ios_ray.store import LatencyStore
from ios_ray.paired import LookPlan, least_rounds
from ios_ray.vocabulary import DEFAULT_CHECK_ROUNDS, kernel_named
from tests.helpers import GIVEN_KERNELS, HANG_S, ios_ray_here, processes_holding

def ios_ray(*args: str, cwd: Path, timeout: float = HANG_S, mark: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``python -m ios_ray ARGS`` in ``cwd`` and capture its output; with a ``mark``, the command and every
    process it starts hold it in their environment (:func:`left_running`)."""
    env = {**os.environ, MARK: mark} if mark else None
    return subprocess.run(
        [sys.executable, "-m", "ios_ray", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


#: The environment variable that marks a command's processes (inherited by what it starts: Ray's, and their workers).
MARK = "IOS_RAY_TEST_MARK"


def left_running(mark: str, wait_s: float = 15.0) -> list[str]:
    """The command lines of the processes marked ``mark`` still running after up to ``wait_s`` (each is killed, so
    that a failing test leaves nothing behind)."""
    deadline = time.monotonic() + wait_s
    while (pids := processes_holding(f"{MARK}={mark}\0", "environ")) and time.monotonic() < deadline:
        time.sleep(0.2)
    lines = []
    for pid in pids:
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    return lines


def store_rows(path: Path) -> list[dict[str, object]]:
    """The store's row counts per (device, batch, dtype, source)."""
    return LatencyStore(path, create=False).stats().to_pylist()


def file_hash(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class TableRow:
    """One row of the table ``ios-ray search`` prints at the end."""

    device: str
    batch: int
    measured: int
    cached: int
    source: str
    kept: str


def search_table(stdout: str) -> list[TableRow]:
    """The rows of the search's final table (cells separated by the box character)."""
    rows = []
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 14 and cells[1].isdigit():
            measured = int(cells[6].split("/")[0])  # "measured / planned"
            rows.append(TableRow(cells[0], int(cells[1]), measured, int(cells[7]), cells[9], cells[11]))
    return rows


def wait_for_rows(child: subprocess.Popen[str], store: Path, poll_s: float, limit_s: float = HANG_S) -> None:
    """Wait until a running search has stored rows; fail if it exits first or stores none within ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not (store.exists() and store_rows(store)):
        assert child.poll() is None, child.communicate()[1]
        assert time.monotonic() < deadline, f"no rows were stored within {limit_s:.0f} s"
        time.sleep(poll_s)


def stopped_search(search: list[str], cwd: Path, store: Path, stop: Callable[[subprocess.Popen[str]], None]
                   ) -> tuple[int, str, str]:
    """Run ``ios-ray SEARCH`` in a new session, ``stop`` it once it has stored rows, and return its exit status and
    output (it is killed where it does not end within a minute)."""
    child = subprocess.Popen([sys.executable, "-m", "ios_ray", *search], cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_rows(child, store, poll_s=0.3)
        stop(child)
        stdout, stderr = child.communicate(timeout=HANG_S)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
    return child.returncode, stdout, stderr


def planned_stages(stdout: str) -> int:
    """The number of distinct candidate stages the search reported planning."""
    found = re.search(r"(\d+) distinct candidate stages", stdout)
    assert found, stdout
    return int(found.group(1))


# ---------------------------------------------------------------------------------------------------- bad input


@dataclass(frozen=True)
class FilledStore:
    """A store that already holds rows, and its bytes' hash and row counts when it was made."""

    path: Path
    digest: str
    rows: list[dict[str, object]]


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory: pytest.TempPathFactory, ray_local: None) -> FilledStore:
    """A store with the rows of a quick simulated search (squeezenet on sim:v100 at batch 1)."""
    folder = tmp_path_factory.mktemp("filled")
    path = folder / "store.duckdb"
    made = ios_ray_here("search", "--model", "squeezenet", "--devices", "sim:v100", "--batches", "1", "--warmup",
                        "0", "--repeat", "1", "--store", str(path), "--out", str(folder / "out"), cwd=folder)
    assert made.returncode == 0, made.stderr
    rows = store_rows(path)
    assert rows and rows[0]["rows"] > 0
    return FilledStore(path, file_hash(path), rows)


#: Bad input that the search must refuse before it measures anything (run in this process).
BAD_SEARCHES = {
    "unknown model": ["--model", "no_such_net", "--devices", "sim:v100"],
    "unknown model factory": ["--model", "no_such_package.nets:build", "--devices", "sim:v100"],
    "factory that raises": ["--model", "json:loads", "--devices", "sim:v100"],
    "bad input shape": ["--model", "squeezenet", "--devices", "sim:v100", "--input-shape", "3x0x9"],
    "forward fails on the input shape": ["--model", "squeezenet", "--devices", "sim:v100", "--input-shape", "3x64"],
    "unknown device": ["--model", "squeezenet", "--devices", "sim:v100,tpu9"],
    "batch 0": ["--model", "squeezenet", "--devices", "sim:v100", "--batches", "0"],
    "bad memory budget": ["--model", "squeezenet", "--devices", "sim:v100", "--memory-budget", "lots"],
    "negative batch": ["--model", "squeezenet", "--devices", "sim:v100", "--batches", "-3"],
    "batch not a number": ["--model", "squeezenet", "--devices", "sim:v100", "--batches", "x"],
    "r 0": ["--model", "squeezenet", "--devices", "sim:v100", "-r", "0"],
    "s 0": ["--model", "squeezenet", "--devices", "sim:v100", "-s", "0"],
    "repeat 0": ["--model", "squeezenet", "--devices", "sim:v100", "--repeat", "0"],
    "negative check rounds": ["--model", "squeezenet", "--devices", "cpu", "--check-rounds", "-1"],
    "out is a file": ["--model", "squeezenet", "--devices", "sim:v100", "--out", "{file}"],
    "unknown dtype": ["--model", "squeezenet", "--devices", "sim:v100", "--dtype", "int8"],
    "half precision on a sim device": ["--model", "squeezenet", "--devices", "cpu,sim:v100", "--dtype", "fp16"],
    "batch too large for this machine": ["--model", "squeezenet", "--devices", "cpu", "--batches", "2000000000"],
    "batch too large for the gpu": ["--model", "squeezenet", "--devices", "sim:v100", "--batches", "1,100000"],
}

#: Bad input met where the command joins or starts Ray and its actors (run as a user runs it, in a subprocess):
#: an address that cannot be reached, also when everything is cached, and a stage failing inside an actor (on the
#: session's Ray joined at its address: a cpu whose memory the driver cannot know, so not refused before measuring).
BAD_SEARCHES_WITH_RAY = {
    "unreachable address": ["--model", "squeezenet", "--devices", "cpu", "--address", "127.0.0.1:1"],
    "unreachable address, sim device": [
        "--model", "squeezenet", "--devices", "sim:k80", "--address", "127.0.0.1:1",
    ],
    "unreachable address, all cached": [
        "--model", "squeezenet", "--devices", "sim:v100", "--address", "127.0.0.1:1",
    ],
    "batch too large for memory": [
        "--model", "squeezenet", "--devices", "cpu", "--batches", "2000000000", "--address", "{ray}",
    ],
}


def check_fails_cleanly(args: list[str], store: FilledStore, cwd: Path, in_process: bool) -> None:
    """The search exits non-zero with one ``error:`` line, having measured nothing: it leaves the store as it was
    and writes no schedule (how fast it fails is no test's business on a shared machine; bench/ times it)."""
    a_file = cwd / "a_file"
    a_file.write_text("not a folder\n")
    args = [arg.replace("{file}", str(a_file)) for arg in args]
    if "{ray}" in args:
        args[args.index("{ray}")] = ray.get_runtime_context().gcs_address
    args += ["--store", str(store.path), *([] if "--out" in args else ["--out", str(cwd / "out")])]
    done = ios_ray_here("search", *args, cwd=cwd) if in_process else ios_ray("search", *args, cwd=cwd)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert file_hash(store.path) == store.digest
    assert store_rows(store.path) == store.rows
    assert not list(cwd.rglob("*.json"))
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.parametrize("case", list(BAD_SEARCHES))
def test_bad_search_fails_in_one_line_and_keeps_the_store(case: str, filled_store: FilledStore,
                                                          tmp_path: Path) -> None:
    check_fails_cleanly(BAD_SEARCHES[case], filled_store, tmp_path, in_process=True)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_SEARCHES_WITH_RAY))
def test_bad_search_with_ray_fails_in_one_line_and_keeps_the_store(case: str, filled_store: FilledStore,
                                                                   tmp_path: Path, ray_local: None) -> None:
    """Bad input found by these tests once (an address checked only when measuring, a stage failing inside an
    actor): one clear line, the store untouched."""
    check_fails_cleanly(BAD_SEARCHES_WITH_RAY[case], filled_store, tmp_path, in_process=False)


def test_a_search_over_its_memory_budget_says_the_smallest_peak_and_one_within_it_records_its_peak(
        filled_store: FilledStore, tmp_path: Path) -> None:
    args = ["search", "--model", "squeezenet", "--devices", "sim:v100", "--store", str(filled_store.path),
            "--out", str(tmp_path / "out")]
    done = ios_ray_here(*args, "--memory-budget", "1000", cwd=tmp_path)
    assert done.returncode == 1
    assert re.fullmatch(r"error: no schedule of squeezenet at batch 1 peaks within 0\.0 MB: the smallest peak any "
                        r"schedule reaches is [\d.,]+ MB[^\n]*\.\n", done.stderr), done.stderr
    done = ios_ray_here(*args, "--memory-budget", "1.0x", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    schedule = read_schedule(tmp_path / "out" / "squeezenet" / "sim-v100" / "bs1.json")
    assert schedule.memory is not None and schedule.memory.budget_bytes == schedule.memory.sequential_peak_bytes
    assert schedule.memory.peak_bytes <= schedule.memory.sequential_peak_bytes
    shown = ios_ray_here("show", str(tmp_path / "out" / "squeezenet" / "sim-v100" / "bs1.json"), cwd=tmp_path)
    assert f"memory: peak {schedule.memory.peak_bytes / 1e6:,.1f} MB" in shown.stdout


def test_every_command_prints_its_help(tmp_path: Path) -> None:
    from ios_ray.app.cli import app

    commands = [command.name or command.callback.__name__ for command in app.registered_commands]
    assert "search" in commands and "run" in commands
    for command in [None, *commands]:
        args = [command, "--help"] if command else ["--help"]
        result = ios_ray_here(*args, cwd=tmp_path)
        assert result.returncode == 0 and "Usage: ios-ray" in result.stdout, (command, result.stderr)


def test_debug_shows_the_traceback_behind_the_sentence(tmp_path: Path) -> None:
    plain = ios_ray_here("search", "--model", "json:loads", "--devices", "sim:v100", cwd=tmp_path)
    debug = ios_ray_here("--debug", "search", "--model", "json:loads", "--devices", "sim:v100", cwd=tmp_path)
    again = ios_ray_here("search", "--model", "json:loads", "--devices", "sim:v100", cwd=tmp_path)
    assert again.stderr == plain.stderr  # --debug lasts one command
    sentence = "error: building model 'json:loads' failed: TypeError: loads() missing 1 required positional argument"
    assert plain.returncode == debug.returncode == 1
    assert plain.stderr.startswith(sentence) and "Traceback" not in plain.stderr
    assert "Traceback (most recent call last)" in debug.stderr and sentence in debug.stderr


def test_device_labels_are_case_insensitive(filled_store: FilledStore, tmp_path: Path) -> None:
    store = tmp_path / "store.duckdb"
    store.write_bytes(filled_store.path.read_bytes())
    done = ios_ray_here("search", "--model", "squeezenet", "--devices", "SIM:V100", "--batches", "1", "--store",
                        str(store), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    total = planned_stages(done.stdout)
    assert search_table(done.stdout) == [TableRow("sim:v100", 1, 0, total, "simulated", "IOS")]
    assert (tmp_path / "out" / "squeezenet" / "sim-v100" / "bs1.json").is_file()


@pytest.mark.parametrize("where", ["a_folder", "a_folder.png"])
def test_show_plot_into_a_folder_fails_in_one_line(filled_store: FilledStore, tmp_path: Path, where: str) -> None:
    [schedule] = filled_store.path.parent.glob("out/squeezenet/sim-v100/bs1.json")
    (tmp_path / where).mkdir()
    done = ios_ray_here("show", str(schedule), "--plot", str(tmp_path / where), "--store", str(filled_store.path),
                        cwd=tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr


def test_show_draws_the_timeline_beside_the_sequential_schedule(filled_store: FilledStore, tmp_path: Path) -> None:
    [schedule] = filled_store.path.parent.glob("out/squeezenet/sim-v100/bs1.json")
    pictures = [tmp_path / "pictures" / "s.png", tmp_path / "s.svg"]
    done = ios_ray_here("show", str(schedule), "--plot", str(pictures[0]), "--plot", str(pictures[1]), "--store",
                        str(filled_store.path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"picture written to {pictures[0]}, {pictures[1]}" in done.stdout
    assert pictures[0].read_bytes().startswith(b"\x89PNG")
    assert "sequential: 37 units" in pictures[1].read_text()  # the store held every unit alone


def test_the_trade_off_is_the_searchs_solver_over_the_store(filled_store: FilledStore) -> None:
    """``ios-ray evaluate``'s trade-off solves the stored latencies as the search does: without a budget it is the
    schedule the search kept (simulated: the DP's), and each budget keeps its peak."""
    from ios_ray.app.cli.util import store_lookup
    from ios_ray.app.search.solver import stored_trade_off
    from ios_ray.frontend import import_model
    from ios_ray.stage import StageKeys

    [path] = filled_store.path.parent.glob("out/squeezenet/sim-v100/bs1.json")
    schedule, graph = read_schedule(path), import_model("squeezenet").graph
    lookup = store_lookup(filled_store.path)
    assert lookup is not None and schedule.memory is not None and schedule.predicted_latency is not None
    found = stored_trade_off(schedule, graph, StageKeys(graph), lookup)
    assert found is not None
    rows, sequential_ms = found
    assert rows[-1].budget == "none" and rows[-1].latency_ms == pytest.approx(schedule.predicted_latency)
    assert sequential_ms >= schedule.predicted_latency
    for row, factor in zip(rows, (1.0, 1.1, 1.25, 1.5)):
        assert row.peak_bytes is not None and row.peak_bytes <= factor * schedule.memory.sequential_peak_bytes


#: Searching v100 on a machine whose Ray would offer no V100, with Ray's start and the model's building made to fail
#: the test, as the CLI runs it.
NO_V100_HERE = """
import sys
import ray
import ios_ray.app.search.job as job

def never(*args, **kwargs):
    raise AssertionError("the search went past the device check")

ray.init = never
job.load_model = never
from ios_ray.cli import app
app(sys.argv[1:], prog_name="ios-ray")
"""


def test_a_device_no_node_offers_fails_before_ray_starts_or_the_model_imports(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", NO_V100_HERE, "search", "--devices", "v100", "--batches", "1",
                           "--model", "squeezenet"], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("cluster: this machine's local Ray (no address given): 1 node")
    [line] = done.stderr.splitlines()
    assert line.startswith("error: no node offers device 'v100': this machine's local Ray (no address given) offers "
                           "cpu") and "search sim:v100 to simulate it" in line and "--address" in line


@pytest.mark.slow
def test_a_sim_schedule_runs_on_the_cpu_when_asked_as_a_correctness_check_without_latency(
    filled_store: FilledStore, tmp_path: Path
) -> None:
    out = filled_store.path.parent / "out"
    refused = ios_ray_here("run", "--model", "squeezenet", "--schedules", str(out), "--repeat", "1", cwd=tmp_path)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error: no schedule under") and "pass --any-device" in refused.stderr
    checked = ios_ray_here("run", "--model", "squeezenet", "--schedules", str(out), "--repeat", "1", "--any-device",
                           cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "schedule: sim:v100 batch 1 float32" in checked.stdout
    assert "planned for sim:v100, run on cpu as a correctness check only (its speed" in checked.stdout
    assert re.search(r"output vs eager: max relative error \S+ \(ok, ", checked.stdout), checked.stdout
    assert "latency at batch" not in checked.stdout and "predicted" not in checked.stdout
    assert checked.stderr == ""


def test_run_holds_a_schedule_to_the_models_own_float32_error(tmp_path: Path) -> None:
    """A correct schedule of a model whose float32 output keeps few digits strays from eager by about as much as
    eager float32 strays from float64 (2e-4 here, 1e-5 was the fixed tolerance before)."""
    from ios_ray.frontend import import_model
    from ios_ray.schedule import BlockSchedule, Schedule, save_schedule
    from ios_ray.scheduler import sequential_stages

    spec = "tests.user_models:cancelling"
    graph = import_model(spec).graph
    blocks = tuple(BlockSchedule(b.index, sequential_stages(graph, b)) for b in graph.blocks)
    save_schedule(Schedule(spec, graph.fingerprint, "cpu", 1, blocks, input_shape=graph.input_shape),
                  tmp_path / "bs1.json")
    ran = ios_ray_here("run", "--model", spec, "--schedules", str(tmp_path / "bs1.json"), "--repeat", "1",
                       cwd=tmp_path)
    found = re.search(r"max relative error (\S+) \(ok, tolerance (\S+): 10x eager float32's own error against float64 "
                      r"\((\S+)\), at least 1e-05\)", ran.stdout)
    assert ran.returncode == 0 and found, ran.stdout + ran.stderr
    error, limit, own = map(float, found.groups())
    assert error > 1e-5 and own > 1e-5 and limit == pytest.approx(10 * own, rel=0.01)


# --------------------------------------------------------------------------------------------- Ctrl-C and resume


#: A command stopped by Ctrl-C, run as a process's command line, with an exit handler that would say it ran.
CTRL_C_COMMAND = """
import atexit, sys
import ios_ray.cli
from ios_ray.app.cli.util import CommandLine, user_errors

assert isinstance(ios_ray.cli.app, CommandLine)
atexit.register(lambda: print("finalized", flush=True))
app = CommandLine()

@app.command()
@user_errors
def stop() -> None:
    print("stopping", flush=True)
    raise KeyboardInterrupt

app([])
"""


def test_after_ctrl_c_the_command_line_ends_the_process_at_once() -> None:
    """The interpreter's normal exit raced the threads Ray leaves winding down (exit -11 now and then,
    bench/ctrl_c.py): once its message is out, an interrupted command ends the process with os._exit, running no
    exit handler. A command that stores nothing says no more than that it was interrupted (``ios-ray bench`` said
    that everything measured was stored and could be resumed)."""
    ran = subprocess.run([sys.executable, "-c", CTRL_C_COMMAND], capture_output=True, text=True, timeout=HANG_S)
    assert ran.returncode == 130, ran.stderr
    assert ran.stdout == "stopping\n"  # flushed, and no exit handler ran
    assert ran.stderr == "interrupted.\n"


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_measured_and_a_rerun_resumes(tmp_path: Path, ray_local: None) -> None:
    store, out = tmp_path / "store.duckdb", tmp_path / "out"
    search = ["search", "--model", "inception_v3", "--devices", "sim:k80", "--batches", "1", "--measure", "all",
              "--store", str(store), "--out", str(out)]
    # A new session, as a terminal's foreground job: Ctrl-C reaches the CLI and the Ray processes it started.
    returncode, stdout, stderr = stopped_search([*search, "--sim-actors", "1"], tmp_path, store,
                                                lambda child: os.killpg(child.pid, signal.SIGINT))
    assert returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and "interrupted" in lines[0] and "stored" in lines[0], stderr
    total = planned_stages(stdout)
    [kept] = store_rows(store)
    assert (kept["device"], kept["batch"], kept["source"]) == ("sim:k80", 1, "simulated")
    assert 0 < kept["rows"] < total
    assert not list(out.rglob("*.json"))

    # warmup and repeat are not part of the store key: the rerun (in this process) finds the stored stages and
    # measures the rest.
    rerun = ios_ray_here(*search, "--warmup", "0", "--repeat", "1", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert planned_stages(rerun.stdout) == total
    assert search_table(rerun.stdout) == [
        TableRow("sim:k80", 1, total - kept["rows"], kept["rows"], "simulated", "IOS")]
    [after] = store_rows(store)
    assert after["rows"] == total
    assert (out / "inception_v3" / "sim-k80" / "bs1.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("to_group", [False, True], ids=["the process", "its process group"])
def test_sigterm_stops_a_search_as_ctrl_c_does(tmp_path: Path, to_group: bool) -> None:
    """Issue 46, item 9: Ray's driver exits on SIGTERM through sys.exit, which unwound the search halfway and then
    aborted (exit -6, Ray's stack dump, a traceback); ``kill``, ``timeout`` and a stopping container send it."""
    store = tmp_path / "store.duckdb"
    search = ["search", "--model", "inception_v3", "--devices", "sim:k80", "--batches", "1", "--measure", "all",
              "--store", str(store), "--out", str(tmp_path / "out"), "--sim-actors", "1"]
    returncode, stdout, stderr = stopped_search(search, tmp_path, store, lambda child: os.killpg(
        child.pid, signal.SIGTERM) if to_group else child.send_signal(signal.SIGTERM))
    assert returncode == 143, stderr
    assert stderr == "terminated: everything measured so far is stored; rerun to resume.\n"
    [kept] = store_rows(store)
    assert 0 < kept["rows"] < planned_stages(stdout)


@pytest.mark.slow
def test_sigkill_during_a_lazy_search_loses_nothing_and_a_rerun_ends_on_the_same_schedule(
    tmp_path: Path, ray_local: None
) -> None:
    def search(name: str) -> list[str]:
        return ["search", "--model", "tests.user_models:wide", "--devices", "sim:k80", "--batches", "1",
                "--measure", "lazy", "--store", str(tmp_path / f"{name}.duckdb"), "--out", str(tmp_path / name)]

    root = Path(__file__).resolve().parent.parent
    reference = ios_ray_here(*search("whole"), cwd=root)  # in this process; only the killed search is a child
    assert reference.returncode == 0, reference.stderr
    store = tmp_path / "killed.duckdb"
    child = subprocess.Popen([sys.executable, "-m", "ios_ray", *search("killed"), "--sim-actors", "1"], cwd=root,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_rows(child, store, poll_s=0.1)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
    [kept] = store_rows(store)
    rerun = ios_ray_here(*search("killed"), cwd=root)
    assert rerun.returncode == 0, rerun.stderr
    [whole], [resumed] = search_table(reference.stdout), search_table(rerun.stdout)
    assert resumed.cached >= kept["rows"] > 0 and resumed.measured < whole.measured
    [after] = store_rows(store)
    assert after["rows"] == resumed.cached + resumed.measured
    first = read_schedule(tmp_path / "whole" / "tests.user_models-wide" / "sim-k80" / "bs1.json")
    again = read_schedule(tmp_path / "killed" / "tests.user_models-wide" / "sim-k80" / "bs1.json")
    assert again.stages == first.stages and again.predicted_latency == first.predicted_latency
    assert again.params["measure"]["mode"] == "lazy" and again.params["measure"]["certified"] is True


# ----------------------------------------------------------------------------------- real CPU: search, run, show


@pytest.mark.slow
def test_cpu_search_then_run_bench_evaluate_and_show(tmp_path: Path, ray_local: None) -> None:
    # At another input shape than the model's own (3x224x224), which every command must be told: the graph, and so
    # its schedules, depend on it. The search runs as a user runs it (a process that starts Ray); the commands after
    # it run in this process, on the session's Ray.
    store, out, shape = tmp_path / "S.duckdb", tmp_path / "O", ("--input-shape", "3x96x96")
    searched = ios_ray("search", "--model", "squeezenet", "--devices", "cpu", "--batches", "1", "--store", str(store),
                       "--out", str(out), *shape, *GIVEN_KERNELS, cwd=tmp_path, mark=str(tmp_path))
    assert searched.returncode == 0, searched.stderr
    assert left_running(str(tmp_path)) == []  # the command ends at once, with the local Ray it started shut down
    total = planned_stages(searched.stdout)
    [row] = search_table(searched.stdout)
    assert row == TableRow("cpu", 1, row.measured, 0, "measured", row.kept) and 0 < row.measured <= total
    assert store_rows(store) == [{"device": "cpu", "batch": 1, "dtype": "float32", "source": "measured",
                                  "rows": row.measured}]
    schedule = out / "squeezenet" / "cpu" / "bs1.json"
    assert schedule.is_file()
    # The end-to-end check timed the candidates whole in rounds, and the file keeps one other than sequential only
    # where the interval of it over sequential lies wholly below 1; the table says so in the same words.
    check = read_schedule(schedule).end_to_end
    assert check is not None and check.ratio is not None and check.dp_ms > 0 and check.sequential_ms > 0
    deciding = check.deciding
    assert check.rounds in LookPlan.planned(DEFAULT_CHECK_ROUNDS).looks and deciding.rounds == check.rounds
    assert (check.kept != "sequential") == (deciding.high is not None and deciding.high < 1)
    assert {c.name for c in check.candidates} >= {"dp", "sequential"} and check.kept in CANDIDATES
    assert row.kept == f"{CANDIDATES[check.kept]}: {check.reason}"
    assert f"cpu batch 1: {check.decision}; " in searched.stdout  # the setting's line, as it was decided
    assert f"ratio {deciding.median:.3f} in {check.rounds} rounds" in searched.stdout
    assert check.sequential_predicted_ms is not None and check.dp_predicted_ms is not None
    assert check.dp_predicted_ms <= check.sequential_predicted_ms * (1 + 1e-9)  # the DP never predicts worse
    if check.kept == "sequential":
        assert all(len(stage.units) == 1 for stage in read_schedule(schedule).stages)

    ran = ios_ray_here("run", "--model", "squeezenet", "--schedules", str(out), "--batch", "1", "--repeat", "5",
                       *shape, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "schedule: cpu batch 1" in ran.stdout
    assert f"search's end-to-end check: IOS schedule {check.dp_ms:.3f} ms" in ran.stdout
    assert re.search(r"output vs eager: max relative error \S+ \(ok, tolerance \S+: 10x eager float32's own error "
                     r"against float64 \(\S+\), at least 1e-05\)", ran.stdout), ran.stdout

    benched = ios_ray_here("bench", "--model", "squeezenet", "--schedules", str(out), "--store", str(store),
                           "--rounds", "2", "--no-compile", "--json", *shape, cwd=tmp_path)
    assert benched.returncode == 0, benched.stderr
    report = json.loads(benched.stdout)
    # rows are named by the kernels the search chose (``IOS fused``); renamed here to the schedules they run
    kernels = read_schedule(schedule).kernels
    rows = {row["name"].removesuffix(f" {kernels}"): row for row in report["rows"]}
    assert {row["name"] for row in report["rows"]} == {"eager", *(kernel_named(n, kernels) for n in (
        "sequential", "greedy", "IOS"))}
    assert set(rows) == {"eager", "sequential", "greedy", "IOS"}
    assert report["notes"] == ["torch.compile skipped (--no-compile)"]
    assert rows["eager"]["predicted_ms"] is None and rows["eager"]["speedup"] == 1.0
    assert rows["sequential"]["speedup_vs_sequential"] == 1.0
    assert rows["sequential"]["baseline"] == kernel_named("sequential", kernels)
    # a speedup is the median of the per-round ratios, with its interval, from the samples each row carries
    ratios = [s / i for s, i in zip(rows["sequential"]["samples_ms"], rows["IOS"]["samples_ms"])]
    assert rows["IOS"]["speedup_vs_sequential"] == pytest.approx(statistics.median(ratios))
    assert len(ratios) == 2 and rows["IOS"]["vs_sequential_low"] is None  # two rounds give no 95% interval
    for row in rows.values():
        assert (row["model"], row["device"], row["batch"], row["schedule_batch"]) == ("squeezenet", "cpu", 1, 1)
        assert 0 < row["p10_ms"] <= row["median_ms"] <= row["p90_ms"] and row["error"] <= 1e-5
    # The IOS prediction is the schedule's own: the sum of its stages' latencies in the store.
    assert rows["IOS"]["predicted_ms"] == pytest.approx(read_schedule(schedule).predicted_latency, rel=1e-9)
    assert rows["sequential"]["predicted_ms"] > 0 and rows["greedy"]["predicted_ms"] > 0

    table = ios_ray_here("bench", "--model", "squeezenet", "--schedules", str(out), "--store", str(store),
                         "--rounds", "1", "--no-compile", *shape, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "squeezenet on cpu, batch 1" in table.stdout and "torch.compile skipped" in table.stdout
    assert "vs sequential" in table.stdout
    # At the model's own shape it is another graph, for which the folder has no schedule: one sentence.
    other = ios_ray_here("bench", "--model", "squeezenet", "--schedules", str(out), "--no-compile", cwd=tmp_path)
    assert other.returncode == 1 and other.stderr.startswith("error: no float32 schedule of squeezenet"), other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
    assert "(those there were made for inputs of shape 3x96x96, and this one is imported at 3x224x224: pass the " \
           "shape it was searched at, --input-shape" in other.stderr  # what differs, and what to do

    evaluated = ios_ray_here("evaluate", "--schedules", str(out), "--store", str(store), "--rounds", "2", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "cells are measured" in evaluated.stdout

    simulated = ios_ray_here("bench", "--model", "squeezenet", "--device", "sim:v100", "--schedules", str(out),
                             cwd=tmp_path)
    assert simulated.returncode == 1 and "Traceback" not in simulated.stderr
    assert simulated.stderr.strip().splitlines() == [
        "error: 'sim:v100' is simulated and bench measures on this machine; compare simulated schedules by "
        "prediction with `ios-ray evaluate --schedules DIR`."]

    picture = tmp_path / "pic.svg"
    shown = ios_ray_here("show", str(schedule), "--plot", str(picture), "--store", str(store), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "block 0" in shown.stdout
    assert f"end-to-end check: {check.summary()}" in shown.stdout
    root = ElementTree.parse(picture).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = {"".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert "thread 0" in texts and any(text.startswith("sequential: 37 units") for text in texts), texts



@pytest.mark.slow
def test_a_bfloat16_search_then_run_bench_evaluate_and_store_stats(tmp_path: Path, ray_local: None) -> None:
    """``--dtype``: stages measured in it and stored under it, a schedule file of its own beside float32's, and the
    commands after the search run the model in it."""
    store, out, shape = tmp_path / "S.duckdb", tmp_path / "O", ("--input-shape", "3x64x64")
    searched = ios_ray_here("search", "--model", "squeezenet", "--devices", "cpu", "--batches", "2", "--store",
                            str(store), "--out", str(out), "--dtype", "bf16", "--measure", "all",
                            "--check-rounds", str(least_rounds()), *shape, *GIVEN_KERNELS, cwd=tmp_path)
    assert searched.returncode == 0, searched.stderr
    assert "ios-ray search: squeezenet in bfloat16" in searched.stdout
    total = planned_stages(searched.stdout)
    assert store_rows(store) == [
        {"device": "cpu", "batch": 2, "dtype": "bfloat16", "source": "measured", "rows": total}]
    assert [p.name for p in (out / "squeezenet" / "cpu").iterdir()] == ["bs2-bfloat16.json"]
    assert read_schedule(out / "squeezenet" / "cpu" / "bs2-bfloat16.json").dtype == "bfloat16"

    ran = ios_ray_here("run", "--model", "squeezenet", "--schedules", str(out), "--batch", "2", "--repeat", "2",
                       "--dtype", "bfloat16", *shape, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "schedule: cpu batch 2 bfloat16" in ran.stdout
    assert re.search(r"max relative error \S+ \(ok, tolerance \S+: 10x eager bfloat16's own error against float64 "
                     r"\(\S+\), at least 3e-02\)", ran.stdout), ran.stdout

    benched = ios_ray_here("bench", "--model", "squeezenet", "--schedules", str(out), "--store", str(store),
                           "--batches", "2", "--rounds", "1", "--no-compile", "--json", "--dtype", "bfloat16", *shape,
                           cwd=tmp_path)
    assert benched.returncode == 0, benched.stderr
    kernels = read_schedule(out / "squeezenet" / "cpu" / "bs2-bfloat16.json").kernels
    rows = {row["name"]: row for row in json.loads(benched.stdout)["rows"]}
    assert rows[kernel_named("IOS", kernels)]["predicted_ms"] == pytest.approx(
        read_schedule(out / "squeezenet" / "cpu" / "bs2-bfloat16.json").predicted_latency, rel=1e-9)
    assert all(row["error"] <= 3e-2 for row in rows.values())
    in_float32 = ios_ray_here("bench", "--model", "squeezenet", "--schedules", str(out), "--batches", "2",
                              "--no-compile", *shape, cwd=tmp_path)
    assert in_float32.returncode == 1 and in_float32.stderr.startswith(
        "error: no float32 schedule of squeezenet for device 'cpu'"), in_float32.stderr

    evaluated = ios_ray_here("evaluate", "--schedules", str(out), "--store", str(store), "--rounds", "1", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "squeezenet, bfloat16: latency" in evaluated.stdout
    stats = ios_ray_here("store", "stats", "--store", str(store), cwd=tmp_path)
    assert stats.returncode == 0 and "bfloat16" in stats.stdout
