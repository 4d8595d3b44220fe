"""The README's examples run as written: the shell commands of the Quick start and of "Commands", in a fresh folder
and a fresh process, as a reader would run them (its Python blocks: tests/test_readme_python.py, a file of its own so
that the two run side by side, on two workers).

They search for real (on this machine's CPU, or simulated), so they are slow tests. Each block's prerequisites are
the README's own: the ``ScheduledModule`` example runs after the Quick start's search, in the same folder. A Python
block no test runs fails :func:`test_every_python_block_of_the_readme_is_run`, so a new example comes with its run.
The two-node cluster recipe runs in ``tests/test_cluster_recipe.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.readme import KEPT, RUN, blocks, run_python, run_shell


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
    assert any(KEPT.match(line) and line.startswith("cpu batch 1:") for line in lines), done.stdout
    assert (tmp_path / "schedules" / "squeezenet" / "cpu" / "bs1.json").is_file()

    [example] = blocks("python")["## Deploying: `ScheduledModule`"]
    ran = run_python(example, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["cpu 1"]
    assert (tmp_path / "deploy" / "scheduled_module.json").is_file()


@pytest.mark.slow
def test_the_commands_example(tmp_path: Path) -> None:
    [commands] = blocks("bash")["## Commands"]
    for line in commands.splitlines():
        done = run_shell(line, tmp_path)
        assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    assert (tmp_path / "schedules" / "squeezenet" / "sim-v100" / "bs1.json").is_file()
    assert (tmp_path / "squeezenet.png").read_bytes().startswith(b"\x89PNG")
