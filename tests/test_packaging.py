"""The wheel holds the library only: tests and benchmarks run from the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_the_library_and_nothing_else(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy, so that the build writes nothing into the working tree
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__",
                                                                "ios_store", "schedules", ".*"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(source)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("ios_ray-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("ios_ray-")}
    assert packages == {"ios_ray"}
    assert "ios_ray/app/api.py" in names and "ios_ray/scheduler/dp.py" in names and "ios_ray/zoo/randwire.py" in names
    assert not [name for name in names if "/tests/" in name or "/bench/" in name or name.startswith(("tests/", "bench/"))]
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "ios-ray = ios_ray.cli:app" in zipfile.ZipFile(wheel).read(entry_points).decode()
