"""The wheel holds the library only (tests and benchmarks run from the source tree), and the dependencies are the
tested ones: torch, Ray and DuckDB within the ranges the suite passes on, plotting and test tools extras."""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import HANG_S

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_the_library_and_nothing_else(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy, so that the build writes nothing into the working tree
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__",
                                                                "ios_store", "schedules", ".*"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(source)], capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("ios_ray-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("ios_ray-")}
    assert packages == {"ios_ray"}
    assert "ios_ray/app/search/api.py" in names and "ios_ray/scheduler/dp.py" in names and "ios_ray/zoo/randwire.py" in names
    assert not [name for name in names if "/tests/" in name or "/bench/" in name or name.startswith(("tests/", "bench/"))]
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "ios-ray = ios_ray.cli:app" in zipfile.ZipFile(wheel).read(entry_points).decode()


def project() -> dict:
    """pyproject.toml's [project] table."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_torch_ray_and_duckdb_are_pinned_to_ranges_the_installed_versions_fall_in() -> None:
    from importlib.metadata import version

    from packaging.requirements import Requirement

    required = {Requirement(line).name: Requirement(line) for line in project()["dependencies"]}
    for name in ("torch", "ray", "duckdb"):
        specifier = required[name].specifier
        assert {s.operator for s in specifier} == {">=", "<"}, f"{name} needs a lower and an upper bound"
        assert specifier.contains(version(name), prereleases=True), f"{name} {version(name)} is not in {specifier}"


def test_plotting_and_test_tools_are_no_runtime_dependencies() -> None:
    from packaging.requirements import Requirement

    names = {Requirement(line).name for line in project()["dependencies"]}
    extras = project()["optional-dependencies"]
    assert not names & {"pyyaml", "matplotlib", "pytest", "hypothesis", "jsonschema"}
    assert {Requirement(line).name for line in extras["plot"]} == {"matplotlib"}
    assert {"pyyaml", "matplotlib"} <= {Requirement(line).name for line in extras["dev"]}
    imports = {}
    for path in (ROOT / "ios_ray").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]:
                    imports.setdefault(name.split(".")[0], set()).add(path.relative_to(ROOT).as_posix())
    assert "yaml" not in imports
    assert imports["matplotlib"] == {"ios_ray/app/cli/plot.py"}


def test_the_public_api_is_listed_once_with_its_stability_and_every_name_loads() -> None:
    import ios_ray

    assert set(ios_ray.__all__) == {*ios_ray.API, "API"}
    for name, (module, stability) in ios_ray.API.items():
        assert stability in ("stable", "provisional"), name
        assert getattr(ios_ray, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'Solver'"):
        ios_ray.Solver  # noqa: B018 - internal names are not the API
