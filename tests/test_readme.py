"""The README's examples run as written: each Python block, and the shell commands of the Quick start and of
"Commands", in a fresh folder and a fresh process, as a reader would run them.

They search for real (on this machine's CPU, or simulated), so they are slow tests. Each block's prerequisites are
the README's own: the ``ScheduledModule`` example runs after the Quick start's search, in the same folder. A Python
block no test runs fails :func:`test_every_python_block_of_the_readme_is_run`, so a new example comes with its run.
The two-node cluster recipe runs in ``tests/test_cluster_recipe.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import HANG_S

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
#: The sections whose Python block a test below runs.
RUN = ("## From Python", "## With torch.compile", "## Deploying: `ScheduledModule`")


def blocks(language: str) -> dict[str, list[str]]:
    """The README's code blocks of a language, by the section (``## ...`` heading) they stand in."""
    found: dict[str, list[str]] = {}
    section = ""
    for part in re.split(r"(^## .*$)", README, flags=re.M):
        if part.startswith("## "):
            section = part.strip()
            continue
        found.setdefault(section, []).extend(re.findall(rf"^```{language}\n(.*?)^```$", part, flags=re.S | re.M))
    return {section: code for section, code in found.items() if code}


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A Python block as ``python example.py`` in ``cwd``, with this checkout importable."""
    (cwd / "example.py").write_text(code)
    return subprocess.run([sys.executable, "example.py"], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=HANG_S)


def run_shell(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """One README command (``ios-ray ...`` run by this Python)."""
    argv = shlex.split(line)
    if argv[0] == "ios-ray":
        argv = [sys.executable, "-m", "ios_ray", *argv[1:]]
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=HANG_S)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def test_every_python_block_of_the_readme_is_run() -> None:
    assert sorted(blocks("python")) == sorted(RUN)
    assert all(len(blocks("python")[section]) == 1 for section in RUN)


@pytest.mark.slow
def test_the_quick_start_search_then_the_scheduled_module_example(tmp_path: Path) -> None:
    [quick_start] = blocks("bash")["## Quick start"]
    setup, search = quick_start.splitlines()[0].split(" && ")
    assert setup == "bash scripts/setup.sh"  # done already: this test runs in the environment it made
    done = run_shell(search, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cluster: this machine's local Ray (no address given): 1 node")
    assert any(re.match(r"cpu batch 1: kept (IOS|sequential): ", line) for line in lines), done.stdout
    assert (tmp_path / "schedules" / "squeezenet" / "cpu" / "bs1.json").is_file()

    [example] = blocks("python")["## Deploying: `ScheduledModule`"]
    ran = run_python(example, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["cpu 1"]
    assert (tmp_path / "deploy" / "scheduled_module.json").is_file()


@pytest.mark.slow
def test_the_python_example(tmp_path: Path) -> None:
    [example] = blocks("python")["## From Python"]
    ran = run_python(example, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "SearchResult('Mixed', input 32x17x17, float32):" in ran.stdout
    assert "schedules/Mixed/cpu/bs1.json\nschedules/Mixed/cpu/bs8.json" in ran.stdout
    kept = [line for line in ran.stdout.splitlines() if re.match(r"cpu batch \d: kept (IOS|sequential): ", line)]
    assert [line.split(":")[0] for line in kept] == ["cpu batch 1", "cpu batch 8", "cpu batch 8"]  # optimize too


@pytest.mark.slow
def test_the_torch_compile_example(tmp_path: Path) -> None:
    [example] = blocks("python")["## With torch.compile"]
    ran = run_python(example, tmp_path)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    said = [line for line in lines if line.startswith("ios_ray: ")]
    assert len(said) == 4 and all(" batch 8 float32 on cpu runs the schedule of " in line for line in said), said
    graphs = [line.split(" ", 1) for line in lines if re.match(r"Net\.forward(@17)? \{", line)]
    assert [graph for graph, _ in graphs] == ["Net.forward", "Net.forward@17"]
    for _, runs in graphs:  # the later compile looked each graph's schedule up in its file, once
        assert re.fullmatch(r"\{'schedules/Net\.forward(@17)?\.[0-9a-f]{12}/cpu/bs8\.json': 1\}", runs), runs


@pytest.mark.slow
def test_the_commands_example(tmp_path: Path) -> None:
    [commands] = blocks("bash")["## Commands"]
    for line in commands.splitlines():
        done = run_shell(line, tmp_path)
        assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    assert (tmp_path / "schedules" / "squeezenet" / "sim-v100" / "bs1.json").is_file()
    assert (tmp_path / "squeezenet.png").read_bytes().startswith(b"\x89PNG")
