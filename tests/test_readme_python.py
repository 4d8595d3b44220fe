"""The README's Python examples run as written ("From Python" and "With torch.compile"), each in a fresh folder and a
fresh process, as a reader would run them (the README's commands: tests/test_readme.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.readme import KEPT, blocks, run_python


@pytest.mark.slow
def test_the_python_example(tmp_path: Path) -> None:
    [example] = blocks("python")["## From Python"]
    ran = run_python(example, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "SearchResult('Mixed', input 32x17x17, float32):" in ran.stdout
    assert "schedules/Mixed/cpu/bs1.json\nschedules/Mixed/cpu/bs8.json" in ran.stdout
    kept = [line for line in ran.stdout.splitlines() if KEPT.match(line)]
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
